// GPT-2-style decoder configuration and the layout of its flat parameter buffer.
//
// All parameters live in one fp32 buffer; ParamLayout names each tensor and gives its offset, so
// an optimizer shard can own any contiguous range. Tensors are ordered layer by layer
// (embeddings, then h.0.*, h.1.*, …, then ln_f.*), so a pipeline stage's layers are contiguous.
// Names follow Hugging Face GPT-2; weights use PyTorch's nn.Linear layout [out, in].
//
// Example:
//   GptConfig config = GptConfig::Tiny(/*vocab_size=*/512);
//   TROUPE_RETURN_IF_ERROR(config.Validate());
//   ParamLayout layout(config);
//   const ParamTensor* qkv = layout.Find("h.0.attn.c_attn.weight");  // shape {3C, C}
#ifndef TROUPE_MODEL_CONFIG_H_
#define TROUPE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace troupe::model {

struct GptConfig {
  int32_t vocab_size = 0;
  int32_t context_length = 0;  // maximum sequence length (rows of wpe)
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t width = 0;  // model width C; must be divisible by num_heads

  // InvalidArgument naming the field and what was expected when the config is inconsistent.
  [[nodiscard]] absl::Status Validate() const;
  std::string DebugString() const;
  bool operator==(const GptConfig& o) const;

  // CI-sized: 2 layers, 4 heads, width 64, context 64.
  static GptConfig Tiny(int32_t vocab_size);
  // ~20M parameters at vocab 4096: 6 layers, 8 heads, width 512, context 256.
  static GptConfig Small20M(int32_t vocab_size);
  // GPT-2 124M: 12 layers, 12 heads, width 768, context 1024, vocab 50257.
  static GptConfig Gpt2Small();
};

struct ParamTensor {
  std::string name;
  int64_t offset = 0;  // in elements, into the flat buffer
  int64_t size = 0;
  std::vector<int64_t> shape;
  bool decay = false;  // weight decay applies (2-D tensors: matrices and embeddings)
};

// Offsets of one transformer block's tensors in the flat buffer.
struct BlockOffsets {
  int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

class ParamLayout {
 public:
  explicit ParamLayout(const GptConfig& config);  // config must be valid

  int64_t total_size() const { return total_size_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor* Find(const std::string& name) const;

  int64_t wte() const { return wte_; }
  int64_t wpe() const { return wpe_; }
  const BlockOffsets& block(int layer) const { return blocks_[layer]; }
  int64_t lnf_w() const { return lnf_w_; }
  int64_t lnf_b() const { return lnf_b_; }

  // Flat ranges [begin, end) of whole parts of the model, in the order the backward pass finishes
  // them: ln_f's tensors; block `layer`'s; the embeddings (wte and wpe). The layout is wte, wpe,
  // the blocks in order, ln_f, so the three kinds tile [0, total_size()).
  std::pair<int64_t, int64_t> final_norm_range() const { return {lnf_w_, total_size_}; }
  std::pair<int64_t, int64_t> block_range(int layer) const;
  std::pair<int64_t, int64_t> embeddings_range() const { return {wte_, block_range(0).first}; }

 private:
  int64_t Add(std::string name, std::vector<int64_t> shape, bool decay);

  std::vector<ParamTensor> tensors_;
  std::vector<BlockOffsets> blocks_;
  int64_t total_size_ = 0;
  int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
};

}  // namespace troupe::model

#endif  // TROUPE_MODEL_CONFIG_H_
