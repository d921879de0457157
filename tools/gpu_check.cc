// troupe_gpu_check: the GPT's GPU training step (kernels/cuda GptDevice) against the CPU model
// (model::GptModel), on a machine with a GPU. scripts/gpu-check runs it; so does ToolsGpuCheck.
//
//   troupe_gpu_check gpt2 [--b 2] [--t 128] [--seed 1] [--double]
//       GPT-2 124M, fp32: one forward + backward from the same random init (the CPU model's
//       InitParams, copied over) on the same random tokens; compares the loss and every parameter
//       tensor's gradient, norm-wise, and prints a table. --double adds each side's error against
//       the double CPU model, to tell which side is off when they disagree.
//   troupe_gpu_check train20m [--steps 200] [--b 4] [--t 128] [--seed 1] [--bf16]
//                             [--cpu-losses FILE]
//       The 20M config on a synthetic noisy-bigram stream (fixed seed, the same batches both
//       sides), trained side by side: GPU (fp32, or bf16 activations with fp32 master weights)
//       and CPU (GptModel<float> + GradNorm + AdamWUpdateRange, model::Trainer's step for one
//       microbatch). Prints every 10th step; checks the two losses at every step.
//       --cpu-losses FILE: the CPU side's losses and gradient norms read from FILE (written by
//       --write-cpu-losses with the same --steps/--b/--t/--seed/--bf16, else exit 2 saying what
//       differs) instead of computed beside the GPU: the CPU side is independent of the GPU's
//       (it starts from the same initial weights and trains on its own), so the two are the same
//       check, without the CPU's minutes on the GPU machine (the GPU bundle, scripts/gpu-bundle).
//   troupe_gpu_check train20m [--steps 200] [--b 4] [--t 128] [--seed 1] [--bf16]
//                             --write-cpu-losses FILE
//       The CPU side only, no GPU needed: writes each step's loss and gradient norm to FILE.
// Common flags: --device N (CUDA ordinal, 0), --threads N (CPU model threads, all cores). The
// tolerances (below) are set for the default sizes.
// Exit status: 0 all within tolerance (or the losses written); 1 a check failed or an error; 2 bad
// usage (a --cpu-losses file that does not fit included), or no usable GPU (the
// FailedPrecondition naming the CUDA error, printed at once, before any CPU work).
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpt_device.h"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/parallel.h"
#include "troupe/model/config.h"
#include "troupe/model/gpt.h"
#include "troupe/model/optimizer.h"
#include "troupe/model/rng.h"

