// The C++ half of executorch-bridge: the smallest shim between ExecuTorch 1.5.1's C++ runtime and Rust.
//
// - `kvd_register_backend`: registers one `BackendInterface` per backend id; its four entries forward to the
//   Rust callbacks given at registration (no logic here: errors are ExecuTorch codes both ways).
// - `kvd_module_*`: `executorch::extension::Module` for the runner (load, execute, copy outputs out).
//
// Everything crossing is plain C: numbers, pointers, and the `kvd_*` structs mirrored in `src/ffi.rs`.

#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/platform/platform.h>

namespace rt = executorch::runtime;
using executorch::extension::Module;

extern "C" {

#define KVD_MAX_RANK 16

// One argument of a DelegateCall as Rust sees it (`ffi::KvdArg`).
struct kvd_arg {
  void* data;
  uint64_t nbytes;
  int64_t shape[KVD_MAX_RANK];
  uint32_t rank;
  int32_t scalar_type;
  uint32_t is_tensor;
  uint32_t reserved;
};

// One compile spec (`ffi::KvdSpec`).
struct kvd_spec {
  const char* key;
  const uint8_t* value;
  size_t len;
};

// The Rust side of one backend (`ffi::KvdCallbacks`). Every entry returns an ExecuTorch error code.
struct kvd_callbacks {
  void* ctx;
  bool (*is_available)(void* ctx);
  uint32_t (*init)(void* ctx, const uint8_t* data, size_t len, const kvd_spec* specs, size_t n_specs,
                   void** handle);
  uint32_t (*execute)(void* ctx, void* handle, const kvd_arg* args, size_t n_args);
  void (*destroy)(void* ctx, void* handle);
};

// A method input or output for the runner (`ffi::KvdTensor`): caller memory of `capacity` bytes.
struct kvd_tensor {
  void* data;
  uint64_t capacity;
  uint64_t nbytes;
  int64_t shape[KVD_MAX_RANK];
  uint32_t rank;
  int32_t scalar_type;
};

}  // extern "C"

namespace {

// The handle ExecuTorch holds: the Rust handle, and the processed payload that Rust's handle borrows.
struct BridgeHandle {
  void* rust;
  // ExecuTorch's `BackendDelegate` owns this buffer and destroys it only after `destroy` returns; the bridge
  // never calls `Free()`, so the payload stays valid for the handle's life without a copy.
  rt::FreeableBuffer* processed;
};

class BridgeBackend final : public rt::BackendInterface {
 public:
  explicit BridgeBackend(kvd_callbacks callbacks) : cb_(callbacks) {}

  bool is_available() const override { return cb_.is_available(cb_.ctx); }

  rt::Result<rt::DelegateHandle*> init(rt::BackendInitContext&, rt::FreeableBuffer* processed,
                                       rt::ArrayRef<rt::CompileSpec> compile_specs) const override {
    std::vector<kvd_spec> specs;
    specs.reserve(compile_specs.size());
    for (const auto& spec : compile_specs) {
      specs.push_back({spec.key, static_cast<const uint8_t*>(spec.value.buffer), spec.value.nbytes});
    }
    void* rust = nullptr;
    uint32_t code = cb_.init(cb_.ctx, static_cast<const uint8_t*>(processed->data()), processed->size(),
                             specs.data(), specs.size(), &rust);
    if (code != 0) {
      return static_cast<rt::Error>(code);
    }
    auto* handle = new (std::nothrow) BridgeHandle{rust, processed};
    if (handle == nullptr) {
      cb_.destroy(cb_.ctx, rust);
      return rt::Error::MemoryAllocationFailed;
    }
    return handle;
  }

  rt::Error execute(rt::BackendExecutionContext&, rt::DelegateHandle* handle,
                    rt::Span<rt::EValue*> args) const override {
    // Reused per thread: a decode loop allocates nothing here after its first call.
    thread_local std::vector<kvd_arg> out;
    out.assign(args.size(), kvd_arg{});
    for (size_t i = 0; i < args.size(); ++i) {
      kvd_arg& a = out[i];
      if (args[i] == nullptr || !args[i]->isTensor()) {
        continue;  // is_tensor = 0: Rust refuses it with InvalidArgument, naming the position.
      }
      const auto& t = args[i]->toTensor();
      a.is_tensor = 1;
      a.data = t.mutable_data_ptr();
      a.nbytes = t.nbytes();
      a.scalar_type = static_cast<int32_t>(t.scalar_type());
      a.rank = static_cast<uint32_t>(t.dim());
      if (a.rank > KVD_MAX_RANK) {
        return rt::Error::InvalidArgument;
      }
      for (uint32_t d = 0; d < a.rank; ++d) {
        a.shape[d] = t.size(d);
      }
    }
    auto* h = static_cast<BridgeHandle*>(handle);
    return static_cast<rt::Error>(cb_.execute(cb_.ctx, h->rust, out.data(), out.size()));
  }

