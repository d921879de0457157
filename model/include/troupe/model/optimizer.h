// AdamW over ranges of the flat parameter buffer, gradient-norm clipping, and the learning-rate
// schedule (linear warm-up, then cosine decay to min_lr).
//
// The step's scalars (learning rate, clip factor, bias corrections) are computed once from the
// step number and the global gradient norm, then handed to every range update; an owner of
// [begin, end) therefore computes exactly the bits a single process computes for those elements.
// The global norm is the canonical tree sum of fixed 4 Ki-element chunk sums (kernels/norm.h), so
// owners of chunk-aligned ranges can each contribute their chunk sums.
//
// Example (one process, whole buffer):
//   double norm = GradNorm(grads, n);
//   kernels::AdamWScalars s = StepScalars(adamw, schedule, step, norm);
//   AdamWUpdateRange(layout, 0, n, params, grads, m, v, adamw, s);
#ifndef TROUPE_MODEL_OPTIMIZER_H_
#define TROUPE_MODEL_OPTIMIZER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/kernels/adamw.h"
#include "troupe/model/config.h"

namespace troupe::model {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;   // applied to tensors with ParamTensor::decay only
  float max_grad_norm = 1.0f;  // clip threshold; <= 0 disables clipping
};

struct LrSchedule {
  float max_lr = 6e-4f;
  float min_lr = 6e-5f;
  int64_t warmup_steps = 10;
  int64_t total_steps = 1000;

  // Learning rate of 0-based step `step`: (step+1)/warmup · max_lr during warm-up, then cosine
  // from max_lr down to min_lr at total_steps, min_lr after.
  float At(int64_t step) const;
};

// Per-chunk sums of squares of grads[0, n) (chunks of kernels::kNormChunk), for range owners.
std::vector<double> GradChunkSquareSums(const float* grads, int64_t n);
// The chunk sums of a range owner holding grads[begin, end) (grads_range points at element begin).
// begin must be a multiple of kernels::kNormChunk, and so must end unless end == total. Owners'
// results concatenated in range order equal GradChunkSquareSums of the whole buffer, bit for bit.
[[nodiscard]] absl::StatusOr<std::vector<double>> RangeChunkSquareSums(const float* grads_range,
                                                                       int64_t begin, int64_t end,
                                                                       int64_t total);
// sqrt(TreeSum(chunk sums)).
double GradNormFromChunks(const std::vector<double>& chunk_sums);
double GradNorm(const float* grads, int64_t n);

// min(1, max_grad_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_.
float ClipFactor(const AdamWConfig& config, double grad_norm);

// Scalars of 0-based step `step` (bias corrections use step + 1).
kernels::AdamWScalars StepScalars(const AdamWConfig& config, const LrSchedule& schedule,
                                  int64_t step, double grad_norm);

// Updates elements [begin, end) of the flat buffers, in place, or out of place from `from`
// (kernels::AdamWSources: the old parameters and moments, left as they were). params, grads, m
// and v (and `from`'s sources) point at element `begin` (range-local storage works as well as the
// whole buffer offset by begin). Weight decay is applied where the covering tensor has decay, zero
// elsewhere; elements no tensor covers are not written.
void AdamWUpdateRange(const ParamLayout& layout, int64_t begin, int64_t end, float* params,
                      const float* grads, float* m, float* v, const AdamWConfig& config,
                      const kernels::AdamWScalars& scalars);
// The same for any model: `tensors` cover the flat buffer in order and say where decay applies.
void AdamWUpdateRange(const std::vector<ParamTensor>& tensors, int64_t begin, int64_t end,
                      float* params, const float* grads, float* m, float* v,
                      const AdamWConfig& config, const kernels::AdamWScalars& scalars,
                      const kernels::AdamWSources* from = nullptr);

}  // namespace troupe::model

#endif  // TROUPE_MODEL_OPTIMIZER_H_
