/*
 * kv_delegate.h: kv-delegate's backends inside a C or C++ ExecuTorch 1.5.1 application.
 *
 * Link libkv_delegate.a or libkv_delegate.so (crates/executorch-capi) with the executorch==1.5.1 wheel's
 * libexecutorch.so, call kvd_register_backends() once before loading a program, then load and run the program
 * with ExecuTorch's own API (Module, or Program/Method): its DelegateCalls to ReferenceBackend and CudaBackend
 * run on our delegates. docs/cpp.md has the link lines.
 *
 * Every function may be called from any thread. Strings returned live for the whole process; the caller
 * frees nothing. Names starting with `kvd_` are reserved by this library.
 */
#ifndef KV_DELEGATE_H
#define KV_DELEGATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* This header's version; kvd_version() returns the library's, which must equal it. */
#define KVD_VERSION "0.1.0"

/* The ExecuTorch release the library is built against (its headers, libexecutorch.so's ABI). */
#define KVD_EXECUTORCH_VERSION "1.5.1"

/*
 * An ExecuTorch error code: the value of executorch::runtime::Error (0 is Error::Ok). In C++:
 * static_cast<executorch::runtime::Error>(code).
 */
typedef uint32_t kvd_error;

/*
 * Registers in ExecuTorch's backend registry every backend id our delegates serve: the reference delegate
 * (ReferenceBackend, CPU) and the CUDA delegate (CudaBackend, only where a CUDA driver and GPU are: elsewhere
 * a program calling it fails to load its method as ExecuTorch fails for any backend it does not have), plus
 * the plugin libraries listed in the DELEGATE_PLUGIN_PATH environment variable (by their manifests; a library
 * is checked against its manifest's SHA-256 before it is loaded).
 *
 * Call it before loading a program. The first success registers; later calls do nothing and return 0. A
 * failure registers nothing new and may be retried.
 *
 * Returns 0 (Error::Ok), or:
 *  - NotSupported (0x10): a plugin serving a backend id must run isolated in a worker process (its manifest
 *    asks for it), or could not be used; ExecuTorch runs delegates in this process, so the library never
 *    loads such a plugin;
 *  - InvalidArgument (0x12): ExecuTorch refused an id taken by a backend that is not ours (what
 *    executorch::runtime::register_backend returns for a name it has); any other code register_backend
 *    returns (its table, of a fixed size, is full);
 *  - Internal (0x1): a bug in the library (a Rust panic, caught).
 * kvd_last_error() says which id and why.
 */
kvd_error kvd_register_backends(void);

/* The number of backend ids kvd_register_backends() registered (0 before it succeeded). */
size_t kvd_backend_count(void);

/* The index-th registered backend id, NUL-terminated, or NULL when index >= kvd_backend_count(). */
const char* kvd_backend_name(size_t index);

/* The library's version, NUL-terminated ("0.1.0"). */
const char* kvd_version(void);

/*
 * The message of the last failure on the calling thread: of kvd_register_backends(), or of one of our
 * delegates' init or execute while ExecuTorch loaded or ran a method (ExecuTorch itself carries only the
 * code). Copies at most cap - 1 bytes and a NUL into buf (nothing when buf is NULL or cap is 0) and returns
 * the message's whole length (0 when there is none). A message copied whole is forgotten (the next call
 * returns 0 until another failure), so an old message is never mistaken for a later failure's; one cut short,
 * or only measured (buf NULL), stays, so a second call with a larger buffer gets all of it.
 */
size_t kvd_last_error(char* buf, size_t cap);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KV_DELEGATE_H */
