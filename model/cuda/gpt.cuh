// The GPT-2 decoder's training step on the CUDA kernels: forward, backward, gradient norm and
// AdamW, as one launch sequence written once. Compiled by nvcc it runs on the GPU (kernels launched
// with <<<>>>, GEMMs on cuBLASLt); compiled by g++ it runs on the CPU through the SIMT layer
// (simt.h), the GEMMs computed by ReferenceMatmul from the very cuBLASLt descriptors the GPU path
// builds (matmul_lt.h). Which of the two is set by the compiler and by the two pluggable pieces
// handed to Create: the MatmulExecutor and the allocator's MemoryBackend.
//
// Conventions, those of the CPU model (troupe/model/gpt.h), so that checkpoints move between CPU
// and GPU runs: parameters, gradients and the AdamW moments are flat buffers in ParamLayout's
// order (the same offsets); the parameters are fp32 master weights; Backward adds (+=) to the
// gradients the gradient of loss_weight · Σ per-token losses of the last Forward (ZeroGrad first);
// the gradient norm is sqrt(TreeSum(kNormChunk chunk sums)) and AdamW applies weight decay to the
// tensors with ParamTensor::decay, both bit-identical to model/optimizer.h for the same fp32
// gradients. Tx is the storage type of activations, gradients and the weights the kernels read:
// float (those are then the master weights), or __nv_bfloat16 (a bf16 copy of the master weights,
// refreshed by SetParams and by every AdamW update).
// The sequence (per layer; fused residual + LayerNorm where a residual feeds a LayerNorm):
//   forward:  embedding → [ln1 (fused with the previous block's residual) → qkv GEMM + bias →
//             attention → proj GEMM + bias → residual + ln2 (fused) → fc GEMM + bias + GELU
//             (epilogue GELU_AUX_BIAS: the pre-GELU values go to the aux matrix) → fcproj GEMM
//             + bias] × L → residual + ln_f (fused) → logits = ln_f · wteᵀ (tied) → cross-entropy
//             (losses, lse);
//   backward: the reverse, the fcproj input gradient through the DGELU epilogue, each GEMM's input
//             gradient written (beta = 0) and its weight / bias gradients accumulated (beta = 1),
//             the residual stream's gradient accumulated by the LayerNorm backwards; dwte receives
//             both the logits GEMM's and the embedding's gradient (tied embeddings).
// Not thread-safe; one stream. Forward, GradNorm and Step wait for the stream (they return host
// values); the other calls only enqueue work.
//
// Example (GPU, in a .cu file; on the CPU: HostMemoryBackend() and ReferenceMatmulExecutor):
//   auto backend = CudaMemoryBackend();
//   auto matmul = MatmulRunnerExecutor::Create();
//   auto gpt = GptCuda<float>::Create(GptConfig::Tiny(512), std::move(*backend),
//                                     std::move(*matmul), stream);
//   TROUPE_RETURN_IF_ERROR((*gpt)->InitParams(/*seed=*/42));
//   absl::StatusOr<double> loss = (*gpt)->Forward(inputs, targets, B, T);  // host token arrays
//   TROUPE_RETURN_IF_ERROR((*gpt)->ZeroGrad());
//   TROUPE_RETURN_IF_ERROR((*gpt)->Backward(1.0f / (B * T)));
//   absl::StatusOr<double> grad_norm = (*gpt)->Step(adamw, schedule, step);
#ifndef TROUPE_MODEL_CUDA_GPT_CUH_
#define TROUPE_MODEL_CUDA_GPT_CUH_

// clang-format off
// First: under g++ the SIMT layer (simt.h) must define __device__ & co. before any CUDA header
// (cuda_runtime_api.h, cublasLt.h via matmul_lt.h and check.h) does.
#include "device.cuh"
// clang-format on

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "adamw.cuh"
#include "allocator.h"
#include "attention.cuh"
#include "check.h"
#include "crossentropy.cuh"
#include "embedding.cuh"
#include "gelu.cuh"
#include "gpt_internal.cuh"
#include "layernorm.cuh"
#include "matmul_lt.h"
#include "norm.cuh"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/config.h"
#include "troupe/model/gpt.h"
#include "troupe/model/optimizer.h"

