// troupe/train/trainable.h — what the elastic trainer needs from a model.
//
// A Trainable runs forward and backward for one microbatch over a flat fp32 parameter buffer and
// names its tensors; the elastic trainer owns everything else (which rank computes which
// microbatch, the canonical gradient sum, the sharded AdamW, checkpoints, recovery). Training your
// own model means implementing this interface and registering a factory under a name the job spec
// refers to (see training.h); the GPT from model/ is one implementation ("gpt").
//
// Contract, which deterministic mode relies on:
//   * params() and grads() point into array_ops()' memory (the host's unless device() is a GPU);
//   * ComputeGradient(step, k) is a pure function of (params(), step, k): it reads the microbatch
//     from the job's pure data function and overwrites grads() with the gradient of its share of
//     the step's loss (the step loss is the sum over the M microbatches' shares);
//   * InitParams(seed) is a pure function of the seed;
//   * tensors() cover [0, num_params()) in order; `decay` says whether AdamW's weight decay
//     applies.
//
// Example (a linear model y = w·x on data the model makes itself):
//   class Linear : public troupe::train::Trainable { ... };
//   TrainableFactory f = [](const ModelSpec& spec) -> absl::StatusOr<std::unique_ptr<Trainable>> {
//     return std::make_unique<Linear>(spec);
//   };
#ifndef TROUPE_TRAIN_TRAINABLE_H_
#define TROUPE_TRAIN_TRAINABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/config.h"
#include "troupe/train/pipeline.h"

namespace troupe::train {

// Where a Trainable's parameters and gradients live: host memory, or a CUDA device's memory (the
// elastic trainer then moves them with the device communicator, NCCL, instead of UCX).
struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;  // kCuda: the device index

  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string ToString() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.ordinal == b.ordinal;
  }
};

// "cpu", "cuda" (device 0) or "cuda:N"; anything else is InvalidArgument naming the value.
[[nodiscard]] absl::StatusOr<Device> ParseDevice(const std::string& text);

// OK when this process can put a model on `device`; otherwise FailedPrecondition saying why — for
// CUDA, the CUDA runtime's error name (e.g. cudaErrorInsufficientDriver on a machine without a
// driver) or a build without the CUDA backend.
[[nodiscard]] absl::Status CheckDeviceUsable(const Device& device);
// How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies): in a cluster each worker
// sees only its own GPUs, so "cuda" (device 0) is the worker's first. FailedPrecondition naming
// the CUDA runtime's error where none can be used, or in a build without the CUDA backend.
[[nodiscard]] absl::StatusOr<int> CudaDeviceCount();

