#include "troupe/model/config.h"

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

namespace troupe::model {
namespace {

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("GptConfig.", field, ": expected a positive value, got ", value));
}

}  // namespace

absl::Status GptConfig::Validate() const {
  for (auto [field, value] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                              {"context_length", context_length},
                              {"num_layers", num_layers},
                              {"num_heads", num_heads},
                              {"width", width}}) {
    TROUPE_RETURN_IF_ERROR(Positive(field, value));
  }
  if (width % num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig.width: expected a multiple of num_heads (", num_heads, "), got ", width));
  }
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  if (int64_t{vocab_size} * width > kMaxElements ||
      int64_t{num_layers} * 12 * width * width > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig: expected at most 2^40 parameters, got ", DebugString()));
  }
  return absl::OkStatus();
}

std::string GptConfig::DebugString() const {
  return absl::StrCat("GptConfig{vocab_size=", vocab_size, " context_length=", context_length,
                      " num_layers=", num_layers, " num_heads=", num_heads, " width=", width, "}");
}

bool GptConfig::operator==(const GptConfig& o) const {
  return vocab_size == o.vocab_size && context_length == o.context_length &&
         num_layers == o.num_layers && num_heads == o.num_heads && width == o.width;
}

GptConfig GptConfig::Tiny(int32_t vocab_size) { return {vocab_size, 64, 2, 4, 64}; }
GptConfig GptConfig::Small20M(int32_t vocab_size) { return {vocab_size, 256, 6, 8, 512}; }
GptConfig GptConfig::Gpt2Small() { return {50257, 1024, 12, 12, 768}; }

ParamLayout::ParamLayout(const GptConfig& config) {
  const int64_t c = config.width;
  wte_ = Add("wte", {config.vocab_size, c}, true);
  wpe_ = Add("wpe", {config.context_length, c}, true);
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = absl::StrCat("h.", l, ".");
    BlockOffsets b;
    b.ln1_w = Add(p + "ln_1.weight", {c}, false);
    b.ln1_b = Add(p + "ln_1.bias", {c}, false);
    b.qkv_w = Add(p + "attn.c_attn.weight", {3 * c, c}, true);
    b.qkv_b = Add(p + "attn.c_attn.bias", {3 * c}, false);
    b.proj_w = Add(p + "attn.c_proj.weight", {c, c}, true);
    b.proj_b = Add(p + "attn.c_proj.bias", {c}, false);
    b.ln2_w = Add(p + "ln_2.weight", {c}, false);
    b.ln2_b = Add(p + "ln_2.bias", {c}, false);
    b.fc_w = Add(p + "mlp.c_fc.weight", {4 * c, c}, true);
    b.fc_b = Add(p + "mlp.c_fc.bias", {4 * c}, false);
    b.fcproj_w = Add(p + "mlp.c_proj.weight", {c, 4 * c}, true);
    b.fcproj_b = Add(p + "mlp.c_proj.bias", {c}, false);
    blocks_.push_back(b);
  }
  lnf_w_ = Add("ln_f.weight", {c}, false);
  lnf_b_ = Add("ln_f.bias", {c}, false);
}

int64_t ParamLayout::Add(std::string name, std::vector<int64_t> shape, bool decay) {
  ParamTensor t;
  t.name = std::move(name);
  t.offset = total_size_;
  t.size = 1;
  for (int64_t d : shape) t.size *= d;
  t.shape = std::move(shape);
  t.decay = decay;
  total_size_ += t.size;
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

std::pair<int64_t, int64_t> ParamLayout::block_range(int layer) const {
  const bool top = layer + 1 == static_cast<int>(blocks_.size());
  return {blocks_[layer].ln1_w, top ? lnf_w_ : blocks_[layer + 1].ln1_w};
}

const ParamTensor* ParamLayout::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace troupe::model
