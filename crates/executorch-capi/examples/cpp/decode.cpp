// decode: decoding a kv-delegate program inside a plain ExecuTorch 1.5.1 application.
//
//   decode PROGRAM.pte [PROMPT [STEPS [TEMPERATURE [SEED]]]]
//       PROMPT: comma-separated token ids (default 1,7,3,12); STEPS: decode steps after the prompt (default 12);
//       TEMPERATURE (default 0: greedy) and SEED (default 0): the sampler's
//
// It registers kv-delegate's backends (kv_delegate.h), reads the program once (a regular file only, opened
// without blocking), checks those bytes (kvd_check_program: a program whose delegate would write into its own
// constants is refused) and has ExecuTorch's `Module` load exactly them (a BufferDataLoader: ExecuTorch never
// opens the file, so a file changed after the check is never what runs), with memory arenas shared across
// methods (so `decode` sees the caches `prefill` wrote). It feeds the prompt (one `prefill` call, or `forward`
// token by token), then feeds back each token kv-delegate's sampler picks from the logits (kvd_sampler_sample:
// the argmax at temperature 0, a seed's draw above it, as `delegate-host run` and `et-run` pick) until its stop
// checker ends the reply (kvd_stop_checker_push: STEPS + 1 tokens) and prints
//
//   kv-delegate 0.1.0: ReferenceBackend CudaBackend
//   tokens: 52 19 9 ...
//
// Every method is (tokens: i64 [T], input_pos: i64 [1]) -> logits: f32 [T, vocab] (fixtures/executorch/README.md).
// A failure prints one `error:` line (ExecuTorch's code, and kv-delegate's message when there is one) and exits 1.
// Built and run by crates/executorch-capi/tests/cpp_example.rs; docs/cpp.md has the link lines.

#include <kv_delegate.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>

namespace {

using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::Result;

// One `error:` line: what failed, ExecuTorch's code, and the message kv-delegate kept for this thread.
int fail(const std::string& what, Error err) {
  std::fprintf(stderr, "error: %s: ExecuTorch error 0x%02x", what.c_str(), static_cast<unsigned>(err));
  char message[1024];
  if (kvd_last_error(message, sizeof message) > 0) {
    std::fprintf(stderr, " (%s)", message);
  }
  std::fputc('\n', stderr);
  return 1;
}

// The whole file at `path` into `bytes`, read once: opened without blocking (a FIFO cannot stall the open) and
// refused unless it is a regular file (a device such as /dev/zero is never read). An empty string, or why not.
std::string read_program(const char* path, std::vector<uint8_t>& bytes) {
  const int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return std::strerror(errno);
  }
  std::string why;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (why.empty() && done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno != EINTR) {
        why = std::strerror(errno);
      } else if (n == 0) {
        why = "it shrank while being read";
      } else if (n > 0) {
        done += static_cast<size_t>(n);
      }
    }
  }
  ::close(fd);
  return why;
}

// Runs `method` on `tokens` at `position` (the first token's) and returns the last row of its logits.
Result<std::vector<float>> step(Module& module, const std::string& method, std::vector<int64_t> tokens,
                                int64_t position) {
  auto tokens_tensor = executorch::extension::from_blob(
      tokens.data(), {static_cast<executorch::aten::SizesType>(tokens.size())}, ScalarType::Long);
  auto position_tensor = executorch::extension::from_blob(&position, {1}, ScalarType::Long);
  auto outputs = module.execute(method, {EValue(*tokens_tensor), EValue(*position_tensor)});
  if (!outputs.ok()) {
    return outputs.error();
  }
  if (outputs->empty() || !(*outputs)[0].isTensor()) {
    std::fprintf(stderr, "%s: output 0 is not a tensor\n", method.c_str());
    return Error::InvalidProgram;
  }
  const auto& logits = (*outputs)[0].toTensor();
  if (logits.scalar_type() != ScalarType::Float || logits.dim() != 2 ||
      logits.size(0) != static_cast<int64_t>(tokens.size())) {
    std::fprintf(stderr, "%s: output 0 is not f32 logits [%zu, vocab]\n", method.c_str(), tokens.size());
    return Error::InvalidProgram;
  }
  const int64_t vocab = logits.size(1);
  const float* last = logits.const_data_ptr<float>() + (logits.size(0) - 1) * vocab;
  return std::vector<float>(last, last + vocab);
}

// The logits after the prompt: one `prefill` call, or `forward` fed the prompt token by token.
Result<std::vector<float>> feed_prompt(Module& module, bool two_methods, const std::vector<int64_t>& prompt) {
  if (two_methods) {
    return step(module, "prefill", prompt, 0);
  }
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    Result<std::vector<float>> row = step(module, "forward", {prompt[i]}, static_cast<int64_t>(i));
    if (!row.ok()) {
      return row.error();
    }
  }
  return step(module, "forward", {prompt.back()}, static_cast<int64_t>(prompt.size() - 1));
}