namespace troupe::tools {
namespace {

using model::GptConfig;
using model::cuda::GptDevice;

// --- Tolerances ---------------------------------------------------------------------------------
// gpt2, fp32 both sides. Neither side is exact: each GEMM's fp32 dot products are rounded in a
// different order (cuBLASLt's tiles and split-K against the CPU's blocked loops; COMPUTE_32F, no
// TF32), and attention's softmax is online (flash-style) on the GPU, two-pass on the CPU. The CPU
// float model's own error against the double model at this size (measured, B=1, T=64 and B=2,
// T=128): loss ≤ 5e-9, each tensor's gradient 0.5e-6 to 1.4e-6 norm-wise. A GPU path of the same
// fp32 quality then differs from the CPU by a few 1e-6; 1e-4 per tensor leaves a factor of 30 (for
// the GPU's reductions, blocked differently) and still fails a wrong kernel, whose errors are O(1),
// or O(1e-3) for a stray bf16 rounding or a term lost in a sum. The loss, a mean of B·T terms
// rounded once each, gets 1e-5.
constexpr double kGpt2LossTolerance = 1e-5;
constexpr double kGpt2GradTolerance = 1e-4;
// train20m, |loss_gpu − loss_cpu| / loss_cpu at every step, for the defaults (B=4, T=128, lr
// 3e-4): a regime where training is stable, the loss falling from 8.4 to 4.8 over 200 steps.
// (With a hotter one, e.g. B=2, T=64, lr 1e-3, the loss stalls near ln 4096 and two fp32 runs that
// differ only in rounding part by 1e-3 to 2e-2 within 40 steps: chaos, which no tolerance
// survives; hence no --lr flag.)
// fp32: measured on the CPU at the defaults, the float model against one computing forward and
// backward in double (the same kind of difference as GPU vs CPU, fp32 rounding in other places),
// the losses of 200 steps stay within 2.2e-8 relative. 1e-4 leaves a factor of thousands for
// the GPU's other rounding order; a difference in substance (a kernel or an optimizer step that
// computes something else) is not rounding-sized.
// bf16: the GPU rounds every stored activation and gradient to bf16 (2^-9 relative each); the
// CPU reference computes in fp32 from the same bf16-rounded weights, with fp32 master weights and
// AdamW, so only those roundings differ. The same launch sequence through the SIMT layer,
// against that reference: 200 steps of the Tiny config (B=2, T=32, lr 3e-4) within 8.6e-5
// relative; the 20M config's first steps (B=1, T=64) within 4.5e-5. Sharper logits late in training
// make a bf16 logit's error larger (2^-9 · |logit|), averaged over B·T tokens: ≲ 1e-3 expected.
// 1e-2 leaves 10× over that, 100× over what was measured, and fails a broken bf16 path (a loss that
// stalls, as with a stale bf16 weight copy, is 10% off within tens of steps).
constexpr double kTrainFp32Tolerance = 1e-4;
constexpr double kTrainBf16Tolerance = 1e-2;

// --- Flags --------------------------------------------------------------------------------------
struct Flags {
  std::map<std::string, std::string> values;
  bool bf16 = false;
  bool with_double = false;
  long Int(const std::string& name, long fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : std::strtol(it->second.c_str(), nullptr, 10);
  }
  std::string String(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? "" : it->second;
  }
};

// Flags whose value is a path, not an integer.
bool IsPathFlag(const std::string& key) { return key == "cpu-losses" || key == "write-cpu-losses"; }

constexpr const char* kUsage =
    "usage: troupe_gpu_check gpt2 [--b 2 --t 128 --seed 1 --double] [--device N --threads N]\n"
    "       troupe_gpu_check train20m [--steps 200 --b 4 --t 128 --seed 1 --bf16] "
    "[--cpu-losses FILE] [--device N --threads N]\n"
    "       troupe_gpu_check train20m [--steps 200 --b 4 --t 128 --seed 1 --bf16] "
    "--write-cpu-losses FILE [--threads N]   (CPU only)\n";

// Accepts the mode's own flags only; false (after printing why) on anything else.
bool ParseFlags(int argc, char** argv, const std::vector<std::string>& known, Flags* f) {
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string key = arg.rfind("--", 0) == 0 ? arg.substr(2) : "";
    if (key.empty() || std::find(known.begin(), known.end(), key) == known.end()) {
      std::fprintf(stderr, "troupe_gpu_check: unexpected argument '%s'\n%s", arg.c_str(), kUsage);
      return false;
    }
    if (key == "bf16" || key == "double") {  // switches
      (key == "bf16" ? f->bf16 : f->with_double) = true;
      continue;
    }
    if (IsPathFlag(key)) {
      if (i + 1 >= argc || *argv[i + 1] == '\0') {
        std::fprintf(stderr, "troupe_gpu_check: --%s: expected a file name\n", key.c_str());
        return false;
      }
      f->values[key] = argv[++i];
      continue;
    }
    char* end = nullptr;
    if (i + 1 < argc) std::strtol(argv[i + 1], &end, 10);
    if (i + 1 >= argc || *argv[i + 1] == '\0' || *end != '\0') {
      std::fprintf(stderr, "troupe_gpu_check: --%s: expected an integer, got '%s'\n", key.c_str(),
                   i + 1 < argc ? argv[i + 1] : "");
      return false;
    }
    f->values[key] = argv[++i];
  }
  return true;
}

// The device first: without a usable GPU, exit 2 at once with the reason.
absl::StatusOr<std::unique_ptr<GptDevice>> OpenDevice(const char* mode, const GptConfig& config,
                                                      int ordinal, bool bf16, int* exit_code) {
  absl::StatusOr<std::unique_ptr<GptDevice>> gpu = GptDevice::Create(config, ordinal, bf16);
  if (!gpu.ok()) {
    std::fprintf(stderr, "troupe_gpu_check %s: %s\n", mode, gpu.status().ToString().c_str());
    *exit_code = gpu.status().code() == absl::StatusCode::kFailedPrecondition ? 2 : 1;
  }
  return gpu;
}

int Fail(const char* mode, const absl::Status& s) {
  std::fprintf(stderr, "troupe_gpu_check %s: %s\n", mode, s.ToString().c_str());
  return 1;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// ‖got − ref‖ / ‖ref‖ over one tensor (‖got − ref‖ where ref is all zero).
template <typename A, typename B>
double TensorRelErr(const A* got, const B* ref, const model::ParamTensor& t) {
  double num = 0, den = 0;
  for (int64_t i = t.offset; i < t.offset + t.size; ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double RelDiff(double got, double ref) { return std::fabs(got - ref) / std::fabs(ref); }

// Tokens [b, t] and their targets.
struct Batch {
  int b = 0, t = 0;
  std::vector<int32_t> tokens, targets;
  // 1/(B·T): the gradient of the mean loss.
  template <typename T>
  T LossWeight() const {
    return T{1} / static_cast<T>(int64_t{b} * t);
  }
};

// Forward and backward of `batch` on the GPU or a CPU model: the loss; the gradients (of
// loss_weight · Σ losses) in the model.
template <typename Model, typename T>
absl::StatusOr<double> ForwardBackward(Model& m, const Batch& batch, T loss_weight) {
  absl::StatusOr<double> loss =
      m.Forward(batch.tokens.data(), batch.targets.data(), batch.b, batch.t);
  if (!loss.ok()) return loss;
  if constexpr (std::is_same_v<Model, GptDevice>) {
    TROUPE_RETURN_IF_ERROR(m.ZeroGrad());
  } else {
    m.ZeroGrad();
  }
  TROUPE_RETURN_IF_ERROR(m.Backward(loss_weight));
  return loss;
}

std::vector<int32_t> RandomTokens(int64_t n, int32_t vocab, uint64_t seed, uint32_t stream) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<int32_t>(model::RandomBits(seed, model::RngPurpose::kTest, stream, i)[0] %
                                static_cast<uint32_t>(vocab));
  }
  return v;
}

// --- gpt2 ---------------------------------------------------------------------------------------
// The double model's loss and gradients, from the float model's weights.
struct Exact {
  double loss = 0;
  std::vector<double> grads;
};
absl::StatusOr<Exact> DoubleReference(const model::GptModel<float>& cpu, const Batch& batch) {
  TROUPE_ASSIGN_OR_RETURN(model::GptModel<double> dbl,
                          model::GptModel<double>::Create(cpu.config()));
  const int64_t n = cpu.num_params();
  std::copy(cpu.params(), cpu.params() + n, dbl.params());
  TROUPE_ASSIGN_OR_RETURN(double loss, ForwardBackward(dbl, batch, batch.LossWeight<double>()));
  return Exact{loss, std::vector<double>(dbl.grads(), dbl.grads() + n)};
}

// The table (the loss, then a row per tensor: the GPU's gradient against the CPU's, and with
// `exact` each against the double model's) and the verdict; true when all are within tolerance.
bool ReportGpt2(double gpu_loss, const std::vector<float>& gpu_grads, double cpu_loss,
                const model::GptModel<float>& cpu, const Exact* exact) {
  const double loss_err = RelDiff(gpu_loss, cpu_loss);
  bool ok = loss_err <= kGpt2LossTolerance;
  std::printf("\n%-26s %11s %12s %10s", "tensor", "elements", "|grad| CPU", "GPU vs CPU");
  if (exact) std::printf(" %10s %10s", "GPU vs f64", "CPU vs f64");
  std::printf("\n%-26s %11s %12.6f %10.2e", "loss", "1", cpu_loss, loss_err);
  if (exact) {
    std::printf(" %10.2e %10.2e", RelDiff(gpu_loss, exact->loss), RelDiff(cpu_loss, exact->loss));
  }
  std::printf("%s\n", loss_err <= kGpt2LossTolerance ? "" : "  FAIL");
  double worst = 0;
  std::string worst_name;
  int failed = 0;
  for (const model::ParamTensor& p : cpu.layout().tensors()) {
    const double err = TensorRelErr(gpu_grads.data(), cpu.grads(), p);
    double norm = 0;
    for (int64_t i = p.offset; i < p.offset + p.size; ++i) {
      norm += static_cast<double>(cpu.grads()[i]) * cpu.grads()[i];
    }
    std::printf("%-26s %11lld %12.4e %10.2e", p.name.c_str(), static_cast<long long>(p.size),
                std::sqrt(norm), err);
    if (exact) {
      std::printf(" %10.2e %10.2e", TensorRelErr(gpu_grads.data(), exact->grads.data(), p),
                  TensorRelErr(cpu.grads(), exact->grads.data(), p));
    }
    const bool tensor_ok = err <= kGpt2GradTolerance;  // also false for NaN
    std::printf("%s\n", tensor_ok ? "" : "  FAIL");
    failed += !tensor_ok;
    if (!(err <= worst)) worst = err, worst_name = p.name;
  }
  ok = ok && failed == 0;
  std::printf(
      "\ngpt2: loss GPU %.9f CPU %.9f (rel %.2e, tolerance %.0e); worst tensor gradient %.2e "
      "(%s), tolerance %.0e, %d of %zu tensors over: %s\n",
      gpu_loss, cpu_loss, loss_err, kGpt2LossTolerance, worst, worst_name.c_str(),
      kGpt2GradTolerance, failed, cpu.layout().tensors().size(), ok ? "PASS" : "FAIL");
  return ok;
}

int Gpt2(const Flags& f) {
  const int b = static_cast<int>(f.Int("b", 2)), t = static_cast<int>(f.Int("t", 128));
  const uint64_t seed = static_cast<uint64_t>(f.Int("seed", 1));
  const GptConfig config = GptConfig::Gpt2Small();
  int exit_code = 0;
  auto gpu = OpenDevice("gpt2", config, static_cast<int>(f.Int("device", 0)), false, &exit_code);
  if (!gpu.ok()) return exit_code;
  if (b <= 0 || t <= 0 || t > config.context_length) {
    std::fprintf(stderr, "troupe_gpu_check gpt2: expected --b > 0 and 0 < --t <= %d\n",
                 config.context_length);
    return 2;
  }
  absl::StatusOr<model::GptModel<float>> cpu = model::GptModel<float>::Create(config);
  if (!cpu.ok()) return Fail("gpt2", cpu.status());
  cpu->InitParams(seed);
  const int64_t n = cpu->num_params(), bt = int64_t{b} * t;
  const Batch batch{b, t, RandomTokens(bt, config.vocab_size, seed, 1),
                    RandomTokens(bt, config.vocab_size, seed, 2)};
  std::printf("gpt2: GPT-2 124M (%lld parameters), B=%d T=%d seed=%llu, fp32, on %s\n",
              static_cast<long long>(n), b, t, static_cast<unsigned long long>(seed),
              (*gpu)->DeviceName().c_str());

  // GPU: the CPU model's initial weights, copied in.
  auto start = std::chrono::steady_clock::now();
  if (absl::Status s = (*gpu)->SetParams(cpu->params()); !s.ok()) return Fail("gpt2", s);
  absl::StatusOr<double> gpu_loss = ForwardBackward(**gpu, batch, batch.LossWeight<float>());
  if (!gpu_loss.ok()) return Fail("gpt2", gpu_loss.status());
  std::vector<float> gpu_grads(n);
  if (absl::Status s = (*gpu)->GetGrads(gpu_grads.data()); !s.ok()) return Fail("gpt2", s);
  const double gpu_seconds = Seconds(start);

  start = std::chrono::steady_clock::now();
  absl::StatusOr<double> cpu_loss = ForwardBackward(*cpu, batch, batch.LossWeight<float>());
  if (!cpu_loss.ok()) return Fail("gpt2", cpu_loss.status());
  const double cpu_seconds = Seconds(start);
  std::printf(
      "forward + backward: GPU %.2f s (first call: plans, allocation), CPU %.2f s (%d "
      "threads)\n",
      gpu_seconds, cpu_seconds, kernels::NumThreads());

  // Optionally, both against the double model, from the same (float) weights.
  const absl::StatusOr<Exact> exact = f.with_double ? DoubleReference(*cpu, batch) : Exact{};
  if (!exact.ok()) return Fail("gpt2", exact.status());
  const Exact* with_double = f.with_double ? &*exact : nullptr;
  return ReportGpt2(*gpu_loss, gpu_grads, *cpu_loss, *cpu, with_double) ? 0 : 1;
}

// --- train20m -----------------------------------------------------------------------------------

// A learnable stream: each sequence starts at a random token; each next token is Next(previous)
// with probability 3/4, else uniform: ~2.6 nats per token once learnt, against ln 4096 = 8.3 for
// uniform tokens. The loss falls steadily (8.4 to 4.8 over 200 steps at the defaults), so the two
// sides are compared along a learning curve, not a flat one. Batch `step`: tokens [b, t] and
// targets (the same sequences shifted by one).
Batch SyntheticBatch(int64_t step, int b, int t, int32_t vocab, uint64_t seed) {
  auto next = [vocab](int64_t x) { return static_cast<int32_t>((x * 1103 + 17) % vocab); };
  Batch batch{b, t, {}, {}};
  std::vector<int32_t> seq(t + 1);
  for (int r = 0; r < b; ++r) {
    for (int i = 0; i <= t; ++i) {
      const auto bits = model::RandomBits(seed, model::RngPurpose::kTest,
                                          static_cast<uint32_t>(step), int64_t{r} * (t + 1) + i);
      const int32_t uniform = static_cast<int32_t>(bits[1] % static_cast<uint32_t>(vocab));
      seq[i] = i == 0 || bits[0] % 4 == 0 ? uniform : next(seq[i - 1]);
    }
    batch.tokens.insert(batch.tokens.end(), seq.begin(), seq.end() - 1);
    batch.targets.insert(batch.targets.end(), seq.begin() + 1, seq.end());
  }
  return batch;
}

// float → bf16 → float: the rounding the GPU's bf16 weight copy makes (CUDA's own conversion,
// which compiles and runs under the host compiler).
float RoundToBf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// The run's settings, shared by both sides and recorded in a --write-cpu-losses file.
struct Train20mRun {
  int steps = 200, b = 4, t = 128;
  uint64_t seed = 1;
  bool bf16 = false;
  int64_t params = 0;

  // The header line of a losses file: these settings, which a reader must match.
  std::string Header() const {
    return "train20m-cpu-losses steps=" + std::to_string(steps) + " b=" + std::to_string(b) +
           " t=" + std::to_string(t) + " seed=" + std::to_string(seed) +
           " bf16=" + std::to_string(bf16 ? 1 : 0) + " params=" + std::to_string(params);
  }
};

// A training step's loss and gradient norm.
struct StepResult {
  double loss = 0, norm = 0;
};

// The CPU reference's loss and gradient norm at each step.
using CpuLosses = std::vector<StepResult>;

constexpr char kLossesComment[] =
    "# troupe_gpu_check train20m: the CPU reference's loss and gradient norm at each step "
    "(written by --write-cpu-losses, read by --cpu-losses)";

absl::Status WriteCpuLosses(const std::string& path, const Train20mRun& run,
                            const CpuLosses& losses) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kLossesComment << "\n" << run.Header() << "\n";
    char line[96];
    for (size_t i = 0; i < losses.size(); ++i) {
      std::snprintf(line, sizeof(line), "%zu %.17g %.17g\n", i, losses[i].loss, losses[i].norm);
      out << line;
    }
    out.flush();
    if (!out) return absl::UnavailableError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError("cannot rename " + tmp + " to " + path);
  }
  return absl::OkStatus();
}

