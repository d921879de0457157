#include "troupe/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"
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
  TROUPE_RETURN_IF_ERROR(config.Validate());
  return GptModel<T>(config);
}

template <typename T>
GptModel<T>::GptModel(const GptConfig& config)
    : config_(config),
      layout_(config),
      params_(static_cast<T*>(base::AllocateBig(layout_.total_size() * sizeof(T))),
              FreeDeleter{layout_.total_size() * sizeof(T)}),
      grads_(static_cast<T*>(base::AllocateBig(layout_.total_size() * sizeof(T))),
             FreeDeleter{layout_.total_size() * sizeof(T)}) {
  if (params_ == nullptr || grads_ == nullptr) throw std::bad_alloc();
}

template <typename T>
void GptModel<T>::InitParams(uint64_t seed) {
  InitParams(seed, 0, num_params());
}

template <typename T>
void GptModel<T>::InitParams(uint64_t seed, int64_t begin, int64_t end) {
  const double residual_std = 0.02 / std::sqrt(2.0 * config_.num_layers);
  const auto& tensors = layout_.tensors();
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const ParamTensor& t = tensors[ti];
    // This tensor's elements [from, to) that lie in [begin, end).
    const int64_t from = std::max<int64_t>(0, begin - t.offset);
    const int64_t to = std::min<int64_t>(t.size, end - t.offset);
    if (from >= to) continue;
    T* p = params_.get() + t.offset;
    const bool is_ln_gain = t.name.find("ln_") != std::string::npos && t.name.size() >= 6 &&
                            t.name.compare(t.name.size() - 6, 6, "weight") == 0;
    if (t.shape.size() == 1) {
      std::fill(p + from, p + to, is_ln_gain ? T(1) : T(0));
      continue;
    }
    const bool residual_proj = t.name.find("c_proj.weight") != std::string::npos;
    const double std = residual_proj ? residual_std : 0.02;
    // Each element is a pure function of (seed, tensor, index), so any split gives the same bits.
    // Rounded through float so float and double models start from the same values.
    k::ParallelForRange(to - from, 65536, [&](int64_t lo, int64_t hi) {
      for (int64_t i = from + lo; i < from + hi; ++i) {
        p[i] =
            static_cast<T>(static_cast<float>(std * NormalDouble(seed, RngPurpose::kInit, ti, i)));
      }
    });
  }
}

template <typename T>
void GptModel<T>::Size(Activations& a, StageRange range, int b, int t) {
  if (a.b == b && a.t == t) return;  // a slot's range is fixed until SetStage
  a.b = b;
  a.t = t;
  const int64_t bt = int64_t{b} * t, c = config_.width;
  const int64_t l = range.end_block - range.first_block;
  const int64_t v = range.last(config_.num_layers) ? config_.vocab_size : 0;
  const int64_t lbt = range.last(config_.num_layers) ? bt : 0;
  const int64_t nh = config_.num_heads;
  auto size = [](base::BigVector<T>& x, int64_t n) { x.assign(n, T(0)); };
  size(a.encoded, bt * c);
  size(a.ln1, l * bt * c);
  size(a.ln1_mean, l * bt);
  size(a.ln1_rstd, l * bt);
  size(a.qkv, l * bt * 3 * c);
  size(a.atty, l * bt * c);
  size(a.att, l * b * nh * t * t);
  size(a.attproj, l * bt * c);
  size(a.residual2, l * bt * c);
  size(a.ln2, l * bt * c);
  size(a.ln2_mean, l * bt);
  size(a.ln2_rstd, l * bt);
  size(a.fch, l * bt * 4 * c);
  size(a.fch_gelu, l * bt * 4 * c);
  size(a.fcproj, l * bt * c);
  size(a.residual3, l * bt * c);
  size(a.lnf, lbt * c);
  size(a.lnf_mean, lbt);
  size(a.lnf_rstd, lbt);
  size(a.logits, lbt * v);
  size(a.probs, lbt * v);
  size(a.losses, lbt);
}

