// The C++ half of executorch-bridge: the smallest shim between ExecuTorch 1.5.1's C++ runtime and Rust.
//
// - `kvd_register_backend`: registers one `BackendInterface` per backend id; its four entries forward to the
//   Rust callbacks given at registration (no logic here: errors are ExecuTorch codes both ways).
// - `kvd_module_*`: `executorch::extension::Module` for the runner over program bytes Rust read and checked
//   (a `BufferDataLoader`: ExecuTorch never opens the file), load, execute, copy outputs out; a
//   method's planned memory is either the Module's own (host) buffers or spans the caller supplies
//   (`kvd_planned_new`, a `HierarchicalAllocator` over Rust's CUDA managed memory, `kvd_module_load_method_planned`).
// - counting copy kernels: every method the runner loads gets a method-scoped kernel registry in which each
//   kernel ExecuTorch registered for a copy operator (`aten::copy_`, the write-back, and the copy/clone/to-copy
//   `out` kernels) is wrapped, with the same kernel key, by one that calls it and then adds the bytes it wrote
//   to per-thread counters (`kvd_take_copy_counts`). The counts are what the kernels that run did, whether
//   or not source and destination are one memory.
//
// Everything crossing is plain C: numbers, pointers, and the `kvd_*` structs mirrored in `src/ffi.rs`.
//
// No C++ exception leaves this file: ExecuTorch is built without exceptions and Rust cannot unwind one, so every
// `extern "C"` entry and every `BackendInterface` method runs its body under `guard`, which turns an exception
// into an ExecuTorch code (MemoryAllocationFailed for `std::bad_alloc`, Internal otherwise) and keeps its
// message per thread for Rust (`kvd_take_exception`).

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
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

// Bytes the counting copy kernels saw written on this thread (`ffi::KvdCopyCounts`).
struct kvd_copy_counts {
  // `aten::copy_` calls (the buffer write-backs) and the bytes they wrote.
  uint64_t write_back_calls;
  uint64_t write_back_bytes;
  // Calls of the other copy kernels (`aten::copy.out`, `aten::clone.out`, ...) and the bytes they wrote.
  uint64_t op_calls;
  uint64_t op_bytes;
};

}  // extern "C"

namespace {

// The message of the last C++ exception `guard` caught on this thread, NUL-terminated, empty when none. Fixed
// storage: remembering an exception (a `std::bad_alloc` among them) must not allocate.
thread_local char g_exception[256] = {0};

void remember(const char* where, const char* what) noexcept {
  std::snprintf(g_exception, sizeof g_exception, "%s threw %s", where, what);
}

// Runs `body` (returning an ExecuTorch code); a C++ exception it throws becomes a code, its message kept.
template <typename Body>
rt::Error guard(const char* where, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc& e) {
    remember(where, e.what());
    return rt::Error::MemoryAllocationFailed;
  } catch (const std::exception& e) {
    remember(where, e.what());
    return rt::Error::Internal;
  } catch (...) {
    remember(where, "an exception that is not a std::exception");
    return rt::Error::Internal;
  }
}

uint32_t as_code(rt::Error err) noexcept { return static_cast<uint32_t>(err); }

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

  bool is_available() const override {
    bool available = false;
    rt::Error err = guard("is_available", [&] {
      available = cb_.is_available(cb_.ctx);
      return rt::Error::Ok;
    });
    return err == rt::Error::Ok && available;
  }

  rt::Result<rt::DelegateHandle*> init(rt::BackendInitContext&, rt::FreeableBuffer* processed,
                                       rt::ArrayRef<rt::CompileSpec> compile_specs) const override {
    rt::DelegateHandle* made = nullptr;
    rt::Error err = guard("init", [&] {
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
      made = new (std::nothrow) BridgeHandle{rust, processed};
      if (made == nullptr) {
        cb_.destroy(cb_.ctx, rust);
        return rt::Error::MemoryAllocationFailed;
      }
      return rt::Error::Ok;
    });
    if (err != rt::Error::Ok) {
      return err;
    }
    return made;
  }

  rt::Error execute(rt::BackendExecutionContext&, rt::DelegateHandle* handle,
                    rt::Span<rt::EValue*> args) const override {
    return guard("execute", [&] {
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
    });
  }

  void destroy(rt::DelegateHandle* handle) const override {
    if (handle == nullptr) {
      return;
    }
    auto* h = static_cast<BridgeHandle*>(handle);
    // Nothing here throws today (a Rust callback that catches its panics, then `delete`); guarded all the same.
    guard("destroy", [&] {
      cb_.destroy(cb_.ctx, h->rust);
      return rt::Error::Ok;
    });
    delete h;
  }

 private:
  kvd_callbacks cb_;
};

}  // namespace

