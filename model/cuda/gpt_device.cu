// GptDevice (gpt_device.h): GptCuda<float> or GptCuda<__nv_bfloat16> on cudaMalloc memory,
// cuBLASLt GEMMs and a stream of its own, behind a header the plain C++ compiler can read.
#include "gpt_device.h"

// clang-format off
#include "gpt.cuh"  // first of the CUDA headers, as gpt.cuh asks
// clang-format on

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator.h"
#include "array_ops_cuda.h"
#include "check.h"
#include "troupe/base/status_macros.h"

namespace troupe::model::cuda {

// The GPT's training step (gpt.cuh), host code included, for fp32 and for bf16 activations with
// fp32 master weights: instantiated here once, for the GPU (kernels.cu holds the single ops).
template class GptCuda<float>;
template class GptCuda<__nv_bfloat16>;

class GptDevice::Impl {
 public:
  Impl(const model::GptConfig& config, int ordinal, cudaStream_t stream)
      : config_(config), ordinal_(ordinal), stream_(stream) {}
  ~Impl() {
    // The model's memory, cuBLASLt handle and workspace go first (cudaFree waits for the
    // device), then its stream; on the device they were made on.
    (void)cudaSetDevice(ordinal_);
    ops_.reset();  // its arrays are gone by now (the header's rule); it does not own the stream
    f32_.reset();
    bf16_.reset();
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Makes the device current, then calls f on the model; R is absl::Status or StatusOr<…>.
  template <typename R, typename F>
  R Call(F&& f) const {
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    if (f32_ != nullptr) return f(*f32_);
    return f(*bf16_);
  }
  absl::Status MakeCurrent() const {
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaSetDevice(ordinal_)));
    return absl::OkStatus();
  }

  const model::GptConfig& config() const { return config_; }
  int ordinal() const { return ordinal_; }
  bool bf16() const { return bf16_ != nullptr; }
  int64_t num_params() const { return f32_ != nullptr ? f32_->num_params() : bf16_->num_params(); }
  float* params() { return f32_ != nullptr ? f32_->params() : bf16_->params(); }
  model::ArrayOps& ops() { return *ops_; }
  absl::Status Synchronize() const {
    TROUPE_RETURN_IF_ERROR(MakeCurrent());
    TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaStreamSynchronize(stream_)));
    return absl::OkStatus();
  }

  // The trainer's array operations, on this object's stream.
  absl::Status BuildArrayOps() {
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<model::ArrayOps> ops,
                            CreateCudaArrayOpsOnStream(ordinal_, stream_));
    ops_ = std::move(ops);
    return absl::OkStatus();
  }

  template <typename Tx>
  absl::Status Build() {
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBackend> backend, CudaMemoryBackend(ordinal_));
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<MatmulExecutor> matmul, MatmulRunnerExecutor::Create());
    TROUPE_ASSIGN_OR_RETURN(
        auto gpt, GptCuda<Tx>::Create(config_, std::move(backend), std::move(matmul), stream_));
    if constexpr (std::is_same_v<Tx, float>) {
      f32_ = std::move(gpt);
    } else {
      bf16_ = std::move(gpt);
    }
    return absl::OkStatus();
  }

 private:
  model::GptConfig config_;
  int ordinal_;
  cudaStream_t stream_;
  std::unique_ptr<GptCuda<float>> f32_;
  std::unique_ptr<GptCuda<__nv_bfloat16>> bf16_;
  std::unique_ptr<model::ArrayOps> ops_;
};

