// An application that registered a backend of its own under "ReferenceBackend" before calling
// kvd_register_backends(): ExecuTorch refuses our id. Prints "CODE COUNT MESSAGE" for tests/cpp_example.rs.

#include <kv_delegate.h>

#include <cstdio>

#include <executorch/runtime/backend/interface.h>

namespace rt = executorch::runtime;

namespace {

// A backend that is not ours and runs nothing.
class NotOurs final : public rt::BackendInterface {
 public:
  bool is_available() const override { return true; }
  rt::Result<rt::DelegateHandle*> init(rt::BackendInitContext&, rt::FreeableBuffer*,
                                       rt::ArrayRef<rt::CompileSpec>) const override {
    return rt::Error::NotSupported;
  }
  rt::Error execute(rt::BackendExecutionContext&, rt::DelegateHandle*, rt::Span<rt::EValue*>) const override {
    return rt::Error::NotSupported;
  }
};

NotOurs not_ours;

}  // namespace

int main() {
  if (rt::register_backend({"ReferenceBackend", &not_ours}) != rt::Error::Ok) {
    std::fprintf(stderr, "the application could not register its own backend\n");
    return 3;
  }
  kvd_error code = kvd_register_backends();
  char message[1024] = {0};
  kvd_last_error(message, sizeof message);
  std::printf("%u %zu %s\n", static_cast<unsigned>(code), kvd_backend_count(), message);
  return 0;
}