namespace {

void (*g_log)(char level, const char* message, size_t len) = nullptr;

void forward_log(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t, const char* message,
                 size_t length) noexcept {
  if (g_log != nullptr) {
    g_log(static_cast<char>(level), message, length);
  }
}

}  // namespace

namespace {

// The operators whose kernels copy bytes and are counted; the first is the buffer write-back.
constexpr const char* kWriteBack = "aten::copy_";
constexpr const char* kCopyOperators[] = {
    kWriteBack,
    "aten::copy.out",
    "aten::clone.out",
    "aten::_to_copy.out",
    "dim_order_ops::_clone_dim_order.out",
    "dim_order_ops::_to_dim_order_copy.out",
};

thread_local kvd_copy_counts g_copy_counts = {0, 0, 0, 0};

// One wrapped kernel: ExecuTorch's own function, and whether its operator is the write-back.
struct Wrapped {
  rt::OpFunction original;
  bool write_back;
};

// Room for every kernel (fallback or dtype-specialised) the copy operators have in the registry.
constexpr size_t kMaxWrapped = 128;
Wrapped g_wrapped[kMaxWrapped];

// Adds what a successful copy kernel call wrote: its out tensor (the last argument; `copy_`'s is `self`).
void count_copy(const rt::KernelRuntimeContext& ctx, rt::Span<rt::EValue*> args, bool write_back) {
  if (ctx.failure_state() != rt::Error::Ok || args.size() == 0) {
    return;
  }
  const rt::EValue* out = args[args.size() - 1];
  uint64_t bytes = (out != nullptr && out->isTensor()) ? out->toTensor().nbytes() : 0;
  if (write_back) {
    g_copy_counts.write_back_calls += 1;
    g_copy_counts.write_back_bytes += bytes;
  } else {
    g_copy_counts.op_calls += 1;
    g_copy_counts.op_bytes += bytes;
  }
}

// The counting kernel in slot `I` of `g_wrapped`: ExecuTorch's kernel runs, then its bytes are counted.
template <size_t I>
void counting_kernel(rt::KernelRuntimeContext& ctx, rt::Span<rt::EValue*> args) {
  g_wrapped[I].original(ctx, args);
  count_copy(ctx, args, g_wrapped[I].write_back);
}

template <size_t... I>
constexpr std::array<rt::OpFunction, sizeof...(I)> counting_table(std::index_sequence<I...>) {
  return {{&counting_kernel<I>...}};
}
constexpr auto kCounting = counting_table(std::make_index_sequence<kMaxWrapped>{});

bool is_copy_operator(const char* name) {
  for (const char* op : kCopyOperators) {
    if (std::strcmp(name, op) == 0) {
      return true;
    }
  }
  return false;
}

// Whether the registry had more copy kernels than `g_wrapped` holds (then methods are not loaded: a copy
// kernel left unwrapped would run uncounted).
bool g_wrapped_overflow = false;

// The method-scoped registry: each registered kernel of a copy operator, same name and key, counting. Built
// once, after the kernels library's static initialisers registered everything.
const std::vector<rt::Kernel>& counting_kernels() {
  static std::vector<rt::Kernel> kernels;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const rt::Kernel& k : rt::get_registered_kernels()) {
      if (k.name_ == nullptr || !is_copy_operator(k.name_)) {
        continue;
      }
      if (kernels.size() == kMaxWrapped) {
        g_wrapped_overflow = true;
        break;
      }
      size_t slot = kernels.size();
      g_wrapped[slot] = Wrapped{k.op_, std::strcmp(k.name_, kWriteBack) == 0};
      kernels.emplace_back(k.name_, k.kernel_key_, kCounting[slot]);
    }
  });
  return kernels;
}

}  // namespace