// A model that can be cut into pipeline stages between its units (the GPT's blocks): one stage
// per rank of a DP × PP grid (pipeline.h). Pointers are in the Trainable's array_ops() memory.
// Contract, which deterministic mode relies on: chained stages produce, for every parameter and
// microbatch, the bits ComputeGradient produces — the parameters a stage's backward computes are
// its GradientRanges; a tied parameter (the GPT's wte: the head and the embedding) is the last
// stage's, whose gradient AddTiedGradient completes with the first stage's input gradient.
class StagedTrainable {
 public:
  virtual ~StagedTrainable() = default;
  virtual int num_units() const = 0;
  // What the units and the first and last stage's extras cost (PartitionUnits cuts the model by
  // them). Default: every unit alike, no extras.
  virtual StageCosts costs() const {
    return StageCosts{std::vector<double>(static_cast<size_t>(num_units()), 1.0), 0, 0};
  }
  // Floats that cross a cut per microbatch, either way (the GPT: m · T · C).
  virtual int64_t boundary_size() const = 0;
  // The flat ranges whose gradient stage [first_unit, end_unit) computes: disjoint over a cut's
  // stages and covering [0, num_params()).
  virtual std::vector<std::pair<int64_t, int64_t>> GradientRanges(int first_unit,
                                                                  int end_unit) const = 0;
  // The ranges of the last stage's GradientRanges that AddTiedGradient completes (empty: none).
  // A stage reads the parameters of its GradientRanges and, on the first stage, of these.
  virtual std::vector<std::pair<int64_t, int64_t>> TiedRanges() const { return {}; }
  // Trainable::InitParams(seed) for parameters [begin, end) only: a stage's rank initialises
  // what it keeps and leaves the rest of params() untouched (on the host: never resident).
  virtual void InitParamRange(uint64_t seed, int64_t begin, int64_t end) = 0;
  // Makes this model stage [first_unit, end_unit) with `slots` microbatches in flight.
  [[nodiscard]] virtual absl::Status SetStage(int first_unit, int end_unit, int slots) = 0;
  // Forward of microbatch k of `step` into `slot`; `input` is the previous stage's output (null
  // on the first stage). Returns the microbatch's mean loss on the last stage, else 0.
  [[nodiscard]] virtual absl::StatusOr<double> StageForward(int64_t step, int32_t k, int slot,
                                                            const float* input) = 0;
  // boundary_size() floats: what the next stage's forward reads (not on the last stage).
  virtual const float* StageOutput(int slot) const = 0;
  // Overwrites the stage's GradientRanges in grads() with the microbatch's gradient (its share
  // of the step loss, as ComputeGradient), from d_output (null on the last stage).
  [[nodiscard]] virtual absl::Status StageBackward(int slot, const float* d_output) = 0;
  // boundary_size() floats: d input of the last StageBackward (the first stage's goes to the
  // last stage for AddTiedGradient); valid until the next StageBackward.
  virtual const float* InputGradient() const = 0;
  // Adds to `tied` (the TiedRanges, one after the other, as the last stage's grads() held them
  // after microbatch k's backward) what the first stage's input gradient contributes.
  [[nodiscard]] virtual absl::Status AddTiedGradient(int64_t step, int32_t k,
                                                     const float* first_input_gradient,
                                                     float* tied) {
    (void)step, (void)k, (void)first_input_gradient, (void)tied;
    return absl::OkStatus();
  }
};

class Trainable {
 public:
  virtual ~Trainable() = default;

  virtual int64_t num_params() const = 0;
  virtual const std::vector<model::ParamTensor>& tensors() const = 0;
  virtual float* params() = 0;
  virtual const float* grads() const = 0;
  virtual void InitParams(uint64_t seed) = 0;
  // Overwrites grads() with the gradient of microbatch k's share of step `step`'s loss and
  // returns that microbatch's mean loss.
  [[nodiscard]] virtual absl::StatusOr<double> ComputeGradient(int64_t step, int32_t k) = 0;
  // ComputeGradient, reporting the backward pass's progress: `ready(begin, end)` as soon as
  // grads()[begin, end) holds its final value for the microbatch (the GPT: ln_f, each block from
  // the last to the first, then the embeddings), so that the trainer exchanges those ranges while
  // the pass goes on. Ranges are disjoint and may leave parts unreported; on a device, final
  // means enqueued on the model's stream (array_ops() orders what follows after it). The ranges
  // and their order must depend on the model alone — not on the step, k or the data: every rank
  // posts its exchange in that order, and a backend that runs point-to-point operations in issue
  // order (NCCL) would deadlock on ranks that differ. The default reports nothing: the trainer
  // takes the whole gradient as final when the call returns.
  using GradientReady = std::function<void(int64_t begin, int64_t end)>;
  [[nodiscard]] virtual absl::StatusOr<double> ComputeGradientReporting(
      int64_t step, int32_t k, const GradientReady& ready) {
    (void)ready;
    return ComputeGradient(step, k);
  }
  // Tokens (or samples) one microbatch holds: what tokens/s counts.
  virtual int64_t tokens_per_microbatch() const = 0;
  // For checkpoint manifests: the GPT's config, absent for other models.
  virtual std::optional<model::GptConfig> gpt_config() const { return std::nullopt; }
  // Where params() and grads() point. Checkpoints use the same flat layout on every device.
  virtual Device device() const { return {}; }
  // That memory and its operations: the elastic trainer reaches params() and grads() only
  // through these (and its communicator), never by dereferencing them.
  virtual model::ArrayOps& array_ops() { return model::HostArrayOps(); }
  // Pipeline stages, where the model supports them (null: data parallelism only).
  virtual StagedTrainable* staged() { return nullptr; }
  // [lowcomm]: from now on step s reads the training data of step s·streams + stream (each group
  // on data of its own; together the tokens a step of streams × M microbatches reads).
  // Unimplemented by default, except for one stream.
  [[nodiscard]] virtual absl::Status SetDataStream(int32_t stream, int32_t streams) {
    if (stream == 0 && streams == 1) return absl::OkStatus();
    return absl::UnimplementedError(
        "this model reads one data stream ([lowcomm] needs Trainable::SetDataStream)");
  }
  // [eval]: the mean loss of held-out microbatch k (0 <= k < ModelSpec::eval_microbatches) under
  // the parameters in params(), forward only: neither the parameters nor the training data order
  // change. The same k reads the same tokens at every evaluation. Unimplemented by default.
  [[nodiscard]] virtual absl::StatusOr<double> EvalLoss(int32_t k) {
    (void)k;
    return absl::UnimplementedError("this model has no held-out evaluation ([eval])");
  }
};