// Reads a --write-cpu-losses file for `run`; InvalidArgument naming what differs, or what is
// wrong with the file.
absl::StatusOr<CpuLosses> ReadCpuLosses(const std::string& path, const Train20mRun& run) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("--cpu-losses " + path + ": cannot open it");
  std::string line, header;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') {
      header = line;
      break;
    }
  }
  const std::string rewrite =
      " (write it for this run: troupe_gpu_check train20m --steps " + std::to_string(run.steps) +
      " --b " + std::to_string(run.b) + " --t " + std::to_string(run.t) + " --seed " +
      std::to_string(run.seed) + (run.bf16 ? " --bf16" : "") + " --write-cpu-losses " + path + ")";
  if (header.rfind("train20m-cpu-losses ", 0) != 0) {
    return absl::InvalidArgumentError("--cpu-losses " + path +
                                      ": not a train20m CPU losses file (no "
                                      "'train20m-cpu-losses' header line)" +
                                      rewrite);
  }
  if (header != run.Header()) {
    return absl::InvalidArgumentError("--cpu-losses " + path + ": written for '" + header +
                                      "', this run is '" + run.Header() + "'" + rewrite);
  }
  CpuLosses losses;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    long long step = -1;
    double loss = 0, norm = 0;
    std::string rest;
    if (!(fields >> step >> loss >> norm) || (fields >> rest) ||
        step != static_cast<long long>(losses.size()) || !std::isfinite(loss) ||
        !std::isfinite(norm)) {
      return absl::InvalidArgumentError(
          "--cpu-losses " + path + ": expected 'STEP LOSS NORM' for step " +
          std::to_string(losses.size()) + ", got '" + line + "'" + rewrite);
    }
    losses.push_back({loss, norm});
  }
  if (losses.size() != static_cast<size_t>(run.steps)) {
    return absl::InvalidArgumentError("--cpu-losses " + path + ": " +
                                      std::to_string(losses.size()) + " steps, expected " +
                                      std::to_string(run.steps) + " (truncated?)" + rewrite);
  }
  return losses;
}