namespace {

// `in`'s shape as ExecuTorch's sizes, each checked to fit `SizesType` (32 bits), into `sizes`.
rt::Error sizes_of(const kvd_tensor& in, std::vector<executorch::aten::SizesType>& sizes) {
  using Size = executorch::aten::SizesType;
  if (in.rank > KVD_MAX_RANK) {
    return rt::Error::InvalidArgument;
  }
  sizes.clear();
  for (uint32_t d = 0; d < in.rank; ++d) {
    if (in.shape[d] < 0 || in.shape[d] > std::numeric_limits<Size>::max()) {
      return rt::Error::InvalidArgument;
    }
    sizes.push_back(static_cast<Size>(in.shape[d]));
  }
  return rt::Error::Ok;
}

rt::Error module_execute(Module* m, const char* method, const kvd_tensor* inputs, size_t n_inputs,
                         kvd_tensor* outputs, size_t n_outputs, size_t* n_written) {
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<rt::EValue> values;
  tensors.reserve(n_inputs);
  values.reserve(n_inputs);
  for (size_t i = 0; i < n_inputs; ++i) {
    const kvd_tensor& in = inputs[i];
    std::vector<executorch::aten::SizesType> sizes;
    rt::Error err = sizes_of(in, sizes);
    if (err != rt::Error::Ok) {
      return err;
    }
    tensors.push_back(executorch::extension::from_blob(in.data, std::move(sizes),
                                                       static_cast<executorch::aten::ScalarType>(in.scalar_type)));
    // The tensor reads exactly shape x dtype bytes: the caller's memory must hold exactly that many.
    if (tensors.back()->nbytes() != in.nbytes) {
      return rt::Error::InvalidArgument;
    }
    values.emplace_back(*tensors.back());
  }
  auto result = m->execute(method, values);
  if (!result.ok()) {
    return result.error();
  }
  const auto& outs = result.get();
  *n_written = outs.size();
  for (size_t i = 0; i < outs.size() && i < n_outputs; ++i) {
    if (!outs[i].isTensor()) {
      return rt::Error::InvalidArgument;
    }
    const auto& t = outs[i].toTensor();
    kvd_tensor& out = outputs[i];
    if (t.dim() > KVD_MAX_RANK || t.nbytes() > out.capacity) {
      return rt::Error::InvalidArgument;
    }
    std::memcpy(out.data, t.const_data_ptr(), t.nbytes());
    out.nbytes = t.nbytes();
    out.scalar_type = static_cast<int32_t>(t.scalar_type());
    out.rank = static_cast<uint32_t>(t.dim());
    for (uint32_t d = 0; d < out.rank; ++d) {
      out.shape[d] = t.size(d);
    }
  }
  return rt::Error::Ok;
}

}  // namespace

