// troupe_bench_gpu: times troupe's GPT training step on one GPU (kernels/cuda GptDevice: Forward
// + ZeroGrad + Backward + Step, bf16 activations with fp32 master weights by default) on
// synthetic tokens, after warm-up, and prints tokens/s and MFU. bench/compare-gpu runs it beside
// PyTorch (bench/gpu/torch_gpt.py) on the same GPU, config, B and T.
//
//   troupe_bench_gpu [--size gpt2|20m|tiny] [--vocab V] [--b 8] [--t 1024] [--warmup 10]
//                    [--steps 50] [--device 0] [--seed 1] [--fp32] [--peak-tflops X]
//   troupe_bench_gpu --layout [--size ... --vocab V]
//       The parameter tensors (name and shape, one a line) and their total, without a device:
//       what bench/gpu/torch_gpt.py checks its model against.
//
// Model FLOPs per token (PaLM's appendix B estimate, as llm.c and nanoGPT use it):
//   6·N + 12·L·C·T, N = every parameter (the tied wte counted once: it is also the LM head's
//   matmul), L layers, width C, sequence length T (attention's QKᵀ and A·V, forward + backward,
//   the causal mask's skipped half not subtracted). MFU = flops/token · tokens/s / peak, the peak
//   being the device's dense bf16 tensor-core peak from its name (PeakBf16Tflops) or --peak-tflops.
// Each step is timed on the host clock: Step waits for the device's stream, so a step's time is
// all of its GPU work, plus the token upload and the loss read-back Forward does (what a user of
// GptDevice pays). The last line is machine-readable:
//   result: params=… tokens=… step_ms=… step_ms_min=… step_ms_max=… tokens_per_s=…
//           flops_per_token=… peak_tflops=… mfu_pct=…
// Exit status: 0 measured; 1 an error; 2 bad usage, an unknown device without --peak-tflops, or
// no usable GPU (the FailedPrecondition naming the CUDA error, e.g. cudaErrorInsufficientDriver,
// printed at once).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpt_device.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/config.h"
#include "troupe/model/optimizer.h"
#include "troupe/model/rng.h"

namespace troupe::bench {
namespace {

using model::GptConfig;
using model::cuda::GptDevice;

constexpr const char* kUsage =
    "usage: troupe_bench_gpu [--size gpt2|20m|tiny] [--vocab V] [--b 8] [--t 1024] [--warmup 10]\n"
    "                        [--steps 50] [--device 0] [--seed 1] [--fp32] [--peak-tflops X]\n"
    "       troupe_bench_gpu --layout [--size gpt2|20m|tiny] [--vocab V]\n";

struct Flags {
  std::string size = "gpt2";
  long vocab = 0;  // 0: the size's own (gpt2 50257, 20m 4096, tiny 512)
  long b = 8, t = 1024, warmup = 10, steps = 50, device = 0, seed = 1;
  bool fp32 = false, layout = false;
  double peak_tflops = 0;  // 0: from the device name
};

bool ParseNumber(const char* text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text, &end);
  return *text != '\0' && *end == '\0';
}

// False (after printing why) on anything that is not a known flag with a valid value.
bool ParseFlags(int argc, char** argv, Flags* f) {
  const std::map<std::string, long*> ints = {
      {"vocab", &f->vocab}, {"b", &f->b},           {"t", &f->t},      {"warmup", &f->warmup},
      {"steps", &f->steps}, {"device", &f->device}, {"seed", &f->seed}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string key = arg.rfind("--", 0) == 0 ? arg.substr(2) : "";
    if (key == "fp32" || key == "layout") {
      (key == "fp32" ? f->fp32 : f->layout) = true;
      continue;
    }
    const bool known = ints.count(key) || key == "size" || key == "peak-tflops";
    if (!known) {
      std::fprintf(stderr, "troupe_bench_gpu: unexpected argument '%s'\n%s", arg.c_str(), kUsage);
      return false;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "troupe_bench_gpu: --%s needs a value\n", key.c_str());
      return false;
    }
    const char* value = argv[++i];
    if (key == "size") {
      f->size = value;
      continue;
    }
    double number = 0;
    const bool integral = key != "peak-tflops";
    if (!ParseNumber(value, &number) || (integral && number != std::floor(number))) {
      std::fprintf(stderr, "troupe_bench_gpu: --%s: expected %s, got '%s'\n", key.c_str(),
                   integral ? "an integer" : "a number", value);
      return false;
    }
    if (integral) {
      *ints.at(key) = static_cast<long>(number);
    } else {
      f->peak_tflops = number;
    }
  }
  return true;
}