// This rank's share of an evaluation of `microbatches` held-out microbatches over `world` ranks:
// k in [K·rank/W, K·(rank+1)/W), as (k, mean loss). Whoever sums them does so in k order (the
// job's validation loss: the canonical tree over k, divided by K), so the result does not depend
// on W.
[[nodiscard]] absl::StatusOr<std::vector<std::pair<int32_t, double>>> EvalShare(
    Trainable& model, int32_t microbatches, int rank, int world);

// The model part of a job spec, as the factory sees it.
struct ModelSpec {
  std::string type = "gpt";    // the registered factory's name
  std::string size = "tiny";   // gpt: tiny | tiny4 (tiny with 4 blocks) | small20m
  std::string data_dir;        // gpt: where `troupe data prepare` put the shards
  std::string device = "cpu";  // cpu | cuda | cuda:N (ParseDevice)
  // fp32 | bf16 (gpt on CUDA: bf16 activations and gradients, fp32 master weights and moments;
  // the elastic step sums the gradients widened to fp32, so bits still do not depend on W).
  std::string precision = "fp32";
  int32_t seq_len = 64;
  int32_t microbatch_size = 4;                 // m
  int32_t microbatches = 8;                    // M per step, fixed whatever the world size
  uint64_t seed = 1;                           // data order and initialisation
  std::map<std::string, std::string> options;  // free-form, for user models ([model.options])
  // Set from the job spec's [eval]: the held-out shard (a path; relative: to data_dir; "": the
  // first val-*.tok of data_dir) and how many of its microbatches (of microbatch_size × seq_len,
  // fixed) an evaluation reads; 0: no evaluation, nothing opened.
  std::string eval_shard;
  int32_t eval_microbatches = 0;
};

using TrainableFactory =
    std::function<absl::StatusOr<std::unique_ptr<Trainable>>(const ModelSpec&)>;

// Name → factory. "gpt" is always present; programs add their own before they run a job.
class TrainableRegistry {
 public:
  static TrainableRegistry& Global();
  void Register(const std::string& name, TrainableFactory factory);
  // The factory's model, or InvalidArgument when its tensors() do not cover [0, num_params()) in
  // order (the staged AdamW writes only what they cover).
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Trainable>> Create(const ModelSpec& spec) const;

 private:
  std::map<std::string, TrainableFactory> factories_;
};

// `spec`'s model as a host fp32 instance: the same flat layout (a GPU model, bf16 too, keeps fp32
// master weights in the CPU model's order), creatable on a node without the ranks' GPUs — what
// the coordinator reads the model's shape from.
ModelSpec HostLayoutSpec(ModelSpec spec);

// The GPT from model/ on the token shards in spec.data_dir (train-*.tok, tokenizer.bin).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Trainable>> CreateGptTrainable(const ModelSpec& spec);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_TRAINABLE_H_