absl::StatusOr<std::unique_ptr<GptDevice>> GptDevice::Create(const model::GptConfig& config,
                                                             int device_ordinal, bool bf16) {
  // The device first, so that a machine without a driver answers at once, naming the cause.
  TROUPE_RETURN_IF_ERROR(UseKernelDevice("GptDevice", device_ordinal));
  TROUPE_RETURN_IF_ERROR(config.Validate());
  // A blocking stream (not cudaStreamNonBlocking): MatmulRunner fills its vectors of ones with
  // plain cudaMemcpy on the legacy default stream, which a blocking stream's later work waits for.
  cudaStream_t stream = nullptr;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_CALL(cudaStreamCreate(&stream)));
  auto impl = std::make_unique<Impl>(config, device_ordinal, stream);  // owns the stream now
  TROUPE_RETURN_IF_ERROR(bf16 ? impl->Build<__nv_bfloat16>() : impl->Build<float>());
  TROUPE_RETURN_IF_ERROR(impl->BuildArrayOps());
  return std::unique_ptr<GptDevice>(new GptDevice(std::move(impl)));
}

GptDevice::GptDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GptDevice::~GptDevice() = default;

const model::GptConfig& GptDevice::config() const { return impl_->config(); }
int64_t GptDevice::num_params() const { return impl_->num_params(); }
int GptDevice::device_ordinal() const { return impl_->ordinal(); }
bool GptDevice::bf16() const { return impl_->bf16(); }

std::string GptDevice::DeviceName() const {
  cudaDeviceProp prop = {};
  if (cudaGetDeviceProperties(&prop, impl_->ordinal()) != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::StrCat("cuda:", impl_->ordinal());
  }
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ")");
}

absl::Status GptDevice::InitParams(uint64_t seed) {
  return impl_->Call<absl::Status>([&](auto& g) { return g.InitParams(seed); });
}
absl::Status GptDevice::SetParams(const float* host) {
  return impl_->Call<absl::Status>([&](auto& g) { return g.SetParams(host); });
}
absl::Status GptDevice::GetParams(float* host) const {
  return impl_->Call<absl::Status>([&](auto& g) { return g.GetParams(host); });
}
absl::Status GptDevice::SetOptimizerState(const float* m, const float* v) {
  return impl_->Call<absl::Status>([&](auto& g) { return g.SetOptimizerState(m, v); });
}
absl::Status GptDevice::GetOptimizerState(float* m, float* v) const {
  return impl_->Call<absl::Status>([&](auto& g) { return g.GetOptimizerState(m, v); });
}
absl::StatusOr<double> GptDevice::Forward(const int32_t* tokens, const int32_t* targets, int b,
                                          int t) {
  return impl_->Call<absl::StatusOr<double>>(
      [&](auto& g) { return g.Forward(tokens, targets, b, t); });
}
absl::Status GptDevice::ZeroGrad() {
  return impl_->Call<absl::Status>([&](auto& g) { return g.ZeroGrad(); });
}
absl::Status GptDevice::Backward(float loss_weight, const RangeReady& ready) {
  return impl_->Call<absl::Status>([&](auto& g) { return g.Backward(loss_weight, ready); });
}
absl::Status GptDevice::GetGrads(float* host) const {
  return impl_->Call<absl::Status>([&](auto& g) { return g.GetGrads(host); });
}
absl::StatusOr<double> GptDevice::GradNorm() {
  return impl_->Call<absl::StatusOr<double>>([&](auto& g) { return g.GradNorm(); });
}
absl::StatusOr<double> GptDevice::Step(const model::AdamWConfig& adamw,
                                       const model::LrSchedule& schedule, int64_t step) {
  return impl_->Call<absl::StatusOr<double>>(
      [&](auto& g) { return g.Step(adamw, schedule, step); });
}

float* GptDevice::device_params() { return impl_->params(); }
absl::StatusOr<const float*> GptDevice::Fp32Grads() {
  return impl_->Call<absl::StatusOr<const float*>>([&](auto& g) { return g.Fp32Grads(); });
}
absl::Status GptDevice::ParamsChanged() {
  return impl_->Call<absl::Status>([&](auto& g) { return g.ParamsChanged(); });
}
absl::Status GptDevice::Synchronize() { return impl_->Synchronize(); }
model::ArrayOps& GptDevice::array_ops() { return impl_->ops(); }

}  // namespace troupe::model::cuda