absl::StatusOr<GptConfig> ConfigFor(const Flags& f) {
  GptConfig config;
  if (f.size == "gpt2") {
    config = GptConfig::Gpt2Small();
    if (f.vocab > 0) config.vocab_size = static_cast<int32_t>(f.vocab);
  } else if (f.size == "20m") {
    config = GptConfig::Small20M(f.vocab > 0 ? static_cast<int32_t>(f.vocab) : 4096);
  } else if (f.size == "tiny") {
    config = GptConfig::Tiny(f.vocab > 0 ? static_cast<int32_t>(f.vocab) : 512);
  } else {
    return absl::InvalidArgumentError("--size: expected gpt2, 20m or tiny, got '" + f.size + "'");
  }
  TROUPE_RETURN_IF_ERROR(config.Validate());
  return config;
}

// Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from the vendor's data sheets; 0 when the
// device is not one of these (then --peak-tflops is needed). `name` is DeviceName()'s or
// torch.cuda.get_device_name()'s, e.g. "NVIDIA H100 80GB HBM3"; the first entry whose key it
// contains wins, so the variants come before the family.
double PeakBf16Tflops(const std::string& name) {
  static const std::vector<std::pair<std::string, double>> kPeaks = {
      {"H100 PCIe", 756}, {"H100 NVL", 835},   {"H200 NVL", 835},   {"GH200", 989}, {"H100", 989},
      {"H200", 989},      {"H800", 989},       {"B200", 2250},      {"A100", 312},  {"A800", 312},
      {"L40S", 362},      {"NVIDIA L4 ", 121}, {"NVIDIA A10 ", 125}};
  const std::string padded = name + " ";  // "NVIDIA L4" but not "NVIDIA L40S"
  for (const auto& [key, tflops] : kPeaks) {
    if (padded.find(key) != std::string::npos) return tflops;
  }
  return 0;
}

double FlopsPerToken(const GptConfig& c, int64_t num_params, int t) {
  return 6.0 * static_cast<double>(num_params) +
         12.0 * c.num_layers * static_cast<double>(c.width) * t;
}

int Layout(const GptConfig& config) {
  const model::ParamLayout layout(config);
  for (const model::ParamTensor& p : layout.tensors()) {
    std::printf("tensor %s", p.name.c_str());
    for (int64_t d : p.shape) std::printf(" %lld", static_cast<long long>(d));
    std::printf("\n");
  }
  std::printf("params=%lld\n", static_cast<long long>(layout.total_size()));
  return 0;
}

// A few batches of uniform random tokens (targets: the same sequences shifted by one), cycled
// through: the step's cost does not depend on the values.
struct Batch {
  std::vector<int32_t> tokens, targets;
};
std::vector<Batch> SyntheticBatches(int count, int b, int t, int32_t vocab, uint64_t seed) {
  std::vector<Batch> batches(count);
  for (int k = 0; k < count; ++k) {
    for (int r = 0; r < b; ++r) {
      std::vector<int32_t> seq(t + 1);
      for (int i = 0; i <= t; ++i) {
        seq[i] = static_cast<int32_t>(model::RandomBits(seed, model::RngPurpose::kTest,
                                                        static_cast<uint32_t>(k),
                                                        int64_t{r} * (t + 1) + i)[0] %
                                      static_cast<uint32_t>(vocab));
      }
      batches[k].tokens.insert(batches[k].tokens.end(), seq.begin(), seq.end() - 1);
      batches[k].targets.insert(batches[k].targets.end(), seq.begin() + 1, seq.end());
    }
  }
  return batches;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "troupe_bench_gpu: %s\n", s.ToString().c_str());
  return 1;
}