// What the train20m modes share: the run, its optimizer and the CPU model (its initial weights).
struct Train20mSetup {
  Train20mRun run;
  GptConfig config;
  model::AdamWConfig adamw;  // β 0.9 / 0.95, clip at 1, weight decay 0.1 on matrices
  model::LrSchedule schedule;
  model::GptModel<float>* cpu = nullptr;
};

absl::StatusOr<StepResult> GpuStep(GptDevice& gpu, const Train20mSetup& s, const Batch& batch,
                                   int64_t step) {
  TROUPE_ASSIGN_OR_RETURN(double loss, ForwardBackward(gpu, batch, batch.LossWeight<float>()));
  TROUPE_ASSIGN_OR_RETURN(double norm, gpu.Step(s.adamw, s.schedule, step));
  return StepResult{loss, norm};
}

// The CPU side: GptModel<float> + GradNorm + AdamWUpdateRange, model::Trainer's step for one
// microbatch. Its fp32 master weights are the model's own buffer in fp32; with bf16, a separate
// buffer, and the model computes with its bf16 rounding, as the GPU's bf16 weight copy.
class CpuReference {
 public:
  explicit CpuReference(const Train20mSetup& s) : s_(s), cpu_(*s.cpu), n_(cpu_.num_params()) {
    if (s.run.bf16) master_.assign(cpu_.params(), cpu_.params() + n_);
    m_.assign(n_, 0.0f), v_.assign(n_, 0.0f);
  }

