/*
 * list_backends: kv_delegate.h from C. Registers kv-delegate's backends in ExecuTorch's registry and prints
 * the library's version and the ids registered, or the failure's code and message.
 *
 *   kv-delegate 0.1.0: ReferenceBackend
 *
 * Built (C99, -pedantic) and run by crates/executorch-capi/tests/cpp_example.rs.
 */
#include <kv_delegate.h>

#include <stdio.h>

int main(void) {
  kvd_error code = kvd_register_backends();
  if (code != 0) {
    char message[1024];
    kvd_last_error(message, sizeof message);
    fprintf(stderr, "error: kvd_register_backends: ExecuTorch error 0x%02x (%s)\n", (unsigned)code, message);
    return 1;
  }
  printf("kv-delegate %s:", kvd_version());
  for (size_t i = 0; i < kvd_backend_count(); ++i) {
    printf(" %s", kvd_backend_name(i));
  }
  printf("\n");
  return 0;
}
