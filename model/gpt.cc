#include "troupe/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "troupe/kernels/attention.h"
#include "troupe/kernels/crossentropy.h"
#include "troupe/kernels/embedding.h"
#include "troupe/kernels/gelu.h"
#include "troupe/kernels/layernorm.h"
#include "troupe/kernels/matmul.h"
#include "troupe/kernels/parallel.h"
#include "troupe/kernels/residual.h"
#include "troupe/model/rng.h"

namespace troupe::model {

namespace k = troupe::kernels;

template <typename T>
absl::StatusOr<GptModel<T>> GptModel<T>::Create(const GptConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return GptModel<T>(config);
}

template <typename T>
GptModel<T>::GptModel(const GptConfig& config)
    : config_(config),
      layout_(config),
      params_(layout_.total_size(), T(0)),
      grads_(layout_.total_size(), T(0)) {}

template <typename T>
void GptModel<T>::InitParams(uint64_t seed) {
  const double residual_std = 0.02 / std::sqrt(2.0 * config_.num_layers);
  const auto& tensors = layout_.tensors();
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const ParamTensor& t = tensors[ti];
    T* p = params_.data() + t.offset;
    const bool is_ln_gain = t.name.find("ln_") != std::string::npos && t.name.size() >= 6 &&
                            t.name.compare(t.name.size() - 6, 6, "weight") == 0;
    if (t.shape.size() == 1) {
      std::fill(p, p + t.size, is_ln_gain ? T(1) : T(0));
      continue;
    }
    const bool residual_proj = t.name.find("c_proj.weight") != std::string::npos;
    const double std = residual_proj ? residual_std : 0.02;
    // Each element is a pure function of (seed, tensor, index), so any split gives the same bits.
    // Rounded through float so float and double models start from the same values.
    k::ParallelForRange(t.size, 65536, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        p[i] =
            static_cast<T>(static_cast<float>(std * NormalDouble(seed, RngPurpose::kInit, ti, i)));
      }
    });
  }
}

template <typename T>
void GptModel<T>::EnsureActivations(int b, int t) {
  if (b == b_ && t == t_) return;
  b_ = b;
  t_ = t;
  const int64_t bt = int64_t{b} * t, c = config_.width, l = config_.num_layers;
  const int64_t v = config_.vocab_size, nh = config_.num_heads;
  auto size = [](std::vector<T>& x, int64_t n) { x.assign(n, T(0)); };
  size(encoded_, bt * c);
  size(ln1_, l * bt * c);
  size(ln1_mean_, l * bt);
  size(ln1_rstd_, l * bt);
  size(qkv_, l * bt * 3 * c);
  size(atty_, l * bt * c);
  size(att_, l * b * nh * t * t);
  size(attproj_, l * bt * c);
  size(residual2_, l * bt * c);
  size(ln2_, l * bt * c);
  size(ln2_mean_, l * bt);
  size(ln2_rstd_, l * bt);
  size(fch_, l * bt * 4 * c);
  size(fch_gelu_, l * bt * 4 * c);
  size(fcproj_, l * bt * c);
  size(residual3_, l * bt * c);
  size(lnf_, bt * c);
  size(lnf_mean_, bt);
  size(lnf_rstd_, bt);
  size(logits_, bt * v);
  size(probs_, bt * v);
  size(losses_, bt);
  size(dresidual_, bt * c);
  size(dbtc_, bt * c);
  size(dbtc2_, bt * c);
  size(dqkv_, bt * 3 * c);
  size(dfch_, bt * 4 * c);
  size(dfch_gelu_, bt * 4 * c);
  size(dlogits_, bt * v);
}

namespace {
absl::Status CheckIds(const char* what, const int32_t* ids, int64_t n, int32_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "]: expected a token id in [0, ", vocab, "), got ", ids[i]));
    }
  }
  return absl::OkStatus();
}
}  // namespace