extern "C" {

// Copies the message of the last C++ exception caught on this thread (NUL-terminated, cut to `cap`) into `out`
// and forgets it. Returns its length, 0 when there was none.
size_t kvd_take_exception(char* out, size_t cap) noexcept {
  size_t len = std::strlen(g_exception);
  if (len == 0 || out == nullptr || cap == 0) {
    return 0;
  }
  len = len < cap - 1 ? len : cap - 1;
  std::memcpy(out, g_exception, len);
  out[len] = '\0';
  g_exception[0] = '\0';
  return len;
}

// Sends ExecuTorch's log messages to `log` (Rust's `tracing`) instead of stderr.
bool kvd_set_log(void (*log)(char level, const char* message, size_t len)) noexcept {
  g_log = log;
  bool registered = false;
  guard("kvd_set_log", [&] {
    registered = rt::register_pal(rt::PalImpl::create(forward_log, __FILE__));
    return rt::Error::Ok;
  });
  return registered;
}

// Registers `name` (which must outlive the process) with `callbacks`. Returns ExecuTorch's code
// (RegistrationAlreadyRegistered when the id is taken, RegistrationExceedingMaxKernels when the table is full).
uint32_t kvd_register_backend(const char* name, const kvd_callbacks* callbacks) noexcept {
  return as_code(guard("kvd_register_backend", [&] {
    // Leaked on purpose: ExecuTorch's registry keeps the pointer for the process's life.
    auto* backend = new BridgeBackend(*callbacks);
    rt::Error err = rt::register_backend({name, backend});
    if (err != rt::Error::Ok) {
      delete backend;
    }
    return err;
  }));
}

// Whether ExecuTorch's registry has a backend named `name`.
bool kvd_backend_registered(const char* name) noexcept {
  bool found = false;
  guard("kvd_backend_registered", [&] {
    found = rt::get_backend_class(name) != nullptr;
    return rt::Error::Ok;
  });
  return found;
}

// A Module over the `len` program bytes at `data` (the caller's, read once and checked; they must outlive the
// Module), arenas shared across methods when `share_arenas`, into `*module`. ExecuTorch loads the program through
// a `BufferDataLoader` over exactly those bytes: it never opens a file, and delegate payloads and constants are
// lent from them, uncopied.
uint32_t kvd_module_new(const uint8_t* data, size_t len, bool share_arenas, void** module) noexcept {
  *module = nullptr;
  return as_code(guard("kvd_module_new", [&] {
    auto loader = std::make_unique<executorch::extension::BufferDataLoader>(data, len);
    *module = new Module(std::move(loader), nullptr, nullptr, nullptr, nullptr, share_arenas);
    return rt::Error::Ok;
  }));
}

// Destructors do not throw (they are noexcept: an exception there would end the process inside `~Module`).
void kvd_module_free(void* module) noexcept { delete static_cast<Module*>(module); }

uint32_t kvd_module_load(void* module) noexcept {
  return as_code(guard("kvd_module_load", [&] { return static_cast<Module*>(module)->load(); }));
}

// Loads `method` with the counting copy kernels as its method-scoped kernel registry (ExecuTorch resolves an
// operator there first, by the same name and kernel key rules, then in the global registry).
uint32_t kvd_module_load_method(void* module, const char* method) noexcept {
  return as_code(guard("kvd_module_load_method", [&] {
    const auto& kernels = counting_kernels();
    if (g_wrapped_overflow) {
      std::snprintf(g_exception, sizeof g_exception, "%s",
                    "ExecuTorch registers more copy kernels than the bridge's counting registry holds (128)");
      return rt::Error::NotSupported;
    }
    return static_cast<Module*>(module)->load_method(method, nullptr, nullptr, nullptr, kernels);
  }));
}

// The sizes of `method`'s memory-planned buffers (`MethodMeta::memory_planned_buffer_size`, one per mem_id
// from 1), the first `cap` of them into `sizes`; `*n` receives how many the method has.
uint32_t kvd_module_planned_sizes(void* module, const char* method, uint64_t* sizes, size_t cap,
                                  size_t* n) noexcept {
  *n = 0;
  return as_code(guard("kvd_module_planned_sizes", [&] {
    auto meta = static_cast<Module*>(module)->method_meta(method);
    if (!meta.ok()) {
      return meta.error();
    }
    *n = meta->num_memory_planned_buffers();
    for (size_t i = 0; i < *n && i < cap; ++i) {
      auto size = meta->memory_planned_buffer_size(i);
      if (!size.ok()) {
        return size.error();
      }
      sizes[i] = static_cast<uint64_t>(size.get());
    }
    return rt::Error::Ok;
  }));
}

}  // extern "C"

