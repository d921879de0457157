// The GPT-2 decoder for one rank: forward, backward and cross-entropy loss on the CPU kernels.
//
// Parameters and gradients are flat buffers laid out by ParamLayout. Backward adds to the gradient
// buffer the gradient of loss_weight · Σ per-token losses of the last Forward; with ZeroGrad before
// each microbatch this yields per-microbatch gradients, which a caller sums in a fixed order
// (see TreeAccumulator). Instantiated for float (training) and double (gradient checks).
// Not thread-safe: one thread drives a model; the kernels parallelise inside each call.
//
// Example:
//   absl::StatusOr<Gpt> gpt = Gpt::Create(GptConfig::Tiny(512));
//   gpt->InitParams(/*seed=*/42);
//   absl::StatusOr<double> loss = gpt->Forward(inputs.data(), targets.data(), B, T);
//   gpt->ZeroGrad();
//   gpt->Backward(1.0f / (B * T));   // gradient of the mean loss, in gpt->grads()
#ifndef TROUPE_MODEL_GPT_H_
#define TROUPE_MODEL_GPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/model/config.h"

namespace troupe::model {

template <typename T>
class GptModel {
 public:
  [[nodiscard]] static absl::StatusOr<GptModel> Create(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total_size(); }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }

  // GPT-2 initialisation from the counter RNG: N(0, 0.02) for matrices and embeddings,
  // N(0, 0.02/sqrt(2L)) for the residual projections, zero biases, unit LayerNorm gains.
  void InitParams(uint64_t seed);

  // Runs the model on tokens [b, t] (t <= context_length). With targets, computes per-token
  // losses and returns their mean; without (nullptr), only logits, and returns 0. Token and target
  // ids must be below vocab_size, else InvalidArgument naming the index.
  [[nodiscard]] absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets, int b,
                                               int t);

  void ZeroGrad();
  // Accumulates d(loss_weight · Σ losses)/dθ into grads(). FailedPrecondition unless the last
  // Forward had targets.
  [[nodiscard]] absl::Status Backward(T loss_weight);

  const T* logits() const { return logits_.data(); }  // [b, t, vocab_size] of the last Forward
  const T* losses() const { return losses_.data(); }  // [b, t]

 private:
  explicit GptModel(const GptConfig& config);
  void EnsureActivations(int b, int t);

  GptConfig config_;
  ParamLayout layout_;
  std::vector<T> params_, grads_;
  int b_ = 0, t_ = 0;
  bool have_targets_ = false;
  std::vector<int32_t> tokens_, targets_;
  // Activations, per layer where indexed by layer (llm.c's layout).
  std::vector<T> encoded_, ln1_, ln1_mean_, ln1_rstd_, qkv_, atty_, att_, attproj_, residual2_,
      ln2_, ln2_mean_, ln2_rstd_, fch_, fch_gelu_, fcproj_, residual3_, lnf_, lnf_mean_, lnf_rstd_,
      logits_, probs_, losses_;
  // Backward scratch, reused across layers.
  std::vector<T> dresidual_, dbtc_, dbtc2_, dqkv_, dfch_, dfch_gelu_, dlogits_;
};

using Gpt = GptModel<float>;

}  // namespace troupe::model

#endif  // TROUPE_MODEL_GPT_H_