// False (after printing why) when B, T, the step counts or the peak are out of range.
bool CheckRun(const Flags& f, const GptConfig& config) {
  if (f.b <= 0 || f.t <= 0 || f.t > config.context_length || f.warmup < 0 || f.steps <= 0 ||
      f.peak_tflops < 0) {
    std::fprintf(stderr,
                 "troupe_bench_gpu: expected --b > 0, 0 < --t <= %d, --warmup >= 0, --steps > 0, "
                 "--peak-tflops >= 0\n",
                 config.context_length);
    return false;
  }
  return true;
}

// What is measured, and against which peak: the header's and the result line's fixed part.
struct Setup {
  GptConfig config;
  int b = 0, t = 0;
  bool bf16 = true;
  std::string device;
  double peak = 0;
  int64_t params = 0, tokens = 0;
  double flops_per_token = 0;
};

void PrintHeader(const Flags& f, const Setup& r) {
  std::printf(
      "troupe_bench_gpu: %s (%lld parameters: V=%d ctx=%d L=%d H=%d C=%d), B=%d T=%d (%lld "
      "tokens/step), %s, on %s\n"
      "  step: Forward + ZeroGrad + Backward + Step (global norm, clip at 1, AdamW), %ld warm-up "
      "+ %ld timed steps\n"
      "  model FLOPs/token = 6·N + 12·L·C·T = %.4g; peak %.0f TFLOP/s (dense bf16%s)\n",
      f.size.c_str(), static_cast<long long>(r.params), r.config.vocab_size,
      r.config.context_length, r.config.num_layers, r.config.num_heads, r.config.width, r.b, r.t,
      static_cast<long long>(r.tokens),
      r.bf16 ? "bf16 activations and gradients, fp32 master weights and AdamW" : "fp32",
      r.device.c_str(), f.warmup, f.steps, r.flops_per_token, r.peak,
      f.peak_tflops > 0 ? ", --peak-tflops" : ", from the device name");
  std::fflush(stdout);
}

struct StepTimes {
  std::vector<double> seconds;  // the timed steps', warm-up left out
  double first_loss = 0, last_loss = 0;
};

// Runs the warm-up and timed steps; 0, or 1 after printing the error or a non-finite step.
int TimeSteps(GptDevice& gpu, const Flags& f, const Setup& r, StepTimes* out) {
  const std::vector<Batch> batches =
      SyntheticBatches(4, r.b, r.t, r.config.vocab_size, static_cast<uint64_t>(f.seed));
  model::AdamWConfig adamw;  // β 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices, clip at 1
  model::LrSchedule schedule;
  schedule.max_lr = 3e-4f;
  schedule.min_lr = 3e-5f;
  schedule.warmup_steps = 10;
  schedule.total_steps = f.warmup + f.steps;
  const float loss_weight = 1.0f / static_cast<float>(r.tokens);

  for (int64_t step = 0; step < f.warmup + f.steps; ++step) {
    const Batch& batch = batches[step % batches.size()];
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<double> loss = gpu.Forward(batch.tokens.data(), batch.targets.data(), r.b, r.t);
    if (!loss.ok()) return Fail(loss.status());
    if (absl::Status s = gpu.ZeroGrad(); !s.ok()) return Fail(s);
    if (absl::Status s = gpu.Backward(loss_weight); !s.ok()) return Fail(s);
    absl::StatusOr<double> norm = gpu.Step(adamw, schedule, step);
    if (!norm.ok()) return Fail(norm.status());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!std::isfinite(*loss) || !std::isfinite(*norm)) {
      std::fprintf(stderr, "troupe_bench_gpu: step %lld: loss %g, gradient norm %g: not finite\n",
                   static_cast<long long>(step), *loss, *norm);
      return 1;
    }
    if (step == 0) out->first_loss = *loss;
    out->last_loss = *loss;
    if (step >= f.warmup) out->seconds.push_back(seconds);
  }
  return 0;
}