template <typename T>
void GptModel<T>::EnsureScratch(int b, int t) {
  const int64_t bt = int64_t{b} * t, c = config_.width;
  if (bt == scratch_bt_) return;
  scratch_bt_ = static_cast<int>(bt);
  auto size = [](base::BigVector<T>& x, int64_t n) { x.assign(n, T(0)); };
  size(dresidual_, bt * c);
  size(dbtc_, bt * c);
  size(dbtc2_, bt * c);
  size(dqkv_, bt * 3 * c);
  size(dfch_, bt * 4 * c);
  size(dfch_gelu_, bt * 4 * c);
  size(dlogits_, bt * config_.vocab_size);
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
  return RunForward(full_, {0, config_.num_layers}, tokens, targets, nullptr, b, t);
}

template <typename T>
absl::Status GptModel<T>::SetStage(StageRange range, int slots) {
  if (range.first_block < 0 || range.first_block >= range.end_block ||
      range.end_block > config_.num_layers || slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetStage: expected blocks 0 <= first < end <= ", config_.num_layers,
        " and slots >= 1, got [", range.first_block, ", ", range.end_block, ") slots=", slots));
  }
  stage_ = range;
  slots_.assign(slots, Activations{});
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> GptModel<T>::ForwardStage(int slot, const int32_t* tokens,
                                                 const int32_t* targets, const T* input, int b,
                                                 int t) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardStage: slot ", slot, " of ", slots_.size(), " (SetStage first)"));
  }
  if (stage_.last(config_.num_layers) && targets == nullptr) {
    return absl::InvalidArgumentError("ForwardStage: the last stage needs targets");
  }
  if (!stage_.first() && input == nullptr) {
    return absl::InvalidArgumentError("ForwardStage: a stage after the first needs its input");
  }
  return RunForward(slots_[slot], stage_, tokens, targets, input, b, t);
}

template <typename T>
const T* GptModel<T>::stage_output(int slot) const {
  const Activations& a = slots_[slot];
  const int64_t bt = int64_t{a.b} * a.t, c = config_.width;
  return a.residual3.data() + (stage_.end_block - stage_.first_block - 1) * bt * c;
}

template <typename T>
absl::Status GptModel<T>::BackwardStage(int slot, T loss_weight, const T* d_output) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("BackwardStage: slot ", slot, " of ", slots_.size(), " (SetStage first)"));
  }
  if (!stage_.last(config_.num_layers) && d_output == nullptr) {
    return absl::InvalidArgumentError(
        "BackwardStage: a stage before the last needs its output's gradient");
  }
  return RunBackward(slots_[slot], stage_, loss_weight, d_output, /*embed_wte=*/false);
}

template <typename T>
std::vector<std::pair<int64_t, int64_t>> GptModel<T>::StageGradientRanges(StageRange range) const {
  const int64_t wte_end = layout_.wte() + int64_t{config_.vocab_size} * config_.width;
  const bool last = range.last(config_.num_layers);
  // Layout: wte, wpe, the blocks in order, ln_f; wte's gradient is the last stage's.
  const int64_t begin = range.first() ? wte_end : layout_.block_range(range.first_block).first;
  const int64_t end = last ? layout_.total_size() : layout_.block_range(range.end_block - 1).second;
  if (!last) return {{begin, end}};
  if (range.first()) return {{layout_.wte(), end}};
  return {{layout_.wte(), wte_end}, {begin, end}};
}

template <typename T>
void GptModel<T>::AddTokenEmbeddingGradient(T* dwte, const T* d_embedded, const int32_t* tokens,
                                            int b, int t) const {
  k::EmbeddingBackward<T>(dwte, nullptr, d_embedded, tokens, b, t, config_.width);
}