namespace {

// Planned memory the caller supplies: its spans (the caller's memory, kept alive by the caller until every
// method loaded with them is gone) and the `HierarchicalAllocator` ExecuTorch places planned tensors with.
struct PlannedSpans {
  std::vector<rt::Span<uint8_t>> spans;
  rt::HierarchicalAllocator allocator;
  explicit PlannedSpans(std::vector<rt::Span<uint8_t>> s)
      : spans(std::move(s)), allocator({spans.data(), spans.size()}) {}
};

}  // namespace

extern "C" {

// One span of caller memory for planned buffers (`ffi::KvdSpan`).
struct kvd_span {
  void* data;
  uint64_t len;
};

// A HierarchicalAllocator over the `n` caller spans (span i is mem_id i + 1), into `*planned`; free it with
// `kvd_planned_free` after the Module that loaded methods with it.
uint32_t kvd_planned_new(const kvd_span* spans, size_t n, void** planned) noexcept {
  *planned = nullptr;
  return as_code(guard("kvd_planned_new", [&] {
    std::vector<rt::Span<uint8_t>> owned;
    owned.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      owned.emplace_back(static_cast<uint8_t*>(spans[i].data), static_cast<size_t>(spans[i].len));
    }
    *planned = new PlannedSpans(std::move(owned));
    return rt::Error::Ok;
  }));
}

void kvd_planned_free(void* planned) noexcept { delete static_cast<PlannedSpans*>(planned); }

// As `kvd_module_load_method`, with `planned` (from `kvd_planned_new`) as the method's planned memory instead
// of buffers the Module allocates.
uint32_t kvd_module_load_method_planned(void* module, const char* method, void* planned) noexcept {
  return as_code(guard("kvd_module_load_method_planned", [&] {
    const auto& kernels = counting_kernels();
    if (g_wrapped_overflow) {
      std::snprintf(g_exception, sizeof g_exception, "%s",
                    "ExecuTorch registers more copy kernels than the bridge's counting registry holds (128)");
      return rt::Error::NotSupported;
    }
    auto* allocator = &static_cast<PlannedSpans*>(planned)->allocator;
    return static_cast<Module*>(module)->load_method(method, allocator, nullptr, nullptr, kernels);
  }));
}

// How many kernels the counting registry wraps (every registered kernel of a copy operator); `*write_backs`
// receives how many of them are `aten::copy_`'s.
size_t kvd_counting_kernels(size_t* write_backs) noexcept {
  size_t n = 0;
  size_t copies = 0;
  guard("kvd_counting_kernels", [&] {
    const auto& kernels = counting_kernels();
    n = kernels.size();
    for (const rt::Kernel& k : kernels) {
      copies += std::strcmp(k.name_, kWriteBack) == 0 ? 1 : 0;
    }
    return rt::Error::Ok;
  });
  *write_backs = copies;
  return n;
}

// Copies this thread's copy counts into `*out` and resets them.
void kvd_take_copy_counts(kvd_copy_counts* out) noexcept {
  *out = g_copy_counts;
  g_copy_counts = kvd_copy_counts{0, 0, 0, 0};
}

// Runs `method` with `inputs` (borrowed, never kept; each `nbytes` must be its shape x dtype, each size must fit
// ExecuTorch's 32-bit sizes) and copies its tensor outputs into `outputs` (caller memory): up to `n_outputs` of
// them; `*n_written` receives the method's output count. Inputs that do not describe their bytes, outputs that
// are not tensors, or that do not fit, fail with InvalidArgument.
uint32_t kvd_module_execute(void* module, const char* method, const kvd_tensor* inputs, size_t n_inputs,
                            kvd_tensor* outputs, size_t n_outputs, size_t* n_written) noexcept {
  return as_code(guard("kvd_module_execute", [&] {
    return module_execute(static_cast<Module*>(module), method, inputs, n_inputs, outputs, n_outputs, n_written);
  }));
}

}  // extern "C"