  absl::StatusOr<StepResult> Step(const Batch& batch, int64_t step) {
    if (s_.run.bf16) {
      for (int64_t i = 0; i < n_; ++i) cpu_.params()[i] = RoundToBf16(master_[i]);
    }
    TROUPE_ASSIGN_OR_RETURN(double loss, ForwardBackward(cpu_, batch, batch.LossWeight<float>()));
    const double norm = model::GradNorm(cpu_.grads(), n_);
    float* master = s_.run.bf16 ? master_.data() : cpu_.params();
    model::AdamWUpdateRange(cpu_.layout(), 0, n_, master, cpu_.grads(), m_.data(), v_.data(),
                            s_.adamw, model::StepScalars(s_.adamw, s_.schedule, step, norm));
    return StepResult{loss, norm};
  }

 private:
  const Train20mSetup& s_;
  model::GptModel<float>& cpu_;
  const int64_t n_;
  std::vector<float> master_, m_, v_;
};

// --write-cpu-losses: the CPU side alone, each step's loss and gradient norm into `path`.
int WriteCpuLossesMode(const Train20mSetup& s, const std::string& cpu_how,
                       const std::string& path) {
  const Train20mRun& run = s.run;
  std::printf(
      "train20m --write-cpu-losses: %lld parameters, B=%d T=%d, %d steps, lr %.0e (warm-up "
      "%lld), seed %llu, the CPU side only (for a GPU run %s): %s, into %s\n",
      static_cast<long long>(run.params), run.b, run.t, run.steps, s.schedule.max_lr,
      static_cast<long long>(s.schedule.warmup_steps), static_cast<unsigned long long>(run.seed),
      run.bf16 ? "with --bf16" : "in fp32", cpu_how.c_str(), path.c_str());
  std::printf("%6s %12s %12s\n", "step", "loss CPU", "norm CPU");
  CpuReference reference(s);
  CpuLosses written;
  double cpu_seconds = 0;
  for (int64_t step = 0; step < run.steps; ++step) {
    const Batch batch = SyntheticBatch(step, run.b, run.t, s.config.vocab_size, run.seed);
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepResult> cpu = reference.Step(batch, step);
    if (!cpu.ok()) return Fail("train20m", cpu.status());
    cpu_seconds += Seconds(start);
    written.push_back(*cpu);
    if (step % 10 == 0 || step == run.steps - 1) {
      std::printf("%6lld %12.6f %12.4e\n", static_cast<long long>(step), cpu->loss, cpu->norm);
      std::fflush(stdout);
    }
  }
  if (absl::Status st = WriteCpuLosses(path, run, written); !st.ok()) return Fail("train20m", st);
  std::printf("\ntrain20m --write-cpu-losses (%s): %d steps written to %s; CPU %.3f s/step\n",
              run.bf16 ? "bf16" : "fp32", run.steps, path.c_str(), cpu_seconds / run.steps);
  return 0;
}