namespace troupe::model::cuda {

// The GPU model sits on kernels/cuda: the per-op kernels, device.cuh, the allocator and the
// cuBLASLt plans.
using namespace ::troupe::kernels::cuda;  // NOLINT(build/namespaces)
using ::troupe::kernels::AdamWScalars;
using ::troupe::kernels::kNormChunk;

// Runs one linear layer's GEMM (matmul_lt.h's shapes and buffer roles) on `stream`.
class MatmulExecutor {
 public:
  virtual ~MatmulExecutor() = default;
  virtual absl::Status Run(const MatmulShape& shape, const MatmulBuffers& buffers,
                           cudaStream_t stream) = 0;
};

// On the GPU: cuBLASLt through MatmulRunner (device pointers).
class MatmulRunnerExecutor final : public MatmulExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<MatmulExecutor>> Create(
      size_t workspace_bytes = kDefaultMatmulWorkspaceBytes) {
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<MatmulRunner> runner,
                            MatmulRunner::Create(workspace_bytes));
    return std::unique_ptr<MatmulExecutor>(new MatmulRunnerExecutor(std::move(runner)));
  }
  absl::Status Run(const MatmulShape& shape, const MatmulBuffers& buffers,
                   cudaStream_t stream) override {
    return runner_->Run(shape, buffers, stream);
  }

 private:
  explicit MatmulRunnerExecutor(std::unique_ptr<MatmulRunner> runner)
      : runner_(std::move(runner)) {}
  std::unique_ptr<MatmulRunner> runner_;
};

// On the CPU: what cublasLtMatmul computes for the same plan (host pointers; no stream).
class ReferenceMatmulExecutor final : public MatmulExecutor {
 public:
  absl::Status Run(const MatmulShape& shape, const MatmulBuffers& buffers,
                   cudaStream_t /*stream*/) override {
    return ReferenceMatmul(shape, buffers);
  }
};

struct GptCudaOptions {
  // The fc layer's GELU as a cuBLASLt epilogue (GELU_AUX_BIAS forward, DGELU backward) where the
  // aux matrix allows it (4C a multiple of 8); otherwise, or when false, GEMM + the GELU kernels.
  bool gelu_epilogue = true;
};

