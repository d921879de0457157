// The GPT-2 decoder for one rank: forward, backward and cross-entropy loss on the CPU kernels.
//
// Parameters and gradients are flat buffers laid out by ParamLayout. Backward adds to the gradient
// buffer the gradient of loss_weight · Σ per-token losses of the last Forward; with ZeroGrad before
// each microbatch this yields per-microbatch gradients, which a caller sums in a fixed order
// (see TreeAccumulator). Instantiated for float (training) and double (gradient checks).
// Not thread-safe: one thread drives a model; the kernels parallelise inside each call.
//
// Pipeline stages (docs/ARCHITECTURE.md: pipeline parallelism): the same model cut between blocks.
// A stage runs blocks [first_block, end_block); the first also the embedding, the last also
// ln_f, the head and the loss. Stage activations live in slots, one per microbatch in flight.
// Chained stages compute, for every parameter, the bits Backward computes — except wte, whose
// gradient has two parts: the head's (the last stage's grads()) and the embedding's, which the
// first stage hands on as input_gradient() and AddTokenEmbeddingGradient adds in Backward's
// order.
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
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/base/big_buffer.h"
#include "troupe/model/config.h"

namespace troupe::model {

// Blocks [first_block, end_block) of a GptConfig's num_layers.
struct StageRange {
  int first_block = 0;
  int end_block = 0;
  bool first() const { return first_block == 0; }
  bool last(int num_layers) const { return end_block == num_layers; }
};

template <typename T>
class GptModel {
 public:
  [[nodiscard]] static absl::StatusOr<GptModel> Create(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total_size(); }
  T* params() { return params_.get(); }
  const T* params() const { return params_.get(); }
  T* grads() { return grads_.get(); }
  const T* grads() const { return grads_.get(); }

  // GPT-2 initialisation from the counter RNG: N(0, 0.02) for matrices and embeddings,
  // N(0, 0.02/sqrt(2L)) for the residual projections, zero biases, unit LayerNorm gains.
  void InitParams(uint64_t seed);
  // The same values for elements [begin, end) of the flat layout only (a pipeline stage
  // initialises only what it keeps: the rest of the buffer is never touched).
  void InitParams(uint64_t seed, int64_t begin, int64_t end);

  // Runs the model on tokens [b, t] (t <= context_length). With targets, computes per-token
  // losses and returns their mean; without (nullptr), only logits, and returns 0. Token and target
  // ids must be below vocab_size, else InvalidArgument naming the index.
  [[nodiscard]] absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets, int b,
                                               int t);

  void ZeroGrad();
  // Accumulates d(loss_weight · Σ losses)/dθ into grads(). FailedPrecondition unless the last
  // Forward had targets. `ready`, when given, is called with each flat range [begin, end) as soon
  // as the pass has added everything it adds there — ln_f, then each block from the last to the
  // first, then the embeddings (wte, whose head part comes first, with wpe): a trainer exchanges
  // those ranges while the pass goes on.
  using RangeReady = std::function<void(int64_t begin, int64_t end)>;
  [[nodiscard]] absl::Status Backward(T loss_weight, const RangeReady& ready = nullptr);

  const T* logits() const { return full_.logits.data(); }  // [b, t, vocab_size], last Forward
  const T* losses() const { return full_.losses.data(); }  // [b, t]

  // Makes this model stage `range` with `slots` microbatches in flight; drops earlier slots.
  // InvalidArgument unless 0 <= first_block < end_block <= num_layers and slots >= 1.
  [[nodiscard]] absl::Status SetStage(StageRange range, int slots);
  const StageRange& stage() const { return stage_; }
  // Forward of one microbatch into `slot`: the first stage reads `tokens`, the others `input`
  // [b, t, C] (the previous stage's stage_output). The last stage needs `targets` and returns
  // the mean loss; the others return 0.
  [[nodiscard]] absl::StatusOr<double> ForwardStage(int slot, const int32_t* tokens,
                                                    const int32_t* targets, const T* input, int b,
                                                    int t);
  // [b, t, C]: the residual stream after the stage's last block (not on the last stage).
  const T* stage_output(int slot) const;
  // Backward of the microbatch in `slot`: adds into grads() the gradient of the stage's
  // parameters (StageGradientRanges) for loss_weight · Σ losses, starting from the loss on the
  // last stage and from d_output ([b, t, C], d stage_output) elsewhere. The first stage adds
  // wpe's gradient but not wte's embedding part: that is input_gradient(), for the last stage.
  [[nodiscard]] absl::Status BackwardStage(int slot, T loss_weight, const T* d_output);
  // [b, t, C]: d input (on the first stage, d of the embedding output) of the last
  // BackwardStage; valid until the next one.
  const T* input_gradient() const { return dresidual_.data(); }
  // The flat ranges whose gradient a stage's BackwardStage produces: disjoint over the stages
  // of a cut, covering the model; wte belongs to the last stage (its head part, completed by
  // AddTokenEmbeddingGradient).
  std::vector<std::pair<int64_t, int64_t>> StageGradientRanges(StageRange range) const;
  // Adds the embedding part of wte's gradient — d_embedded [b, t, C] from the first stage's
  // input_gradient(), row i into row tokens[i] of dwte — in the order Backward adds it.
  void AddTokenEmbeddingGradient(T* dwte, const T* d_embedded, const int32_t* tokens, int b,
                                 int t) const;

 private:
  // One microbatch's activations for blocks [first_block, end_block) of a range (llm.c's
  // layout, per block where indexed by block).
  struct Activations {
    int b = 0, t = 0;
    bool have_targets = false;
    std::vector<int32_t> tokens, targets;
    // The stage's input: the embedding output on the first stage, else a copy of `input`.
    base::BigVector<T> encoded, ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, residual2, ln2,
        ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, logits,
        probs, losses;
  };
  explicit GptModel(const GptConfig& config);
  void Size(Activations& a, StageRange range, int b, int t);
  void EnsureScratch(int b, int t);
  [[nodiscard]] absl::StatusOr<double> RunForward(Activations& a, StageRange range,
                                                  const int32_t* tokens, const int32_t* targets,
                                                  const T* input, int b, int t);
  [[nodiscard]] absl::Status RunBackward(Activations& a, StageRange range, T loss_weight,
                                         const T* d_output, bool embed_wte,
                                         const RangeReady& ready = nullptr);

  GptConfig config_;
  ParamLayout layout_;
  // Both zeroed by the kernel, page by page as touched (base::AllocateBig): a pipeline stage,
  // which reads and writes only its own ranges, keeps only those resident (and the huge pages
  // they share with their neighbours).
  struct FreeDeleter {
    size_t bytes = 0;
    void operator()(T* p) const { base::FreeBig(p, bytes); }
  };
  std::unique_ptr<T[], FreeDeleter> params_, grads_;
  Activations full_;  // Forward/Backward: the whole model
  StageRange stage_;
  std::vector<Activations> slots_;
  // Backward scratch, reused across layers.
  int scratch_bt_ = 0;
  base::BigVector<T> dresidual_, dbtc_, dbtc2_, dqkv_, dfch_, dfch_gelu_, dlogits_;
};

using Gpt = GptModel<float>;

}  // namespace troupe::model

#endif  // TROUPE_MODEL_GPT_H_
