// troupe_model_bench: the troupe side of bench/compare-torch-cpu.
//
//   troupe_model_bench dump --out DIR [config flags]
//       One forward + backward on a seeded random batch; writes DIR/meta.json (config, loss,
//       tensor layout), params.f32, grads.f32, logits.f32, tokens.i32, targets.i32.
//   troupe_model_bench time --steps N [config flags]
//       One untimed warm-up step, then N full training steps (forward, backward, grad-norm clip,
//       AdamW); prints one line `time: step_s=<median> min_s=… max_s=… tokens_per_s=… threads=…
//       cpu_s=… gemm=…`.
// Config flags: --vocab --context --layers --heads --width --batch --seq --seed --threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "troupe/kernels/matmul.h"
#include "troupe/kernels/parallel.h"
#include "troupe/model/gpt.h"
#include "troupe/model/optimizer.h"
#include "troupe/model/rng.h"

namespace troupe::tools {
namespace {

using model::Gpt;
using model::GptConfig;

struct Flags {
  std::map<std::string, std::string> values;
  long Int(const std::string& name, long fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : std::strtol(it->second.c_str(), nullptr, 10);
  }
  std::string Str(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? "" : it->second;
  }
};

template <typename T>
bool WriteRaw(const std::string& path, const T* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), n * sizeof(T));
  return static_cast<bool>(out);
}

std::vector<int32_t> RandomTokens(int64_t n, int32_t vocab, uint64_t seed, uint32_t stream) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<int32_t>(model::RandomBits(seed, model::RngPurpose::kTest, stream, i)[0] %
                                vocab);
  }
  return v;
}

int Dump(Gpt& gpt, int b, int t, uint64_t seed, const std::string& out) {
  const GptConfig& c = gpt.config();
  const auto tokens = RandomTokens(int64_t{b} * t, c.vocab_size, seed, 1);
  const auto targets = RandomTokens(int64_t{b} * t, c.vocab_size, seed, 2);
  absl::StatusOr<double> loss = gpt.Forward(tokens.data(), targets.data(), b, t);
  if (!loss.ok()) {
    std::fprintf(stderr, "%s\n", loss.status().ToString().c_str());
    return 1;
  }
  gpt.ZeroGrad();
  if (!gpt.Backward(1.0f / (b * t)).ok()) return 1;
  bool ok = WriteRaw(out + "/params.f32", gpt.params(), gpt.num_params()) &&
            WriteRaw(out + "/grads.f32", gpt.grads(), gpt.num_params()) &&
            WriteRaw(out + "/logits.f32", gpt.logits(), int64_t{b} * t * c.vocab_size) &&
            WriteRaw(out + "/tokens.i32", tokens.data(), tokens.size()) &&
            WriteRaw(out + "/targets.i32", targets.data(), targets.size());
  std::ofstream meta(out + "/meta.json");
  meta << "{\"vocab_size\": " << c.vocab_size << ", \"context_length\": " << c.context_length
       << ", \"num_layers\": " << c.num_layers << ", \"num_heads\": " << c.num_heads
       << ", \"width\": " << c.width << ", \"batch\": " << b << ", \"seq\": " << t
       << ", \"num_params\": " << gpt.num_params() << ", \"gemm\": \"" << kernels::GemmBackend()
       << "\"";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", *loss);
  meta << ", \"loss\": " << buf << ", \"tensors\": [";
  const auto& tensors = gpt.layout().tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    meta << (i ? ", " : "") << "{\"name\": \"" << tensors[i].name
         << "\", \"offset\": " << tensors[i].offset << ", \"shape\": [";
    for (size_t d = 0; d < tensors[i].shape.size(); ++d)
      meta << (d ? ", " : "") << tensors[i].shape[d];
    meta << "]}";
  }
  meta << "]}\n";
  ok = ok && static_cast<bool>(meta);
  std::printf("dump: loss=%.9f params=%lld dir=%s\n", *loss,
              static_cast<long long>(gpt.num_params()), out.c_str());
  return ok ? 0 : 1;
}

int Time(Gpt& gpt, int b, int t, uint64_t seed, int steps) {
  const GptConfig& c = gpt.config();
  const auto tokens = RandomTokens(int64_t{b} * t, c.vocab_size, seed, 1);
  const auto targets = RandomTokens(int64_t{b} * t, c.vocab_size, seed, 2);
  std::vector<float> m(gpt.num_params(), 0.0f), v(gpt.num_params(), 0.0f);
  model::AdamWConfig adamw;
  model::LrSchedule schedule{3e-4f, 3e-5f, 0, 1000};
  std::vector<double> times;
  std::clock_t cpu_start = std::clock();
  // Step 0 is a warm-up (first touch of activations and gradients), as the torch side's is.
  for (int s = 0; s <= steps; ++s) {
    if (s == 1) cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    if (!gpt.Forward(tokens.data(), targets.data(), b, t).ok()) return 1;
    gpt.ZeroGrad();
    if (!gpt.Backward(1.0f / (b * t)).ok()) return 1;
    const double norm = model::GradNorm(gpt.grads(), gpt.num_params());
    const auto scalars = model::StepScalars(adamw, schedule, s, norm);
    model::AdamWUpdateRange(gpt.layout(), 0, gpt.num_params(), gpt.params(), gpt.grads(), m.data(),
                            v.data(), adamw, scalars);
    if (s == 0) continue;
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double cpu_per_step =
      static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / std::max(steps, 1);
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  // The median: of an even count, the mean of the middle two (torch's side takes
  // statistics.median, which does the same; the upper one alone read the slower of 2 steps).
  const size_t mid = sorted.size() / 2;
  const double median = sorted.size() % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  std::printf(
      "time: step_s=%.6f min_s=%.6f max_s=%.6f tokens_per_s=%.2f threads=%d cpu_s=%.6f gemm=%s\n",
      median, sorted.front(), sorted.back(), b * t / median, kernels::NumThreads(), cpu_per_step,
      kernels::GemmBackend().c_str());
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: troupe_model_bench dump|time [--flag value]...\n");
    return 2;
  }
  const std::string mode = argv[1];
  Flags f;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) {
      std::fprintf(stderr, "unexpected argument '%s'\n", argv[i]);
      return 2;
    }
    f.values[key.substr(2)] = argv[i + 1];
  }
  GptConfig config{
      static_cast<int32_t>(f.Int("vocab", 512)), static_cast<int32_t>(f.Int("context", 64)),
      static_cast<int32_t>(f.Int("layers", 2)), static_cast<int32_t>(f.Int("heads", 4)),
      static_cast<int32_t>(f.Int("width", 64))};
  absl::StatusOr<Gpt> gpt = Gpt::Create(config);
  if (!gpt.ok()) {
    std::fprintf(stderr, "%s\n", gpt.status().ToString().c_str());
    return 2;
  }
  kernels::SetNumThreads(static_cast<int>(f.Int("threads", 1)));
  const uint64_t seed = static_cast<uint64_t>(f.Int("seed", 1));
  gpt->InitParams(seed);
  const int b = static_cast<int>(f.Int("batch", 4));
  const int t = static_cast<int>(f.Int("seq", config.context_length));
  if (mode == "dump") return Dump(*gpt, b, t, seed, f.Str("out").empty() ? "." : f.Str("out"));
  if (mode == "time")
    return Time(*gpt, b, t, seed, static_cast<int>(std::max(1L, f.Int("steps", 3))));
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace troupe::tools

int main(int argc, char** argv) { return troupe::tools::Main(argc, argv); }