template <typename T>
absl::StatusOr<double> GptModel<T>::Forward(const int32_t* tokens, const int32_t* targets, int b,
                                            int t) {
  if (b <= 0 || t <= 0 || t > config_.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: expected batch > 0 and 0 < seq_len <= ", config_.context_length,
                     ", got batch=", b, " seq_len=", t));
  }
  const int64_t bt = int64_t{b} * t, c = config_.width, v = config_.vocab_size;
  const int64_t nh = config_.num_heads;
  if (absl::Status s = CheckIds("tokens", tokens, bt, config_.vocab_size); !s.ok()) return s;
  if (targets != nullptr) {
    if (absl::Status s = CheckIds("targets", targets, bt, config_.vocab_size); !s.ok()) return s;
  }
  EnsureActivations(b, t);
  tokens_.assign(tokens, tokens + bt);
  have_targets_ = targets != nullptr;
  if (have_targets_) targets_.assign(targets, targets + bt);
  const T* p = params_.data();

  k::EmbeddingForward(encoded_.data(), tokens, p + layout_.wte(), p + layout_.wpe(), b, t, c);
  for (int l = 0; l < config_.num_layers; ++l) {
    const BlockOffsets& o = layout_.block(l);
    const T* residual = l == 0 ? encoded_.data() : residual3_.data() + (l - 1) * bt * c;
    T* ln1 = ln1_.data() + l * bt * c;
    T* qkv = qkv_.data() + l * bt * 3 * c;
    T* atty = atty_.data() + l * bt * c;
    T* attproj = attproj_.data() + l * bt * c;
    T* res2 = residual2_.data() + l * bt * c;
    T* ln2 = ln2_.data() + l * bt * c;
    T* fch = fch_.data() + l * bt * 4 * c;
    T* fch_gelu = fch_gelu_.data() + l * bt * 4 * c;
    T* fcproj = fcproj_.data() + l * bt * c;
    T* res3 = residual3_.data() + l * bt * c;
    k::LayerNormForward(ln1, ln1_mean_.data() + l * bt, ln1_rstd_.data() + l * bt, residual,
                        p + o.ln1_w, p + o.ln1_b, bt, c);
    k::MatmulForward(qkv, ln1, p + o.qkv_w, p + o.qkv_b, bt, c, 3 * c);
    k::AttentionForward(atty, att_.data() + l * b * nh * t * t, qkv, b, t, c, nh);
    k::MatmulForward(attproj, atty, p + o.proj_w, p + o.proj_b, bt, c, c);
    k::ResidualForward(res2, residual, attproj, bt * c);
    k::LayerNormForward(ln2, ln2_mean_.data() + l * bt, ln2_rstd_.data() + l * bt, res2,
                        p + o.ln2_w, p + o.ln2_b, bt, c);
    k::MatmulForward(fch, ln2, p + o.fc_w, p + o.fc_b, bt, c, 4 * c);
    k::GeluForward(fch_gelu, fch, bt * 4 * c);
    k::MatmulForward(fcproj, fch_gelu, p + o.fcproj_w, p + o.fcproj_b, bt, 4 * c, c);
    k::ResidualForward(res3, res2, fcproj, bt * c);
  }
  const T* last = residual3_.data() + (config_.num_layers - 1) * bt * c;
  k::LayerNormForward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), last, p + layout_.lnf_w(),
                      p + layout_.lnf_b(), bt, c);
  k::MatmulForward<T>(logits_.data(), lnf_.data(), p + layout_.wte(), nullptr, bt, c, v);
  if (!have_targets_) return 0.0;
  k::CrossEntropyForward(losses_.data(), probs_.data(), logits_.data(), targets, bt, v);
  double sum = 0;
  for (int64_t i = 0; i < bt; ++i) sum += losses_[i];
  return sum / static_cast<double>(bt);
}

