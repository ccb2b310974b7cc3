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
 * Every function may be called from any thread (a stop checker by one at a time). Strings returned live for
 * the whole process; the caller frees only the samplers and stop checkers it made (their _free functions).
 * Names starting with `kvd_` are reserved by this library.
 *
 * For generating text with your own Module: kvd_sampler_* picks each token from the logits and
 * kvd_stop_checker_* ends the reply, as delegate-host run and et-run do.
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

/*
 * Sampling: picking each token from the logits your own Module returned, with the arithmetic of
 * `delegate-host run` and `et-run` (repetition penalty, temperature, top-k, top-p, min-p; a counter-based
 * generator, so a seed gives the same tokens on every run and in every tool). A sampler is immutable: any
 * thread may sample with it at once.
 */
typedef struct kvd_sampler kvd_sampler;

/*
 * A sampler in *out (free it with kvd_sampler_free). temperature 0 is greedy (the first largest logit, a NaN
 * never wins); top_k 0 keeps the 1024 most likely ids (the most a draw chooses among); top_p 1, min_p 0 and
 * repetition_penalty 1 each turn their step off.
 * Returns 0, or InvalidArgument (0x12): out is NULL, or a parameter is out of range (temperature finite and
 * >= 0, top_k at most 1024, top_p in (0, 1], min_p in [0, 1], repetition_penalty finite and > 0);
 * kvd_last_error() names it.
 */
kvd_error kvd_sampler_new(float temperature, uint32_t top_k, float top_p, float min_p, float repetition_penalty,
                          uint64_t seed, kvd_sampler** out);

/*
 * The token for generated token `step` (0 for the token after the prompt, then 1, 2, ...; the seed's draw for
 * that step) from the vocab logits of the last row, given the history (the prompt's and the generated ids,
 * for the repetition penalty; NULL with history_len 0 for none), in *token.
 * Returns 0, or InvalidArgument (0x12): sampler, logits or token is NULL (logits with vocab > 0), vocab is 0,
 * or a length is larger than any array; Internal (0x1): a bug (a Rust panic, caught).
 */
kvd_error kvd_sampler_sample(const kvd_sampler* sampler, const float* logits, size_t vocab,
                             const int64_t* history, size_t history_len, uint64_t step, int64_t* token);

/* Frees a sampler of kvd_sampler_new; NULL does nothing. */
void kvd_sampler_free(kvd_sampler* sampler);

/* Why a reply ends, as kvd_stop_checker_push reports it. */
#define KVD_STOP_NONE 0   /* it goes on */
#define KVD_STOP_EOS 1    /* an end-of-sequence id (not part of the reply's text) */
#define KVD_STOP_STRING 2 /* a stop string appeared in the reply's text */
#define KVD_STOP_LENGTH 3 /* max_new_tokens tokens were generated */

/*
 * One reply's stop rules and state: not shared between threads while in use. Make one per reply.
 */
typedef struct kvd_stop_checker kvd_stop_checker;

/*
 * A stop checker in *out (free it with kvd_stop_checker_free): the end-of-sequence ids eos[0..eos_len]
 * (generation_config.json's eos_token_id), the NUL-terminated UTF-8 stop strings stops[0..stops_len] (copied;
 * empty ones never match), and at most max_new_tokens generated tokens (0: no budget). NULL arrays with a
 * length of 0 are empty.
 * Returns 0, or InvalidArgument (0x12): out is NULL, an array is NULL with a length, a stop string is NULL or
 * not UTF-8; kvd_last_error() names which.
 */
kvd_error kvd_stop_checker_new(const int64_t* eos, size_t eos_len, const char* const* stops, size_t stops_len,
                               uint64_t max_new_tokens, kvd_stop_checker** out);

/*
 * Adds generated token `token` and the text_len bytes of UTF-8 text it added to the reply (what your
 * detokeniser released for it; may be empty, NULL with text_len 0); *stop gets a KVD_STOP_* value. The checks
 * run in that order: an end-of-sequence id, then a stop string (found across tokens), then the budget.
 * Returns 0, or InvalidArgument (0x12): checker or stop is NULL, text is NULL with a length, or text is not
 * UTF-8 (a character split across tokens: pass its bytes once complete).
 */
kvd_error kvd_stop_checker_push(kvd_stop_checker* checker, int64_t token, const char* text, size_t text_len,
                                int32_t* stop);

/* Frees a stop checker of kvd_stop_checker_new; NULL does nothing. */
void kvd_stop_checker_free(kvd_stop_checker* checker);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KV_DELEGATE_H */