void PrintResult(const Setup& r, const StepTimes& times) {
  std::vector<double> sorted = times.seconds;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.size() % 2
                            ? sorted[sorted.size() / 2]
                            : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  const double tokens_per_s = static_cast<double>(r.tokens) / median;
  const double mfu_pct = 100.0 * r.flops_per_token * tokens_per_s / (r.peak * 1e12);
  std::printf(
      "  loss %.4f at the first step, %.4f at the last (uniform random tokens: ln V = %.4f)\n"
      "  step %.3f ms median (min %.3f, max %.3f over %zu steps): %.0f tokens/s, %.1f TFLOP/s, "
      "MFU %.2f%%\n",
      times.first_loss, times.last_loss, std::log(static_cast<double>(r.config.vocab_size)),
      median * 1e3, sorted.front() * 1e3, sorted.back() * 1e3, sorted.size(), tokens_per_s,
      r.flops_per_token * tokens_per_s / 1e12, mfu_pct);
  std::printf(
      "result: params=%lld tokens=%lld step_ms=%.4f step_ms_min=%.4f step_ms_max=%.4f "
      "tokens_per_s=%.1f flops_per_token=%.6g peak_tflops=%.1f mfu_pct=%.3f\n",
      static_cast<long long>(r.params), static_cast<long long>(r.tokens), median * 1e3,
      sorted.front() * 1e3, sorted.back() * 1e3, tokens_per_s, r.flops_per_token, r.peak, mfu_pct);
}

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  absl::StatusOr<GptConfig> config = ConfigFor(f);
  if (!config.ok()) {
    std::fprintf(stderr, "troupe_bench_gpu: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (f.layout) return Layout(*config);
  if (!CheckRun(f, *config)) return 2;
  Setup r;
  r.config = *config;
  r.b = static_cast<int>(f.b);
  r.t = static_cast<int>(f.t);
  r.bf16 = !f.fp32;

  // The device first: without a usable GPU, exit 2 at once with the CUDA runtime's reason.
  absl::StatusOr<std::unique_ptr<GptDevice>> gpu =
      GptDevice::Create(*config, static_cast<int>(f.device), r.bf16);
  if (!gpu.ok()) {
    std::fprintf(stderr, "troupe_bench_gpu: %s\n", gpu.status().ToString().c_str());
    return gpu.status().code() == absl::StatusCode::kFailedPrecondition ? 2 : 1;
  }
  r.device = (*gpu)->DeviceName();
  r.peak = f.peak_tflops > 0 ? f.peak_tflops : PeakBf16Tflops(r.device);
  if (r.peak <= 0) {
    std::fprintf(stderr,
                 "troupe_bench_gpu: no dense bf16 peak known for '%s': pass --peak-tflops X (the "
                 "data sheet's dense bf16 tensor-core TFLOP/s)\n",
                 r.device.c_str());
    return 2;
  }
  if (absl::Status s = (*gpu)->InitParams(static_cast<uint64_t>(f.seed)); !s.ok()) return Fail(s);

  r.params = (*gpu)->num_params();
  r.tokens = int64_t{r.b} * r.t;
  r.flops_per_token = FlopsPerToken(*config, r.params, r.t);
  PrintHeader(f, r);
  StepTimes times;
  if (int rc = TimeSteps(**gpu, f, r, &times); rc != 0) return rc;
  PrintResult(r, times);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::Main(argc, argv); }