template <typename T>
void GptModel<T>::ZeroGrad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <typename T>
absl::Status GptModel<T>::Backward(T loss_weight) {
  if (!have_targets_) {
    return absl::FailedPreconditionError("Backward: the last Forward had no targets");
  }
  const int b = b_, t = t_;
  const int64_t bt = int64_t{b} * t, c = config_.width, v = config_.vocab_size;
  const int64_t nh = config_.num_heads;
  const T* p = params_.data();
  T* g = grads_.data();
  auto zero = [](std::vector<T>& x) { std::fill(x.begin(), x.end(), T(0)); };

  zero(dlogits_);
  k::CrossEntropyBackward(dlogits_.data(), probs_.data(), targets_.data(), loss_weight, bt, v);
  zero(dbtc_);  // d lnf
  k::MatmulBackward<T>(dbtc_.data(), g + layout_.wte(), nullptr, dlogits_.data(), lnf_.data(),
                       p + layout_.wte(), bt, c, v);
  zero(dresidual_);
  const T* last = residual3_.data() + (config_.num_layers - 1) * bt * c;
  k::LayerNormBackward(dresidual_.data(), g + layout_.lnf_w(), g + layout_.lnf_b(), dbtc_.data(),
                       last, p + layout_.lnf_w(), lnf_mean_.data(), lnf_rstd_.data(), bt, c);
  // dresidual_ holds d residual3 of the layer being processed; its LayerNorm backwards add the
  // gradients that flow around each residual connection.
  for (int l = config_.num_layers - 1; l >= 0; --l) {
    const BlockOffsets& o = layout_.block(l);
    const T* residual = l == 0 ? encoded_.data() : residual3_.data() + (l - 1) * bt * c;
    zero(dfch_gelu_);
    k::MatmulBackward(dfch_gelu_.data(), g + o.fcproj_w, g + o.fcproj_b, dresidual_.data(),
                      fch_gelu_.data() + l * bt * 4 * c, p + o.fcproj_w, bt, 4 * c, c);
    zero(dfch_);
    k::GeluBackward(dfch_.data(), fch_.data() + l * bt * 4 * c, dfch_gelu_.data(), bt * 4 * c);
    zero(dbtc_);  // d ln2
    k::MatmulBackward(dbtc_.data(), g + o.fc_w, g + o.fc_b, dfch_.data(), ln2_.data() + l * bt * c,
                      p + o.fc_w, bt, c, 4 * c);
    k::LayerNormBackward(dresidual_.data(), g + o.ln2_w, g + o.ln2_b, dbtc_.data(),
                         residual2_.data() + l * bt * c, p + o.ln2_w, ln2_mean_.data() + l * bt,
                         ln2_rstd_.data() + l * bt, bt, c);
    zero(dbtc2_);  // d atty
    k::MatmulBackward(dbtc2_.data(), g + o.proj_w, g + o.proj_b, dresidual_.data(),
                      atty_.data() + l * bt * c, p + o.proj_w, bt, c, c);
    zero(dqkv_);
    k::AttentionBackward(dqkv_.data(), dbtc2_.data(), qkv_.data() + l * bt * 3 * c,
                         att_.data() + l * b * nh * t * t, b, t, c, nh);
    zero(dbtc_);  // d ln1
    k::MatmulBackward(dbtc_.data(), g + o.qkv_w, g + o.qkv_b, dqkv_.data(),
                      ln1_.data() + l * bt * c, p + o.qkv_w, bt, c, 3 * c);
    k::LayerNormBackward(dresidual_.data(), g + o.ln1_w, g + o.ln1_b, dbtc_.data(), residual,
                         p + o.ln1_w, ln1_mean_.data() + l * bt, ln1_rstd_.data() + l * bt, bt, c);
  }
  k::EmbeddingBackward(g + layout_.wte(), g + layout_.wpe(), dresidual_.data(), tokens_.data(), b,
                       t, c);
  return absl::OkStatus();
}

template class GptModel<float>;
template class GptModel<double>;

}  // namespace troupe::model