bool parse_prompt(const std::string& text, std::vector<int64_t>& prompt) {
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') {
      return false;
    }
    prompt.push_back(value);
  }
  return !prompt.empty();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 6) {
    std::fprintf(stderr, "usage: %s PROGRAM.pte [PROMPT [STEPS [TEMPERATURE [SEED]]]]\n", argv[0]);
    return 2;
  }
  std::vector<int64_t> prompt;
  if (!parse_prompt(argc > 2 ? argv[2] : "1,7,3,12", prompt)) {
    std::fprintf(stderr, "error: the prompt '%s' is not comma-separated token ids\n", argv[2]);
    return 2;
  }
  char* end = nullptr;
  const long steps = argc > 3 ? std::strtol(argv[3], &end, 10) : 12;
  if (steps < 0 || (argc > 3 && (*argv[3] == '\0' || *end != '\0'))) {
    std::fprintf(stderr, "error: the step count '%s' is not a number of steps\n", argv[3]);
    return 2;
  }
  char* temperature_end = nullptr;
  const float temperature = argc > 4 ? std::strtof(argv[4], &temperature_end) : 0.0f;
  char* seed_end = nullptr;
  const unsigned long long seed = argc > 5 ? std::strtoull(argv[5], &seed_end, 10) : 0;
  if ((argc > 4 && (*argv[4] == '\0' || *temperature_end != '\0')) ||
      (argc > 5 && (*argv[5] == '\0' || *seed_end != '\0'))) {
    std::fprintf(stderr, "error: the temperature and the seed are numbers\n");
    return 2;
  }
  // kv-delegate's sampler (it checks the temperature) and one reply's stop checker: STEPS + 1 tokens, no
  // end-of-sequence id or stop string (the fixtures' vocabularies have no text).
  kvd_sampler* sampler = nullptr;
  Error made = static_cast<Error>(kvd_sampler_new(temperature, 0, 1.0f, 0.0f, 1.0f, seed, &sampler));
  if (made != Error::Ok) {
    return fail("kvd_sampler_new", made);
  }
  std::unique_ptr<kvd_sampler, void (*)(kvd_sampler*)> sampler_owner(sampler, kvd_sampler_free);
  kvd_stop_checker* stops = nullptr;
  made = static_cast<Error>(kvd_stop_checker_new(nullptr, 0, nullptr, 0, static_cast<uint64_t>(steps) + 1, &stops));
  if (made != Error::Ok) {
    return fail("kvd_stop_checker_new", made);
  }
  std::unique_ptr<kvd_stop_checker, void (*)(kvd_stop_checker*)> stops_owner(stops, kvd_stop_checker_free);

  // Before loading a program: its DelegateCalls find our backends in ExecuTorch's registry.
  Error registered = static_cast<Error>(kvd_register_backends());
  if (registered != Error::Ok) {
    return fail("kvd_register_backends", registered);
  }
  std::printf("kv-delegate %s:", kvd_version());
  for (size_t i = 0; i < kvd_backend_count(); ++i) {
    std::printf(" %s", kvd_backend_name(i));
  }
  std::printf("\n");

  // The program's bytes, read once; checked before ExecuTorch sees them; then exactly those bytes loaded.
  std::vector<uint8_t> program;
  const std::string unreadable = read_program(argv[1], program);
  if (!unreadable.empty()) {
    std::fprintf(stderr, "error: cannot read %s: %s\n", argv[1], unreadable.c_str());
    return 1;
  }
  Error checked = static_cast<Error>(kvd_check_program(program.data(), program.size()));
  if (checked != Error::Ok) {
    return fail(std::string("checking ") + argv[1], checked);
  }
  // `program` outlives `module` (declared before it): ExecuTorch lends delegate payloads from these bytes.
  Module module(std::make_unique<executorch::extension::BufferDataLoader>(program.data(), program.size()),
                nullptr, nullptr, nullptr, nullptr, /*share_memory_arenas=*/true);
  auto methods = module.method_names();
  if (!methods.ok()) {
    return fail(std::string("loading ") + argv[1], methods.error());
  }
  const bool two_methods = methods->count("prefill") > 0 && methods->count("decode") > 0;
  Result<std::vector<float>> first = feed_prompt(module, two_methods, prompt);
  if (!first.ok()) {
    return fail("the prompt", first.error());
  }
  std::vector<float> row = std::move(*first);
  std::vector<int64_t> history = prompt;  // the repetition penalty's: the prompt and the reply
  std::vector<int64_t> tokens;
  for (uint64_t i = 0;; ++i) {
    int64_t token = -1;
    Error sampled = static_cast<Error>(
        kvd_sampler_sample(sampler, row.data(), row.size(), history.data(), history.size(), i, &token));
    if (sampled != Error::Ok) {
      return fail("kvd_sampler_sample", sampled);
    }
    tokens.push_back(token);
    history.push_back(token);
    int32_t stop = KVD_STOP_NONE;
    Error checked = static_cast<Error>(kvd_stop_checker_push(stops, token, nullptr, 0, &stop));
    if (checked != Error::Ok) {
      return fail("kvd_stop_checker_push", checked);
    }
    if (stop != KVD_STOP_NONE) {
      break;
    }
    const int64_t position = static_cast<int64_t>(prompt.size() + i);
    Result<std::vector<float>> next = step(module, two_methods ? "decode" : "forward", {token}, position);
    if (!next.ok()) {
      return fail("decode step " + std::to_string(i + 1), next.error());
    }
    row = std::move(*next);
  }
  std::printf("tokens:");
  for (int64_t t : tokens) {
    std::printf(" %lld", static_cast<long long>(t));
  }
  std::printf("\n");
  return 0;
}
