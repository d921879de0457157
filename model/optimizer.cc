#include "troupe/model/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "troupe/kernels/norm.h"

namespace troupe::model {

float LrSchedule::At(int64_t step) const {
  if (step < warmup_steps) {
    return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  if (step >= total_steps || total_steps <= warmup_steps) return min_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress));
  return static_cast<float>(min_lr + coeff * (max_lr - min_lr));
}

std::vector<double> GradChunkSquareSums(const float* grads, int64_t n) {
  std::vector<double> sums((n + kernels::kNormChunk - 1) / kernels::kNormChunk);
  kernels::ChunkSquareSums(grads, n, sums.data());
  return sums;
}

absl::StatusOr<std::vector<double>> RangeChunkSquareSums(const float* grads_range, int64_t begin,
                                                         int64_t end, int64_t total) {
  const int64_t chunk = kernels::kNormChunk;
  if (begin < 0 || end < begin || end > total || begin % chunk != 0 ||
      (end != total && end % chunk != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("range [", begin, ", ", end, ") of ", total,
                                                   ": expected bounds aligned to ", chunk,
                                                   " elements (or end == total)"));
  }
  return GradChunkSquareSums(grads_range, end - begin);
}

double GradNormFromChunks(const std::vector<double>& chunk_sums) {
  return std::sqrt(kernels::TreeSum(chunk_sums.data(), static_cast<int64_t>(chunk_sums.size())));
}

double GradNorm(const float* grads, int64_t n) {
  return GradNormFromChunks(GradChunkSquareSums(grads, n));
}

float ClipFactor(const AdamWConfig& config, double grad_norm) {
  if (config.max_grad_norm <= 0) return 1.0f;
  const double f = static_cast<double>(config.max_grad_norm) / (grad_norm + 1e-6);
  return static_cast<float>(std::min(1.0, f));
}

kernels::AdamWScalars StepScalars(const AdamWConfig& config, const LrSchedule& schedule,
                                  int64_t step, double grad_norm) {
  kernels::AdamWScalars s;
  s.lr = schedule.At(step);
  s.beta1 = config.beta1;
  s.beta2 = config.beta2;
  s.eps = config.eps;
  s.weight_decay = config.weight_decay;
  s.grad_scale = ClipFactor(config, grad_norm);
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(double(config.beta1), double(step + 1)));
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(double(config.beta2), double(step + 1)));
  return s;
}

void AdamWUpdateRange(const ParamLayout& layout, int64_t begin, int64_t end, float* params,
                      const float* grads, float* m, float* v, const AdamWConfig& config,
                      const kernels::AdamWScalars& scalars) {
  AdamWUpdateRange(layout.tensors(), begin, end, params, grads, m, v, config, scalars);
}

void AdamWUpdateRange(const std::vector<ParamTensor>& tensors, int64_t begin, int64_t end,
                      float* params, const float* grads, float* m, float* v,
                      const AdamWConfig& /*config*/, const kernels::AdamWScalars& scalars,
                      const kernels::AdamWSources* from) {
  for (const ParamTensor& t : tensors) {
    const int64_t lo = std::max(begin, t.offset);
    const int64_t hi = std::min(end, t.offset + t.size);
    if (lo >= hi) continue;
    kernels::AdamWScalars s = scalars;
    if (!t.decay) s.weight_decay = 0;
    const int64_t off = lo - begin;
    const kernels::AdamWSources at = from != nullptr ? from->At(off) : kernels::AdamWSources{};
    kernels::AdamWUpdate(params + off, grads + off, m + off, v + off, hi - lo, s,
                         from != nullptr ? &at : nullptr);
  }
}

}  // namespace troupe::model