template <typename T>
absl::StatusOr<double> GptModel<T>::RunForward(Activations& a, StageRange range,
                                               const int32_t* tokens, const int32_t* targets,
                                               const T* input, int b, int t) {
  if (b <= 0 || t <= 0 || t > config_.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: expected batch > 0 and 0 < seq_len <= ", config_.context_length,
                     ", got batch=", b, " seq_len=", t));
  }
  const bool first = range.first(), last = range.last(config_.num_layers);
  const int64_t bt = int64_t{b} * t, c = config_.width, v = config_.vocab_size;
  const int64_t nh = config_.num_heads;
  if (first) {
    TROUPE_RETURN_IF_ERROR(CheckIds("tokens", tokens, bt, config_.vocab_size));
  }
  if (targets != nullptr && last) {
    TROUPE_RETURN_IF_ERROR(CheckIds("targets", targets, bt, config_.vocab_size));
  }
  Size(a, range, b, t);
  if (first) a.tokens.assign(tokens, tokens + bt);
  a.have_targets = targets != nullptr && last;
  if (a.have_targets) a.targets.assign(targets, targets + bt);
  const T* p = params_.get();

  if (first) {
    k::EmbeddingForward(a.encoded.data(), tokens, p + layout_.wte(), p + layout_.wpe(), b, t, c);
  } else {
    std::copy(input, input + bt * c, a.encoded.begin());
  }
  for (int l = range.first_block; l < range.end_block; ++l) {
    const BlockOffsets& o = layout_.block(l);
    const int64_t i = l - range.first_block;  // index into the activations
    const T* residual = i == 0 ? a.encoded.data() : a.residual3.data() + (i - 1) * bt * c;
    T* ln1 = a.ln1.data() + i * bt * c;
    T* qkv = a.qkv.data() + i * bt * 3 * c;
    T* atty = a.atty.data() + i * bt * c;
    T* attproj = a.attproj.data() + i * bt * c;
    T* res2 = a.residual2.data() + i * bt * c;
    T* ln2 = a.ln2.data() + i * bt * c;
    T* fch = a.fch.data() + i * bt * 4 * c;
    T* fch_gelu = a.fch_gelu.data() + i * bt * 4 * c;
    T* fcproj = a.fcproj.data() + i * bt * c;
    T* res3 = a.residual3.data() + i * bt * c;
    k::LayerNormForward(ln1, a.ln1_mean.data() + i * bt, a.ln1_rstd.data() + i * bt, residual,
                        p + o.ln1_w, p + o.ln1_b, bt, c);
    k::MatmulForward(qkv, ln1, p + o.qkv_w, p + o.qkv_b, bt, c, 3 * c);
    k::AttentionForward(atty, a.att.data() + i * b * nh * t * t, qkv, b, t, c, nh);
    k::MatmulForward(attproj, atty, p + o.proj_w, p + o.proj_b, bt, c, c);
    k::ResidualForward(res2, residual, attproj, bt * c);
    k::LayerNormForward(ln2, a.ln2_mean.data() + i * bt, a.ln2_rstd.data() + i * bt, res2,
                        p + o.ln2_w, p + o.ln2_b, bt, c);
    k::MatmulForward(fch, ln2, p + o.fc_w, p + o.fc_b, bt, c, 4 * c);
    k::GeluForward(fch_gelu, fch, bt * 4 * c);
    k::MatmulForward(fcproj, fch_gelu, p + o.fcproj_w, p + o.fcproj_b, bt, 4 * c, c);
    k::ResidualForward(res3, res2, fcproj, bt * c);
  }
  if (!last) return 0.0;
  const T* top = a.residual3.data() + (range.end_block - range.first_block - 1) * bt * c;
  k::LayerNormForward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), top, p + layout_.lnf_w(),
                      p + layout_.lnf_b(), bt, c);
  k::MatmulForward<T>(a.logits.data(), a.lnf.data(), p + layout_.wte(), nullptr, bt, c, v);
  if (!a.have_targets) return 0.0;
  k::CrossEntropyForward(a.losses.data(), a.probs.data(), a.logits.data(), targets, bt, v);
  double sum = 0;
  for (int64_t j = 0; j < bt; ++j) sum += a.losses[j];
  return sum / static_cast<double>(bt);
}

template <typename T>
void GptModel<T>::ZeroGrad() {
  // On every thread: 80 MB at 20M parameters, once per microbatch.
  T* g = grads_.get();
  k::ParallelForRange(num_params(), int64_t{1} << 20,
                      [g](int64_t lo, int64_t hi) { std::fill(g + lo, g + hi, T(0)); });
}

template <typename T>
absl::Status GptModel<T>::Backward(T loss_weight, const RangeReady& ready) {
  if (!full_.have_targets) {
    return absl::FailedPreconditionError("Backward: the last Forward had no targets");
  }
  return RunBackward(full_, {0, config_.num_layers}, loss_weight, nullptr, /*embed_wte=*/true,
                     ready);
}