template <typename Tx>
class GptCuda {
 public:
  // The backward pass's reports of finished gradient ranges (Backward).
  using RangeReady = model::GptModel<float>::RangeReady;
  // InvalidArgument for an invalid config. The memory backend and the executor must agree
  // (device memory and MatmulRunnerExecutor, or host memory and ReferenceMatmulExecutor).
  static absl::StatusOr<std::unique_ptr<GptCuda>> Create(const model::GptConfig& config,
                                                         std::unique_ptr<MemoryBackend> backend,
                                                         std::unique_ptr<MatmulExecutor> matmul,
                                                         Stream stream,
                                                         const GptCudaOptions& options = {}) {
    TROUPE_RETURN_IF_ERROR(config.Validate());
    if (backend == nullptr || matmul == nullptr) {
      return absl::InvalidArgumentError("GptCuda::Create: null memory backend or matmul executor");
    }
    std::unique_ptr<GptCuda> gpt(
        new GptCuda(config, std::move(backend), std::move(matmul), stream, options));
    TROUPE_RETURN_IF_ERROR(gpt->AllocateParams());
    return gpt;
  }
  ~GptCuda() = default;  // the allocator returns every block to the backend
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  const model::GptConfig& config() const { return config_; }
  const model::ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total_size(); }
  bool gelu_epilogue() const { return gelu_epilogue_; }
  const CachingAllocator& allocator() const { return *alloc_; }

  // Device buffers in ParamLayout order: fp32 master weights, the Tx weights the kernels read
  // (params() itself when Tx is float), Tx gradients, fp32 AdamW moments.
  float* params() { return params_; }
  const Tx* params_x() const { return params_x_; }
  Tx* grads() { return grads_; }
  float* adam_m() { return m_; }
  float* adam_v() { return v_; }
  const Tx* logits() const { return acts_.logits; }  // [b, t, V] of the last Forward
  const float* losses() const { return acts_.losses; }

  // After params() was written in place (not through SetParams): refreshes the Tx copy the
  // kernels read (enqueued); nothing to do when Tx is float.
  absl::Status ParamsChanged() { return RefreshParamsX(); }

  // Copies num_params() fp32 host values in (and refreshes the Tx copy) or out.
  absl::Status SetParams(const float* host) {
    const size_t bytes = static_cast<size_t>(num_params()) * sizeof(float);
    TROUPE_RETURN_IF_ERROR(gpt_internal::ToDevice(params_, host, bytes, stream_));
    return RefreshParamsX();
  }
  absl::Status GetParams(float* host) const {
    return gpt_internal::ToHost(host, params_, num_params() * sizeof(float), stream_);
  }
  // The CPU model's initialisation (GptModel<float>::InitParams), copied in.
  absl::Status InitParams(uint64_t seed) {
    TROUPE_ASSIGN_OR_RETURN(model::GptModel<float> cpu, model::GptModel<float>::Create(config_));
    cpu.InitParams(seed);
    return SetParams(cpu.params());
  }
  // The gradients, as float.
  absl::Status GetGrads(float* host) const { return CopyOut(host, grads_, num_params()); }
  // The gradients as num_params() fp32 values in this model's memory, for a trainer that sums
  // them in fp32 (the elastic step): grads() itself when Tx is float; otherwise a buffer allocated
  // at the first call and kept, into which the Tx gradients are widened (enqueued on the stream,
  // so ordered before the caller's next work on it). Valid until the next Backward or ZeroGrad.
  absl::StatusOr<const float*> Fp32Grads() {
    TROUPE_RETURN_IF_ERROR(WidenGrads(0, num_params()));
    return Fp32GradsBuffer();
  }
  // AdamW moments in or out (checkpoints): num_params() floats each.
  absl::Status SetOptimizerState(const float* m, const float* v) {
    const size_t bytes = static_cast<size_t>(num_params()) * sizeof(float);
    TROUPE_RETURN_IF_ERROR(gpt_internal::ToDevice(m_, m, bytes, stream_));
    return gpt_internal::ToDevice(v_, v, bytes, stream_);
  }
  absl::Status GetOptimizerState(float* m, float* v) const {
    const size_t bytes = static_cast<size_t>(num_params()) * sizeof(float);
    TROUPE_RETURN_IF_ERROR(gpt_internal::ToHost(m, m_, bytes, stream_));
    return gpt_internal::ToHost(v, v_, bytes, stream_);
  }

  // Runs the model on host tokens [b, t]; with targets, returns the mean per-token loss, without
  // (nullptr) computes the logits only and returns 0. Errors as GptModel::Forward's.
  absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets, int b, int t) {
    if (b <= 0 || t <= 0 || t > config_.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("Forward: expected batch > 0 and 0 < seq_len <= ", config_.context_length,
                       ", got batch=", b, " seq_len=", t));
    }
    const int64_t bt = int64_t{b} * t;
    TROUPE_RETURN_IF_ERROR(CheckIds("tokens", tokens, bt));
    if (targets != nullptr) {
      TROUPE_RETURN_IF_ERROR(CheckIds("targets", targets, bt));
    }
    TROUPE_RETURN_IF_ERROR(EnsureActivations(b, t));
    have_targets_ = false;
    TROUPE_RETURN_IF_ERROR(
        gpt_internal::ToDevice(acts_.tokens, tokens, bt * sizeof(int32_t), stream_));
    if (targets != nullptr) {
      TROUPE_RETURN_IF_ERROR(
          gpt_internal::ToDevice(acts_.targets, targets, bt * sizeof(int32_t), stream_));
    }
    TROUPE_RETURN_IF_ERROR(RunForward());
    if (targets == nullptr) return 0.0;
    TROUPE_RETURN_IF_ERROR(crossentropy_forward(acts_.losses, acts_.ce_lse, acts_.logits,
                                                acts_.targets, bt, config_.vocab_size, stream_));
    have_targets_ = true;
    std::vector<float> losses(bt);
    TROUPE_RETURN_IF_ERROR(
        gpt_internal::ToHost(losses.data(), acts_.losses, bt * sizeof(float), stream_));
    double sum = 0;  // as the CPU model: in double, in token order
    for (int64_t i = 0; i < bt; ++i) sum += losses[i];
    return sum / static_cast<double>(bt);
  }

  absl::Status ZeroGrad() { return gpt_internal::Zero(grads_, num_params() * sizeof(Tx), stream_); }

  // grads += d(loss_weight · Σ losses)/dθ of the last Forward. FailedPrecondition unless it had
  // targets. `ready`, when given, is called with each flat range [begin, end) as soon as the work
  // that finishes its gradient is enqueued — the CPU model's ranges in its order (ln_f, each block
  // from the last to the first, then the embeddings; model::GptModel::Backward) — and, for a bf16
  // model, that range's widening into the Fp32Grads() buffer after it: a trainer exchanges those
  // ranges of Fp32Grads() while the rest of the pass is enqueued and runs. With `ready`, every
  // gradient is reported, so Fp32Grads() need not be called again for this pass (its pointer does
  // not change).
  absl::Status Backward(float loss_weight, const RangeReady& ready = {}) {
    if (!have_targets_) {
      return absl::FailedPreconditionError("Backward: the last Forward had no targets");
    }
    if (ready) TROUPE_RETURN_IF_ERROR(Fp32GradsBuffer().status());  // allocated before a report
    return RunBackward(loss_weight, ready);
  }

  // sqrt(TreeSum(chunk square sums)) of the gradients: model::GradNorm's bits for fp32 grads.
  absl::StatusOr<double> GradNorm() {
    const int64_t n = num_params();
    TROUPE_RETURN_IF_ERROR(chunk_square_sums(chunk_sums_, grads_, n, stream_));
    std::vector<double> sums(CeilDiv(n, kNormChunk));
    TROUPE_RETURN_IF_ERROR(
        gpt_internal::ToHost(sums.data(), chunk_sums_, sums.size() * sizeof(double), stream_));
    return model::GradNormFromChunks(sums);
  }

  // AdamW over the whole buffer with these scalars; no weight decay where the tensor has none
  // (model::AdamWUpdateRange's rule). One launch per tensor.
  absl::Status Update(const AdamWScalars& scalars) {
    for (const model::ParamTensor& t : layout_.tensors()) {
      AdamWScalars s = scalars;
      if (!t.decay) s.weight_decay = 0;
      __nv_bfloat16* copy = nullptr;
      if constexpr (std::is_same_v<Tx, __nv_bfloat16>) copy = params_x_ + t.offset;
      TROUPE_RETURN_IF_ERROR(adamw_update(params_ + t.offset, copy, grads_ + t.offset,
                                          m_ + t.offset, v_ + t.offset, t.size, s, stream_));
    }
    return absl::OkStatus();
  }

  // One optimizer step of 0-based step `step` as model::Trainer takes it: the global gradient
  // norm, the step's scalars (clip factor, schedule, bias corrections), AdamW. Returns the norm.
  absl::StatusOr<double> Step(const model::AdamWConfig& adamw, const model::LrSchedule& schedule,
                              int64_t step) {
    TROUPE_ASSIGN_OR_RETURN(double norm, GradNorm());
    TROUPE_RETURN_IF_ERROR(Update(model::StepScalars(adamw, schedule, step, norm)));
    return norm;
  }

 private:
  // Per-(B, T) buffers; per-layer ones hold L consecutive slices.
  struct Activations {
    int32_t *tokens = nullptr, *targets = nullptr;
    Tx* encoded = nullptr;                                      // [bt, c]
    Tx *ln1 = nullptr, *ln2 = nullptr, *atty = nullptr;         // [L, bt, c]
    Tx *res2 = nullptr, *res3 = nullptr;                        // [L, bt, c]
    Tx* qkv = nullptr;                                          // [L, bt, 3c]
    Tx *fch = nullptr, *fch_gelu = nullptr;                     // [L, bt, 4c] pre- and post-GELU
    float *ln1_mean = nullptr, *ln1_rstd = nullptr;             // [L, bt]
    float *ln2_mean = nullptr, *ln2_rstd = nullptr;             // [L, bt]
    float* att_lse = nullptr;                                   // [L, b, nh, t]
    Tx* lnf = nullptr;                                          // [bt, c]
    float *lnf_mean = nullptr, *lnf_rstd = nullptr;             // [bt]
    Tx* logits = nullptr;                                       // [bt, V]
    float *losses = nullptr, *ce_lse = nullptr;                 // [bt]
    Tx* proj = nullptr;                                         // [bt, c]: attn / MLP output
    Tx *dresidual = nullptr, *dln = nullptr, *datty = nullptr;  // [bt, c]
    Tx* dqkv = nullptr;                                         // [bt, 3c]
    Tx *dfch = nullptr, *dfch_gelu = nullptr;                   // [bt, 4c]
    Tx* dlogits = nullptr;                                      // [bt, V]
    float* ln_scratch = nullptr;     // layernorm_backward_scratch_floats(bt, c)
    float* att_workspace = nullptr;  // attention_workspace_bytes
  };

  GptCuda(const model::GptConfig& config, std::unique_ptr<MemoryBackend> backend,
          std::unique_ptr<MatmulExecutor> matmul, Stream stream, const GptCudaOptions& options)
      : config_(config),
        layout_(config),
        alloc_(std::make_unique<CachingAllocator>(std::move(backend))),
        matmul_(std::move(matmul)),
        stream_(stream),
        gelu_epilogue_(options.gelu_epilogue && (4 * int64_t{config.width}) % 8 == 0) {}

  absl::Status AllocateParams() {
    const int64_t n = num_params();
    params_arena_.Add(params_, n);
    if constexpr (std::is_same_v<Tx, __nv_bfloat16>) params_arena_.Add(params_x_, n);
    params_arena_.Add(grads_, n);
    params_arena_.Add(m_, n);
    params_arena_.Add(v_, n);
    params_arena_.Add(chunk_sums_, CeilDiv(n, kNormChunk));
    TROUPE_RETURN_IF_ERROR(params_arena_.Allocate(*alloc_));
    if constexpr (std::is_same_v<Tx, float>) params_x_ = params_;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    absl::Status s = gpt_internal::Zero(params_, bytes, stream_);
    s.Update(RefreshParamsX());
    s.Update(gpt_internal::Zero(grads_, n * sizeof(Tx), stream_));
    s.Update(gpt_internal::Zero(m_, bytes, stream_));
    s.Update(gpt_internal::Zero(v_, bytes, stream_));
    return s;
  }

  absl::Status RefreshParamsX() {
    if constexpr (std::is_same_v<Tx, float>) {
      return absl::OkStatus();
    } else {
      const int64_t n = num_params();
      return TROUPE_LAUNCH(gpt_internal::gpt_from_float_kernel<Tx>,
                           dim3(CeilDiv(n, gpt_internal::kConvertBlock)),
                           dim3(gpt_internal::kConvertBlock), 0, stream_, params_x_, params_, n);
    }
  }

  absl::Status CopyOut(float* host, const Tx* device, int64_t n) const {
    if constexpr (std::is_same_v<Tx, float>) {
      return gpt_internal::ToHost(host, device, n * sizeof(float), stream_);
    } else {
      std::vector<Tx> raw(n);
      TROUPE_RETURN_IF_ERROR(gpt_internal::ToHost(raw.data(), device, n * sizeof(Tx), stream_));
      for (int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(raw[i]);
      return absl::OkStatus();
    }
  }

  absl::Status CheckIds(const char* what, const int32_t* ids, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, "[", i, "]: expected a token id in [0, ", config_.vocab_size, "), got ", ids[i]));
      }
    }
    return absl::OkStatus();
  }

  absl::Status EnsureActivations(int b, int t) {
    if (b == b_ && t == t_) return absl::OkStatus();
    if (b_ != 0) {
      TROUPE_RETURN_IF_ERROR(acts_arena_.Free(*alloc_));
      acts_ = Activations();
      b_ = t_ = 0;
    }
    const int64_t bt = int64_t{b} * t, c = config_.width, l = config_.num_layers;
    const int64_t v = config_.vocab_size, nh = config_.num_heads;
    Activations& a = acts_;
    gpt_internal::Arena& r = acts_arena_;
    r.Add(a.tokens, bt);
    r.Add(a.targets, bt);
    r.Add(a.encoded, bt * c);
    for (Tx** p : {&a.ln1, &a.ln2, &a.atty, &a.res2, &a.res3}) r.Add(*p, l * bt * c);
    r.Add(a.qkv, l * bt * 3 * c);
    r.Add(a.fch, l * bt * 4 * c);
    r.Add(a.fch_gelu, l * bt * 4 * c);
    for (float** p : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) r.Add(*p, l * bt);
    r.Add(a.att_lse, l * b * nh * t);
    r.Add(a.lnf, bt * c);
    r.Add(a.lnf_mean, bt);
    r.Add(a.lnf_rstd, bt);
    r.Add(a.logits, bt * v);
    r.Add(a.losses, bt);
    r.Add(a.ce_lse, bt);
    for (Tx** p : {&a.proj, &a.dresidual, &a.dln, &a.datty}) r.Add(*p, bt * c);
    r.Add(a.dqkv, bt * 3 * c);
    r.Add(a.dfch, bt * 4 * c);
    if (!gelu_epilogue_) r.Add(a.dfch_gelu, bt * 4 * c);
    r.Add(a.dlogits, bt * v);
    r.Add(a.ln_scratch, layernorm_backward_scratch_floats(bt, c));
    r.Add(a.att_workspace, CeilDiv(attention_workspace_bytes(b, t, c, nh), sizeof(float)));
    TROUPE_RETURN_IF_ERROR(r.Allocate(*alloc_));
    b_ = b;
    t_ = t;
    return absl::OkStatus();
  }

  // One GEMM; the plan promises the alignment the pointers have.
  absl::Status Matmul(MatmulShape shape, const MatmulBuffers& buffers) {
    shape.alignment = gpt_internal::AlignmentOf(buffers);
    return matmul_->Run(shape, buffers, static_cast<cudaStream_t>(stream_));
  }
  // out [n, oc] = inp [n, c] · weightᵀ (+ bias).
  absl::Status Linear(Tx* out, const Tx* inp, const Tx* weight, const Tx* bias, int64_t n,
                      int64_t c, int64_t oc) {
    MatmulBuffers mb;
    mb.out = out, mb.inp = inp, mb.weight = weight, mb.bias = bias;
    return Matmul(MatmulShape::Forward(n, c, oc, bias != nullptr, /*gelu=*/false, kDtype), mb);
  }
  // dinp = dout · weight (overwritten), dweight += doutᵀ · inp, dbias += Σ_rows dout.
  absl::Status LinearBackward(Tx* dinp, Tx* dweight, Tx* dbias, const Tx* dout, const Tx* inp,
                              const Tx* weight, int64_t n, int64_t c, int64_t oc) {
    MatmulShape input = MatmulShape::BackwardInput(n, c, oc, /*dgelu=*/false, kDtype);
    input.accumulate = false;
    MatmulBuffers mb;
    mb.out = dinp, mb.dout = dout, mb.weight = weight;
    TROUPE_RETURN_IF_ERROR(Matmul(input, mb));
    return WeightAndBiasBackward(dweight, dbias, dout, inp, n, c, oc);
  }
  absl::Status WeightAndBiasBackward(Tx* dweight, Tx* dbias, const Tx* dout, const Tx* inp,
                                     int64_t n, int64_t c, int64_t oc) {
    MatmulBuffers mw;
    mw.out = dweight, mw.dout = dout, mw.inp = inp;
    TROUPE_RETURN_IF_ERROR(Matmul(MatmulShape::BackwardWeight(n, c, oc, kDtype), mw));
    if (dbias == nullptr) return absl::OkStatus();
    MatmulBuffers mbias;
    mbias.out = dbias, mbias.dout = dout;
    return Matmul(MatmulShape::BackwardBias(n, oc, kDtype), mbias);
  }

  // Layer l's slice of a per-layer buffer.
  template <typename T>
  static T* Layer(T* base, int l, int64_t per_layer) {
    return base + l * per_layer;
  }

  absl::Status RunForward() {
    const int64_t b = b_, t = t_, bt = b * t, c = config_.width, nh = config_.num_heads;
    const int64_t v = config_.vocab_size, L = config_.num_layers;
    const Tx* p = params_x_;
    Activations& a = acts_;
    TROUPE_RETURN_IF_ERROR(embedding_forward(a.encoded, a.tokens, p + layout_.wte(),
                                             p + layout_.wpe(), b, t, c, stream_));
    for (int l = 0; l < L; ++l) {
      const model::BlockOffsets& o = layout_.block(l);
      const Tx* residual = l == 0 ? a.encoded : Layer(a.res3, l - 1, bt * c);
      Tx* ln1 = Layer(a.ln1, l, bt * c);
      float *ln1_mean = Layer(a.ln1_mean, l, bt), *ln1_rstd = Layer(a.ln1_rstd, l, bt);
      Tx* qkv = Layer(a.qkv, l, bt * 3 * c);
      Tx* atty = Layer(a.atty, l, bt * c);
      Tx* ln2 = Layer(a.ln2, l, bt * c);
      Tx* fch = Layer(a.fch, l, bt * 4 * c);
      Tx* fch_gelu = Layer(a.fch_gelu, l, bt * 4 * c);
      if (l == 0) {
        TROUPE_RETURN_IF_ERROR(layernorm_forward(ln1, ln1_mean, ln1_rstd, a.encoded, p + o.ln1_w,
                                                 p + o.ln1_b, bt, c, stream_));
      } else {  // the previous block's second residual, fused: res3 = res2 + its MLP output
        TROUPE_RETURN_IF_ERROR(fused_residual_layernorm_forward(
            Layer(a.res3, l - 1, bt * c), ln1, ln1_mean, ln1_rstd, Layer(a.res2, l - 1, bt * c),
            a.proj, p + o.ln1_w, p + o.ln1_b, bt, c, stream_));
      }
      TROUPE_RETURN_IF_ERROR(Linear(qkv, ln1, p + o.qkv_w, p + o.qkv_b, bt, c, 3 * c));
      TROUPE_RETURN_IF_ERROR(
          attention_forward(atty, Layer(a.att_lse, l, b * nh * t), qkv, b, t, c, nh, stream_));
      TROUPE_RETURN_IF_ERROR(Linear(a.proj, atty, p + o.proj_w, p + o.proj_b, bt, c, c));
      TROUPE_RETURN_IF_ERROR(fused_residual_layernorm_forward(
          Layer(a.res2, l, bt * c), ln2, Layer(a.ln2_mean, l, bt), Layer(a.ln2_rstd, l, bt),
          residual, a.proj, p + o.ln2_w, p + o.ln2_b, bt, c, stream_));
      if (gelu_epilogue_) {
        MatmulBuffers mb;
        mb.out = fch_gelu, mb.inp = ln2, mb.weight = p + o.fc_w, mb.bias = p + o.fc_b;
        mb.pre_gelu = fch;
        TROUPE_RETURN_IF_ERROR(
            Matmul(MatmulShape::Forward(bt, c, 4 * c, /*bias=*/true, /*gelu=*/true, kDtype), mb));
      } else {
        TROUPE_RETURN_IF_ERROR(Linear(fch, ln2, p + o.fc_w, p + o.fc_b, bt, c, 4 * c));
        TROUPE_RETURN_IF_ERROR(gelu_forward(fch_gelu, fch, bt * 4 * c, stream_));
      }
      TROUPE_RETURN_IF_ERROR(
          Linear(a.proj, fch_gelu, p + o.fcproj_w, p + o.fcproj_b, bt, 4 * c, c));
    }
    TROUPE_RETURN_IF_ERROR(fused_residual_layernorm_forward(
        Layer(a.res3, L - 1, bt * c), a.lnf, a.lnf_mean, a.lnf_rstd, Layer(a.res2, L - 1, bt * c),
        a.proj, p + layout_.lnf_w(), p + layout_.lnf_b(), bt, c, stream_));
    return Linear(a.logits, a.lnf, p + layout_.wte(), nullptr, bt, c, v);  // tied: wte
  }

  // Where Fp32Grads() puts the gradients, without widening them: grads() when Tx is float, else
  // the widened buffer, allocated at the first call and kept for the object's life.
  absl::StatusOr<const float*> Fp32GradsBuffer() {
    if constexpr (std::is_same_v<Tx, float>) {
      return grads_;
    } else {
      if (grads_f32_ == nullptr) {
        grads_f32_arena_.Add(grads_f32_, num_params());
        TROUPE_RETURN_IF_ERROR(grads_f32_arena_.Allocate(*alloc_));
      }
      return static_cast<const float*>(grads_f32_);
    }
  }
  // Widens grads()[begin, end) into the Fp32GradsBuffer() (enqueued); nothing when Tx is float.
  absl::Status WidenGrads(int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<Tx, float>) {
      return absl::OkStatus();
    } else {
      TROUPE_RETURN_IF_ERROR(Fp32GradsBuffer().status());
      const int64_t n = end - begin;
      return TROUPE_LAUNCH(
          gpt_internal::gpt_to_float_kernel<Tx>, dim3(CeilDiv(n, gpt_internal::kConvertBlock)),
          dim3(gpt_internal::kConvertBlock), 0, stream_, grads_f32_ + begin, grads_ + begin, n);
    }
  }

  absl::Status RunBackward(float loss_weight, const RangeReady& ready) {
    const int64_t b = b_, t = t_, bt = b * t, c = config_.width, nh = config_.num_heads;
    const int64_t v = config_.vocab_size, L = config_.num_layers;
    const Tx* p = params_x_;
    Tx* g = grads_;
    Activations& a = acts_;
    auto report = [&](std::pair<int64_t, int64_t> r) -> absl::Status {
      if (!ready) return absl::OkStatus();
      TROUPE_RETURN_IF_ERROR(WidenGrads(r.first, r.second));
      ready(r.first, r.second);
      return absl::OkStatus();
    };
    TROUPE_RETURN_IF_ERROR(gpt_internal::Zero(a.dlogits, bt * v * sizeof(Tx), stream_));
    TROUPE_RETURN_IF_ERROR(crossentropy_backward(a.dlogits, a.logits, a.ce_lse, a.targets,
                                                 loss_weight, bt, v, stream_));
    // Tied embeddings: dwte gets the logits GEMM's weight gradient here, the embedding's last.
    TROUPE_RETURN_IF_ERROR(LinearBackward(a.dln, g + layout_.wte(), nullptr, a.dlogits, a.lnf,
                                          p + layout_.wte(), bt, c, v));
    TROUPE_RETURN_IF_ERROR(gpt_internal::Zero(a.dresidual, bt * c * sizeof(Tx), stream_));
    TROUPE_RETURN_IF_ERROR(layernorm_backward(
        a.dresidual, g + layout_.lnf_w(), g + layout_.lnf_b(), a.ln_scratch, a.dln,
        Layer(a.res3, L - 1, bt * c), p + layout_.lnf_w(), a.lnf_mean, a.lnf_rstd, bt, c, stream_));
    TROUPE_RETURN_IF_ERROR(report(layout_.final_norm_range()));  // wte: at the end
    // a.dresidual holds d res3 of the layer being processed; the LayerNorm backwards add the
    // gradients that flow around each residual connection.
    for (int l = static_cast<int>(L) - 1; l >= 0; --l) {
      const model::BlockOffsets& o = layout_.block(l);
      const Tx* residual = l == 0 ? a.encoded : Layer(a.res3, l - 1, bt * c);
      Tx* fch = Layer(a.fch, l, bt * 4 * c);
      const Tx* fch_gelu = Layer(a.fch_gelu, l, bt * 4 * c);
      const Tx* atty = Layer(a.atty, l, bt * c);
      // MLP output layer; its input gradient goes through GELU' to d fch.
      if (gelu_epilogue_) {
        MatmulBuffers mb;
        mb.out = a.dfch, mb.dout = a.dresidual, mb.weight = p + o.fcproj_w, mb.pre_gelu = fch;
        TROUPE_RETURN_IF_ERROR(
            Matmul(MatmulShape::BackwardInput(bt, 4 * c, c, /*dgelu=*/true, kDtype), mb));
        TROUPE_RETURN_IF_ERROR(WeightAndBiasBackward(g + o.fcproj_w, g + o.fcproj_b, a.dresidual,
                                                     fch_gelu, bt, 4 * c, c));
      } else {
        TROUPE_RETURN_IF_ERROR(LinearBackward(a.dfch_gelu, g + o.fcproj_w, g + o.fcproj_b,
                                              a.dresidual, fch_gelu, p + o.fcproj_w, bt, 4 * c, c));
        TROUPE_RETURN_IF_ERROR(gpt_internal::Zero(a.dfch, bt * 4 * c * sizeof(Tx), stream_));
        TROUPE_RETURN_IF_ERROR(gelu_backward(a.dfch, fch, a.dfch_gelu, bt * 4 * c, stream_));
      }
      TROUPE_RETURN_IF_ERROR(LinearBackward(a.dln, g + o.fc_w, g + o.fc_b, a.dfch,
                                            Layer(a.ln2, l, bt * c), p + o.fc_w, bt, c, 4 * c));
      TROUPE_RETURN_IF_ERROR(layernorm_backward(
          a.dresidual, g + o.ln2_w, g + o.ln2_b, a.ln_scratch, a.dln, Layer(a.res2, l, bt * c),
          p + o.ln2_w, Layer(a.ln2_mean, l, bt), Layer(a.ln2_rstd, l, bt), bt, c, stream_));
      TROUPE_RETURN_IF_ERROR(LinearBackward(a.datty, g + o.proj_w, g + o.proj_b, a.dresidual, atty,
                                            p + o.proj_w, bt, c, c));
      TROUPE_RETURN_IF_ERROR(gpt_internal::Zero(a.dqkv, bt * 3 * c * sizeof(Tx), stream_));
      TROUPE_RETURN_IF_ERROR(attention_backward(a.dqkv, a.datty, Layer(a.qkv, l, bt * 3 * c), atty,
                                                Layer(a.att_lse, l, b * nh * t), a.att_workspace, b,
                                                t, c, nh, stream_));
      TROUPE_RETURN_IF_ERROR(LinearBackward(a.dln, g + o.qkv_w, g + o.qkv_b, a.dqkv,
                                            Layer(a.ln1, l, bt * c), p + o.qkv_w, bt, c, 3 * c));
      TROUPE_RETURN_IF_ERROR(layernorm_backward(
          a.dresidual, g + o.ln1_w, g + o.ln1_b, a.ln_scratch, a.dln, residual, p + o.ln1_w,
          Layer(a.ln1_mean, l, bt), Layer(a.ln1_rstd, l, bt), bt, c, stream_));
      TROUPE_RETURN_IF_ERROR(report(layout_.block_range(l)));
    }
    TROUPE_RETURN_IF_ERROR(embedding_backward(g + layout_.wte(), g + layout_.wpe(), a.dresidual,
                                              a.tokens, b, t, c, stream_));
    return report(layout_.embeddings_range());
  }

  static constexpr MatmulDtype kDtype = gpt_internal::DtypeOf<Tx>();

  model::GptConfig config_;
  model::ParamLayout layout_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<MatmulExecutor> matmul_;
  Stream stream_;
  bool gelu_epilogue_;

  gpt_internal::Arena params_arena_;
  float* params_ = nullptr;
  Tx* params_x_ = nullptr;
  Tx* grads_ = nullptr;
  float *m_ = nullptr, *v_ = nullptr;
  double* chunk_sums_ = nullptr;
  gpt_internal::Arena grads_f32_arena_;  // bf16 only, at the first Fp32Grads
  float* grads_f32_ = nullptr;

  gpt_internal::Arena acts_arena_;
  Activations acts_;
  int b_ = 0, t_ = 0;
  bool have_targets_ = false;
};

}  // namespace troupe::model::cuda

#endif  // TROUPE_MODEL_CUDA_GPT_CUH_
