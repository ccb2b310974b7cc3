/*
 * kv_delegate.h: kv-delegate's backends inside a C or C++ ExecuTorch 1.5.1 application.
 *
 * Link libkv_delegate.a or libkv_delegate.so (crates/executorch-capi) with the executorch==1.5.1 wheel's
 * libexecutorch.so, call kvd_register_backends() once before loading a program, then, for every program:
 *
 *   1. read its bytes once into memory you own (not a path ExecuTorch opens again, not a mapping);
 *   2. kvd_check_program(bytes, len) on them, and load nothing it refuses;
 *   3. load and run exactly those bytes with ExecuTorch's own API (Module over a BufferDataLoader, or
 *      Program/Method): its DelegateCalls to ReferenceBackend and CudaBackend run on our delegates.
 *
 * Step 2 is not optional for a program you did not export yourself: ExecuTorch hands a delegate every tensor
 * as writable, and our delegates never see the program, so only this check stops a crafted program whose
 * delegate would write into its own constants (a crash, or silently changed weights). docs/cpp.md has the
 * load sequence and the link lines.
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

/*
 * Checks the len program bytes at data before ExecuTorch loads them: that they are a readable .pte, and that
 * every DelegateCall argument one of our delegates writes (an output, or a buffer it updates in place) is
 * memory ExecuTorch's planner placed, never a constant of the program (bytes ExecuTorch may have mapped
 * read-only: the delegate's write would crash the process, or overwrite the program's weights) nor memory the
 * caller binds. The same check et-run makes. Reads the bytes during the call only; needs no registration;
 * DelegateCalls to backends that are not ours are not judged. Any thread.
 *
 * Then load exactly these bytes (executorch::extension::BufferDataLoader over them, kept alive as long as the
 * Module): a file reopened or mapped by path could have changed since it was checked.
 *
 * Returns 0 (Error::Ok), or:
 *  - InvalidProgram (0x23): not a readable program (truncated, corrupted, not a .pte), or a delegate writes
 *    outside planned memory; the message names the method, the call, the argument and why, e.g.
 *    "kvd_check_program: method 'forward', chains[0].instructions[0] (DelegateCall to ReferenceBackend):
 *    argument 4 ('k_cache_out_0', value 4) is an output the delegate writes, but it is not planned memory:
 *    it is constant data of the program (data_buffer_idx 1, no allocation_info); ...";
 *  - NotSupported (0x10): a .pte of an ExecuTorch version this library does not read;
 *  - InvalidArgument (0x12): data is NULL while len is not 0, or len is larger than any memory (NULL with
 *    len 0 is an empty buffer: InvalidProgram);
 *  - Internal (0x1): a bug in the library (a Rust panic, caught).
 * kvd_last_error() gives the message, one line.
 */
kvd_error kvd_check_program(const void* data, size_t len);

/* The number of backend ids kvd_register_backends() registered (0 before it succeeded). */
size_t kvd_backend_count(void);

/* The index-th registered backend id, NUL-terminated, or NULL when index >= kvd_backend_count(). */
const char* kvd_backend_name(size_t index);

/* The library's version, NUL-terminated ("0.1.0"). */
const char* kvd_version(void);

/*
 * The message of the last failure on the calling thread: of kvd_register_backends() or kvd_check_program(),
 * or of one of our delegates' init or execute while ExecuTorch loaded or ran a method (ExecuTorch itself
 * carries only the code). Copies at most cap - 1 bytes and a NUL into buf (nothing when buf is NULL or cap is
 * 0) and returns the message's whole length (0 when there is none). A message copied whole is forgotten (the
 * next call returns 0 until another failure), so an old message is never mistaken for a later failure's; one
 * cut short, or only measured (buf NULL), stays, so a second call with a larger buffer gets all of it.
 */
size_t kvd_last_error(char* buf, size_t cap);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KV_DELEGATE_H */