template <typename T>
absl::Status GptModel<T>::RunBackward(Activations& a, StageRange range, T loss_weight,
                                      const T* d_output, bool embed_wte, const RangeReady& ready) {
  auto report = [&ready](std::pair<int64_t, int64_t> r) {
    if (ready) ready(r.first, r.second);
  };
  const bool first = range.first(), last = range.last(config_.num_layers);
  if (last && !a.have_targets) {
    return absl::FailedPreconditionError("Backward: the last Forward had no targets");
  }
  const int b = a.b, t = a.t;
  const int64_t bt = int64_t{b} * t, c = config_.width, v = config_.vocab_size;
  const int64_t nh = config_.num_heads;
  EnsureScratch(b, t);
  const T* p = params_.get();
  T* g = grads_.get();

  const int64_t top_index = range.end_block - range.first_block - 1;
  if (last) {
    k::CrossEntropyBackward(dlogits_.data(), a.probs.data(), a.targets.data(), loss_weight, bt, v,
                            /*accumulate=*/false);
    k::MatmulBackward<T>(dbtc_.data(), g + layout_.wte(), nullptr, dlogits_.data(), a.lnf.data(),
                         p + layout_.wte(), bt, c, v);
    std::fill(dresidual_.begin(), dresidual_.end(), T(0));  // LayerNorm backward adds to it
    k::LayerNormBackward(dresidual_.data(), g + layout_.lnf_w(), g + layout_.lnf_b(), dbtc_.data(),
                         a.residual3.data() + top_index * bt * c, p + layout_.lnf_w(),
                         a.lnf_mean.data(), a.lnf_rstd.data(), bt, c);
    report(layout_.final_norm_range());  // wte's head part waits for the embedding
  } else {
    std::copy(d_output, d_output + bt * c, dresidual_.begin());
  }
  // dresidual_ holds d residual3 of the layer being processed; its LayerNorm backwards add the
  // gradients that flow around each residual connection.
  for (int l = range.end_block - 1; l >= range.first_block; --l) {
    const BlockOffsets& o = layout_.block(l);
    const int64_t i = l - range.first_block;
    const T* residual = i == 0 ? a.encoded.data() : a.residual3.data() + (i - 1) * bt * c;
    k::MatmulBackward(dfch_gelu_.data(), g + o.fcproj_w, g + o.fcproj_b, dresidual_.data(),
                      a.fch_gelu.data() + i * bt * 4 * c, p + o.fcproj_w, bt, 4 * c, c);
    k::GeluBackward(dfch_.data(), a.fch.data() + i * bt * 4 * c, dfch_gelu_.data(), bt * 4 * c,
                    /*accumulate=*/false);
    k::MatmulBackward(dbtc_.data(), g + o.fc_w, g + o.fc_b, dfch_.data(), a.ln2.data() + i * bt * c,
                      p + o.fc_w, bt, c, 4 * c);
    k::LayerNormBackward(dresidual_.data(), g + o.ln2_w, g + o.ln2_b, dbtc_.data(),
                         a.residual2.data() + i * bt * c, p + o.ln2_w, a.ln2_mean.data() + i * bt,
                         a.ln2_rstd.data() + i * bt, bt, c);
    k::MatmulBackward(dbtc2_.data(), g + o.proj_w, g + o.proj_b, dresidual_.data(),
                      a.atty.data() + i * bt * c, p + o.proj_w, bt, c, c);
    k::AttentionBackward(dqkv_.data(), dbtc2_.data(), a.qkv.data() + i * bt * 3 * c,
                         a.att.data() + i * b * nh * t * t, b, t, c, nh);
    k::MatmulBackward(dbtc_.data(), g + o.qkv_w, g + o.qkv_b, dqkv_.data(),
                      a.ln1.data() + i * bt * c, p + o.qkv_w, bt, c, 3 * c);
    k::LayerNormBackward(dresidual_.data(), g + o.ln1_w, g + o.ln1_b, dbtc_.data(), residual,
                         p + o.ln1_w, a.ln1_mean.data() + i * bt, a.ln1_rstd.data() + i * bt, bt,
                         c);
    report(layout_.block_range(l));
  }
  if (first) {
    k::EmbeddingBackward(embed_wte ? g + layout_.wte() : nullptr, g + layout_.wpe(),
                         dresidual_.data(), a.tokens.data(), b, t, c);
    report(layout_.embeddings_range());
  }
  return absl::OkStatus();
}

template class GptModel<float>;
template class GptModel<double>;

}  // namespace troupe::model