  void destroy(rt::DelegateHandle* handle) const override {
    if (handle == nullptr) {
      return;
    }
    auto* h = static_cast<BridgeHandle*>(handle);
    cb_.destroy(cb_.ctx, h->rust);
    delete h;
  }

 private:
  kvd_callbacks cb_;
};

}  // namespace

namespace {

void (*g_log)(char level, const char* message, size_t len) = nullptr;

void forward_log(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t, const char* message,
                 size_t length) {
  if (g_log != nullptr) {
    g_log(static_cast<char>(level), message, length);
  }
}

}  // namespace

extern "C" {

// Sends ExecuTorch's log messages to `log` (Rust's `tracing`) instead of stderr.
bool kvd_set_log(void (*log)(char level, const char* message, size_t len)) {
  g_log = log;
  return rt::register_pal(rt::PalImpl::create(forward_log, __FILE__));
}

// Registers `name` (which must outlive the process) with `callbacks`. Returns ExecuTorch's code
// (RegistrationAlreadyRegistered when the id is taken, RegistrationExceedingMaxKernels when the table is full).
uint32_t kvd_register_backend(const char* name, const kvd_callbacks* callbacks) {
  // Leaked on purpose: ExecuTorch's registry keeps the pointer for the process's life.
  auto* backend = new (std::nothrow) BridgeBackend(*callbacks);
  if (backend == nullptr) {
    return static_cast<uint32_t>(rt::Error::MemoryAllocationFailed);
  }
  rt::Error err = rt::register_backend({name, backend});
  if (err != rt::Error::Ok) {
    delete backend;
  }
  return static_cast<uint32_t>(err);
}

// Whether ExecuTorch's registry has a backend named `name`.
bool kvd_backend_registered(const char* name) { return rt::get_backend_class(name) != nullptr; }

// A Module over `path` (mmapped), arenas shared across methods when `share_arenas`.
void* kvd_module_new(const char* path, bool share_arenas) {
  return new (std::nothrow)
      Module(std::string(path), Module::LoadMode::Mmap, nullptr, nullptr, nullptr, share_arenas);
}

void kvd_module_free(void* module) { delete static_cast<Module*>(module); }

uint32_t kvd_module_load(void* module) { return static_cast<uint32_t>(static_cast<Module*>(module)->load()); }

uint32_t kvd_module_load_method(void* module, const char* method) {
  return static_cast<uint32_t>(static_cast<Module*>(module)->load_method(method));
}

// Runs `method` with `inputs` (borrowed, never kept) and copies its tensor outputs into `outputs` (caller
// memory): up to `n_outputs` of them; `*n_written` receives the method's output count. Outputs that are not
// tensors, or that do not fit, fail with InvalidArgument.
uint32_t kvd_module_execute(void* module, const char* method, const kvd_tensor* inputs, size_t n_inputs,
                            kvd_tensor* outputs, size_t n_outputs, size_t* n_written) {
  auto* m = static_cast<Module*>(module);
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<rt::EValue> values;
  tensors.reserve(n_inputs);
  values.reserve(n_inputs);
  for (size_t i = 0; i < n_inputs; ++i) {
    const kvd_tensor& in = inputs[i];
    if (in.rank > KVD_MAX_RANK) {
      return static_cast<uint32_t>(rt::Error::InvalidArgument);
    }
    std::vector<executorch::aten::SizesType> sizes(in.shape, in.shape + in.rank);
    tensors.push_back(executorch::extension::from_blob(in.data, std::move(sizes),
                                                       static_cast<executorch::aten::ScalarType>(in.scalar_type)));
    values.emplace_back(*tensors.back());
  }
  auto result = m->execute(method, values);
  if (!result.ok()) {
    return static_cast<uint32_t>(result.error());
  }
  const auto& outs = result.get();
  *n_written = outs.size();
  for (size_t i = 0; i < outs.size() && i < n_outputs; ++i) {
    if (!outs[i].isTensor()) {
      return static_cast<uint32_t>(rt::Error::InvalidArgument);
    }
    const auto& t = outs[i].toTensor();
    kvd_tensor& out = outputs[i];
    if (t.dim() > KVD_MAX_RANK || t.nbytes() > out.capacity) {
      return static_cast<uint32_t>(rt::Error::InvalidArgument);
    }
    std::memcpy(out.data, t.const_data_ptr(), t.nbytes());
    out.nbytes = t.nbytes();
    out.scalar_type = static_cast<int32_t>(t.scalar_type());
    out.rank = static_cast<uint32_t>(t.dim());
    for (uint32_t d = 0; d < out.rank; ++d) {
      out.shape[d] = t.size(d);
    }
  }
  return 0;
}

}  // extern "C"
