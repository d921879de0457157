// GptDeviceTrainable: the GPT as a Trainable whose parameters and gradients stay in a device's
// memory — on a GPU, kernels/cuda's GptDevice (fp32, or bf16 activations and gradients over fp32
// master weights); in train_elastic_test, the same launch sequence (GptCuda) run on the CPU by the
// SIMT layer behind the opaque device. The elastic trainer reaches that memory only through
// array_ops() and its communicator (NCCL on a GPU).
//
// Model is any class with GptDevice's calls: config(), num_params(), device_params(),
// array_ops(), InitParams(seed), ParamsChanged(), Forward(tokens, targets, b, t), ZeroGrad(),
// Backward(loss_weight, ready) (ready: GradientReady, possibly empty; given, it must report
// every gradient, widened, as GptDevice's does: grads() is not widened again after it) and
// Fp32Grads(), whose pointer does not change. grads() is Fp32Grads(): in bf16 the microbatch's bf16
// gradients widened (exactly) to fp32, so the canonical sum the trainer forms from them — and so
// the weights — do not depend on the world size, as in fp32.
//
// No call here waits for the device: Forward returns the loss (it reads it back), the backward
// and the widening are enqueued, and the trainer's next use of grads() is an ArrayOps operation
// on the model's stream, which runs after them and waits for the stream before it returns.
#ifndef TROUPE_TRAIN_GPT_DEVICE_TRAINABLE_H_
#define TROUPE_TRAIN_GPT_DEVICE_TRAINABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/config.h"
#include "troupe/model/data_source.h"
#include "troupe/train/trainable.h"

namespace troupe::train {

template <class Model>
class GptDeviceTrainable final : public Trainable {
 public:
  // Takes the model as built (parameters at zero until InitParams).
  // `eval`: [eval]'s held-out data (EvalLoss), if any.
  static absl::StatusOr<std::unique_ptr<GptDeviceTrainable>> Create(
      std::unique_ptr<Model> gpu, model::DataSource data, Device device,
      std::optional<model::DataSource> eval = std::nullopt) {
    TROUPE_ASSIGN_OR_RETURN(const float* grads, gpu->Fp32Grads());
    return std::unique_ptr<GptDeviceTrainable>(
        new GptDeviceTrainable(std::move(gpu), std::move(data), std::move(eval), device, grads));
  }

  int64_t num_params() const override { return gpu_->num_params(); }
  const std::vector<model::ParamTensor>& tensors() const override { return layout_.tensors(); }
  float* params() override { return gpu_->device_params(); }
  const float* grads() const override { return grads_; }
  // A device failure here surfaces at the next ComputeGradient (the interface returns nothing).
  void InitParams(uint64_t seed) override { error_ = gpu_->InitParams(seed); }
  int64_t tokens_per_microbatch() const override {
    return int64_t{data_.options().microbatch_size} * data_.options().seq_len;
  }
  std::optional<model::GptConfig> gpt_config() const override { return gpu_->config(); }
  Device device() const override { return device_; }
  model::ArrayOps& array_ops() override { return gpu_->array_ops(); }

  absl::StatusOr<double> ComputeGradient(int64_t step, int32_t k) override {
    return ComputeGradientReporting(step, k, nullptr);
  }
  // The backward pass reports each range as soon as its work is enqueued (GptDevice::Backward).
  // The trainer's first use of a range is an ArrayOps operation on the model's stream, which runs
  // after that work and waits for the stream before it returns; the range's exchange then runs on
  // the communicator's stream while the host enqueues the rest of the pass. (That wait leaves the
  // model's stream idle while the host enqueues the next block; events in its place would not.)
  absl::StatusOr<double> ComputeGradientReporting(int64_t step, int32_t k,
                                                  const GradientReady& ready) override {
    if (!error_.ok()) return error_;
    const model::DataSourceOptions& d = data_.options();
    const float loss_weight =
        1.0f / static_cast<float>(int64_t{d.microbatches_per_step} * d.microbatch_size * d.seq_len);
    TROUPE_RETURN_IF_ERROR(data_.Get(step, k, &mb_));
    // The trainer wrote the parameters through array_ops() and its communicator.
    TROUPE_RETURN_IF_ERROR(gpu_->ParamsChanged());
    TROUPE_ASSIGN_OR_RETURN(
        double loss, gpu_->Forward(mb_.inputs.data(), mb_.targets.data(), mb_.batch, mb_.seq_len));
    TROUPE_RETURN_IF_ERROR(gpu_->ZeroGrad());
    // grads_ (Fp32Grads()'s buffer, fixed since Create) is where the reported ranges are.
    TROUPE_RETURN_IF_ERROR(gpu_->Backward(loss_weight, ready));
    if (!ready) {
      TROUPE_ASSIGN_OR_RETURN(grads_, gpu_->Fp32Grads());
    }
    return loss;
  }

  absl::Status SetDataStream(int32_t stream, int32_t streams) override {
    return data_.SetStream(stream, streams);
  }

  absl::StatusOr<double> EvalLoss(int32_t k) override {
    if (!eval_) return Trainable::EvalLoss(k);
    if (!error_.ok()) return error_;
    TROUPE_RETURN_IF_ERROR(eval_->Get(0, k, &mb_));
    TROUPE_RETURN_IF_ERROR(gpu_->ParamsChanged());
    return gpu_->Forward(mb_.inputs.data(), mb_.targets.data(), mb_.batch, mb_.seq_len);
  }

 private:
  GptDeviceTrainable(std::unique_ptr<Model> gpu, model::DataSource data,
                     std::optional<model::DataSource> eval, Device device, const float* grads)
      : gpu_(std::move(gpu)),
        layout_(gpu_->config()),
        data_(std::move(data)),
        eval_(std::move(eval)),
        device_(device),
        grads_(grads) {}

  std::unique_ptr<Model> gpu_;
  model::ParamLayout layout_;
  model::DataSource data_;
  std::optional<model::DataSource> eval_;
  Device device_;
  const float* grads_;
  model::Microbatch mb_;
  absl::Status error_;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_GPT_DEVICE_TRAINABLE_H_