// The steps whose losses differ by more than the tolerance, and the worst difference.
struct LossAgreement {
  double worst = 0;
  int64_t worst_step = 0, over = 0, first_over = -1;
  // Whether `diff`, step's relative difference, is within `tolerance` (false for NaN).
  bool Add(int64_t step, double diff, double tolerance) {
    const bool ok = diff <= tolerance;
    if (!ok && first_over < 0) first_over = step;
    over += !ok;
    if (!(diff <= worst)) worst = diff, worst_step = step;
    return ok;
  }
};

// The GPU trained beside the CPU side (computed here, or `precomputed`), the losses compared at
// every step.
int CompareTrain20m(const Train20mSetup& s, GptDevice& gpu, const std::string& cpu_how,
                    const CpuLosses* precomputed) {
  const Train20mRun& run = s.run;
  const double tolerance = run.bf16 ? kTrainBf16Tolerance : kTrainFp32Tolerance;
  std::printf(
      "train20m: %lld parameters, B=%d T=%d, %d steps, lr %.0e (warm-up %lld), seed %llu, GPU "
      "%s on %s; %s; tolerance |Δloss|/loss <= %.0e\n",
      static_cast<long long>(run.params), run.b, run.t, run.steps, s.schedule.max_lr,
      static_cast<long long>(s.schedule.warmup_steps), static_cast<unsigned long long>(run.seed),
      run.bf16 ? "bf16 (fp32 master weights)" : "fp32", gpu.DeviceName().c_str(), cpu_how.c_str(),
      tolerance);
  std::printf("%6s %12s %12s %10s %12s %12s\n", "step", "loss CPU", "loss GPU", "rel diff",
              "norm CPU", "norm GPU");
  std::optional<CpuReference> reference;  // not needed when the CPU side's losses are read
  if (precomputed == nullptr) reference.emplace(s);
  LossAgreement agreement;
  double gpu_seconds = 0, cpu_seconds = 0;
  for (int64_t step = 0; step < run.steps; ++step) {
    const Batch batch = SyntheticBatch(step, run.b, run.t, s.config.vocab_size, run.seed);
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepResult> g = GpuStep(gpu, s, batch, step);
    if (!g.ok()) return Fail("train20m", g.status());
    gpu_seconds += Seconds(start);
    start = std::chrono::steady_clock::now();  // reported only when computed here
    const absl::StatusOr<StepResult> c =
        precomputed != nullptr ? (*precomputed)[step] : reference->Step(batch, step);
    if (!c.ok()) return Fail("train20m", c.status());
    cpu_seconds += Seconds(start);
    const double diff = RelDiff(g->loss, c->loss);
    const bool step_ok = agreement.Add(step, diff, tolerance);
    if (step % 10 == 0 || step == run.steps - 1 || !step_ok) {
      std::printf("%6lld %12.6f %12.6f %10.2e %12.4e %12.4e%s\n", static_cast<long long>(step),
                  c->loss, g->loss, diff, c->norm, g->norm, step_ok ? "" : "  FAIL");
      std::fflush(stdout);
    }
  }
  const bool ok = agreement.over == 0;
  const std::string first = ok ? "" : " (first: step " + std::to_string(agreement.first_over) + ")";
  char cpu_time[64];
  if (precomputed != nullptr) {
    std::snprintf(cpu_time, sizeof(cpu_time), "CPU precomputed");
  } else {
    std::snprintf(cpu_time, sizeof(cpu_time), "CPU %.3f s/step", cpu_seconds / run.steps);
  }
  std::printf(
      "\ntrain20m (%s): worst |Δloss|/loss %.2e at step %lld, tolerance %.0e; %lld of %d steps "
      "over%s; GPU %.3f s/step, %s: %s\n",
      run.bf16 ? "bf16" : "fp32", agreement.worst, static_cast<long long>(agreement.worst_step),
      tolerance, static_cast<long long>(agreement.over), run.steps, first.c_str(),
      gpu_seconds / run.steps, cpu_time, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

int Train20m(const Flags& f) {
  Train20mSetup s;
  Train20mRun& run = s.run;
  run = {static_cast<int>(f.Int("steps", 200)), static_cast<int>(f.Int("b", 4)),
         static_cast<int>(f.Int("t", 128)), static_cast<uint64_t>(f.Int("seed", 1)), f.bf16};
  const std::string write_path = f.String("write-cpu-losses");
  const std::string read_path = f.String("cpu-losses");
  s.config = GptConfig::Small20M(4096);
  if (!write_path.empty() && !read_path.empty()) {
    std::fprintf(stderr,
                 "troupe_gpu_check train20m: --write-cpu-losses and --cpu-losses exclude each "
                 "other\n%s",
                 kUsage);
    return 2;
  }
  if (run.steps <= 0 || run.b <= 0 || run.t <= 0 || run.t > s.config.context_length) {
    std::fprintf(stderr,
                 "troupe_gpu_check train20m: expected --steps > 0, --b > 0, 0 < --t <= %d\n",
                 s.config.context_length);
    return 2;
  }
  const bool cpu_only = !write_path.empty();
  // Model size, for the losses file's header, before the device (a file that does not fit is a
  // usage error, reported with or without a GPU).
  run.params = model::ParamLayout(s.config).total_size();
  absl::StatusOr<CpuLosses> precomputed = absl::UnavailableError("not read");
  if (!read_path.empty()) {
    precomputed = ReadCpuLosses(read_path, run);
    if (!precomputed.ok()) {
      std::fprintf(stderr, "troupe_gpu_check train20m: %s\n",
                   precomputed.status().ToString().c_str());
      return 2;
    }
  }
  int exit_code = 0;
  absl::StatusOr<std::unique_ptr<GptDevice>> gpu = absl::UnavailableError("not opened");
  if (!cpu_only) {
    gpu = OpenDevice("train20m", s.config, static_cast<int>(f.Int("device", 0)), run.bf16,
                     &exit_code);
    if (!gpu.ok()) return exit_code;
  }
  absl::StatusOr<model::GptModel<float>> cpu = model::GptModel<float>::Create(s.config);
  if (!cpu.ok()) return Fail("train20m", cpu.status());
  cpu->InitParams(run.seed);
  const int64_t n = cpu->num_params();
  if (n != run.params) {
    return Fail("train20m",
                absl::InternalError("the model has " + std::to_string(n) +
                                    " parameters, its layout " + std::to_string(run.params)));
  }
  if (!cpu_only) {
    if (absl::Status st = (*gpu)->SetParams(cpu->params()); !st.ok()) return Fail("train20m", st);
  }
  s.cpu = &*cpu;
  s.schedule.max_lr = 3e-4f;  // the stable regime the tolerances are for (see the top)
  s.schedule.min_lr = 3e-5f;
  s.schedule.warmup_steps = std::min(20, run.steps);
  s.schedule.total_steps = run.steps;
  std::string cpu_how = run.bf16 ? "CPU fp32 from the bf16-rounded master weights" : "CPU fp32";
  cpu_how += !read_path.empty() ? ", precomputed: read from " + read_path
                                : " (" + std::to_string(kernels::NumThreads()) + " threads)";
  if (cpu_only) return WriteCpuLossesMode(s, cpu_how, write_path);
  return CompareTrain20m(s, **gpu, cpu_how, precomputed.ok() ? &*precomputed : nullptr);
}

int Main(int argc, char** argv) {
  const std::string mode = argc >= 2 ? argv[1] : "";
  Flags f;
  std::vector<std::string> known = {"device", "threads", "seed", "b", "t"};
  if (mode == "gpt2") {
    known.push_back("double");
  } else if (mode == "train20m") {
    known.push_back("steps");
    known.push_back("bf16");
    known.push_back("cpu-losses");
    known.push_back("write-cpu-losses");
  } else {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  if (!ParseFlags(argc, argv, known, &f)) return 2;
  const long threads = f.Int("threads", std::max(1u, std::thread::hardware_concurrency()));
  kernels::SetNumThreads(static_cast<int>(std::max(1L, threads)));
  return mode == "gpt2" ? Gpt2(f) : Train20m(f);
}

}  // namespace
}  // namespace troupe::tools

int main(int argc, char** argv) { return troupe::tools::Main(argc, argv); }
