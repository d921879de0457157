// The GPT's training step on one GPU, for host programs compiled by the plain C++ compiler: a
// non-template facade over GptCuda<Tx> (gpt.cuh), implemented in gpt_device.cu and compiled by
// nvcc into troupe_model_cuda. A g++ translation unit that included gpt.cuh would get the SIMT
// (CPU) build of the launch sequence; this header has no CUDA header and no kernel in it, so
// tools and Trainables reach the real GPU path through it.
//
// Conventions, those of GptCuda and so of the CPU model (troupe/model/gpt.h): parameters,
// gradients and AdamW moments are flat fp32 host arrays of num_params() floats in ParamLayout's
// order; Backward adds the gradient of loss_weight · Σ per-token losses of the last Forward
// (ZeroGrad first); Step takes the global gradient norm, clips and applies AdamW as model::Trainer
// does. With bf16, activations, gradients and the weight copy the kernels read are bf16 and the
// master weights and moments fp32 (GetGrads rounds nothing further: it widens the bf16 gradients).
// Each object owns its device memory (a caching allocator), its cuBLASLt runner and a stream on
// its device; every call makes that device current on the calling thread first. Not thread-safe.
// Forward, Step, GradNorm and the Get* calls wait for the stream; the others only enqueue work.
// A GPU Trainable reaches the device buffers directly: device_params() / Fp32Grads() (fp32, in
// bf16 the gradients widened), array_ops() for the elastic trainer's operations on the same
// stream, Synchronize(), and ParamsChanged() after writing device_params() (a no-op in fp32; bf16
// refreshes its weight copy).
//
// Example:
//   absl::StatusOr<std::unique_ptr<GptDevice>> gpt =
//       GptDevice::Create(GptConfig::Gpt2Small(), /*device_ordinal=*/0, /*bf16=*/false);
//   if (!gpt.ok()) return gpt.status();  // no usable GPU: FailedPrecondition naming the cause
//   TROUPE_RETURN_IF_ERROR((*gpt)->InitParams(/*seed=*/1));
//   absl::StatusOr<double> loss = (*gpt)->Forward(tokens, targets, B, T);  // host arrays
//   TROUPE_RETURN_IF_ERROR((*gpt)->ZeroGrad());
//   TROUPE_RETURN_IF_ERROR((*gpt)->Backward(1.0f / (B * T)));
//   absl::StatusOr<double> grad_norm = (*gpt)->Step(adamw, schedule, step);
#ifndef TROUPE_MODEL_CUDA_GPT_DEVICE_H_
#define TROUPE_MODEL_CUDA_GPT_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/config.h"
#include "troupe/model/optimizer.h"

namespace troupe::model::cuda {

class GptDevice {
 public:
  // Checks the device before anything else: FailedPrecondition naming the CUDA runtime's error
  // (e.g. cudaErrorInsufficientDriver) where no GPU can be used, or when device_ordinal is not
  // one of this machine's devices; InvalidArgument for an invalid config; ResourceExhausted when
  // the parameters do not fit. Parameters and moments start at zero (InitParams or SetParams).
  static absl::StatusOr<std::unique_ptr<GptDevice>> Create(const model::GptConfig& config,
                                                           int device_ordinal, bool bf16);
  ~GptDevice();
  GptDevice(const GptDevice&) = delete;
  GptDevice& operator=(const GptDevice&) = delete;

  const model::GptConfig& config() const;
  int64_t num_params() const;
  int device_ordinal() const;
  bool bf16() const;
  // The device's name and compute capability, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
  std::string DeviceName() const;

  // The CPU model's initialisation (GptModel<float>::InitParams(seed)), copied in.
  absl::Status InitParams(uint64_t seed);
  // num_params() fp32 master weights in (the bf16 copy refreshed) or out.
  absl::Status SetParams(const float* host);
  absl::Status GetParams(float* host) const;
  // AdamW moments in or out (checkpoints): num_params() floats each.
  absl::Status SetOptimizerState(const float* m, const float* v);
  absl::Status GetOptimizerState(float* m, float* v) const;

  // Runs the model on host tokens [b, t]; with targets, returns the mean per-token loss, without
  // (nullptr) computes the logits only and returns 0. InvalidArgument for ids outside the
  // vocabulary or t beyond the context, as GptModel::Forward.
  absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets, int b, int t);
  absl::Status ZeroGrad();
  // grads += d(loss_weight · Σ losses)/dθ of the last Forward; FailedPrecondition unless it had
  // targets. `ready`, when given, is called with each flat range of the gradient as soon as its
  // work (and, in bf16, its widening into Fp32Grads()) is enqueued on the stream — the CPU model's
  // ranges in its order (GptModel::Backward) — so that a trainer exchanges them while the rest of
  // the pass runs; every range is reported, and Fp32Grads() need not be called after it.
  using RangeReady = std::function<void(int64_t begin, int64_t end)>;
  absl::Status Backward(float loss_weight, const RangeReady& ready = {});
  // The gradients, as float.
  absl::Status GetGrads(float* host) const;
  // The global gradient norm alone (model::GradNorm's bits for fp32 gradients).
  absl::StatusOr<double> GradNorm();
  // One optimizer step of 0-based step `step`: gradient norm, clip factor, schedule, AdamW with
  // per-tensor weight decay (GptCuda::Step). Returns the norm before clipping.
  absl::StatusOr<double> Step(const model::AdamWConfig& adamw, const model::LrSchedule& schedule,
                              int64_t step);

  // --- Device memory, for a Trainable on the GPU (the elastic trainer) ---
  // The num_params() fp32 master weights in device memory, in ParamLayout's order; the pointer is
  // fixed for the object's life. A caller that writes them directly (array_ops(), a communicator)
  // must call ParamsChanged() before the next Forward.
  float* device_params();
  // The num_params() gradients as fp32 in device memory: in fp32 mode the buffer Backward adds to;
  // in bf16 mode a buffer (allocated at the first call, kept) into which the bf16 gradients are
  // widened, exactly, enqueued on the stream. Valid until the next Backward or ZeroGrad.
  absl::StatusOr<const float*> Fp32Grads();
  // Tells the object that device_params() was written other than through SetParams/InitParams/
  // Step: in bf16 mode refreshes the bf16 copy of the weights the kernels read (enqueued on the
  // stream, so ordered before the next Forward); nothing in fp32 mode, where the kernels read the
  // master weights themselves.
  absl::Status ParamsChanged();
  // Waits for all work enqueued on this object's stream.
  absl::Status Synchronize();
  // Array operations on this device and on this object's stream (CreateCudaArrayOpsOnStream), so
  // they are ordered with Forward/Backward/Step without further synchronisation; each waits for
  // the stream before returning. Arrays it allocates must be destroyed before this object.
  model::ArrayOps& array_ops();

  class Impl;  // gpt_device.cu

 private:
  explicit GptDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::model::cuda

#endif  // TROUPE_MODEL_CUDA_GPT_DEVICE_H_
