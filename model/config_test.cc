#include "troupe/model/config.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace troupe::model {
namespace {

TEST(GptConfigTest, PresetsAreValid) {
  EXPECT_TRUE(GptConfig::Tiny(512).Validate().ok());
  EXPECT_TRUE(GptConfig::Small20M(4096).Validate().ok());
  EXPECT_TRUE(GptConfig::Gpt2Small().Validate().ok());
}

TEST(GptConfigTest, WidthNotDivisibleByHeadsNamesTheField) {
  GptConfig c = GptConfig::Tiny(512);
  c.width = 66;
  const absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("width"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("num_heads (4)"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("got 66"), absl::string_view::npos) << s;
}

TEST(GptConfigTest, NonPositiveFieldsAreNamed) {
  GptConfig c = GptConfig::Tiny(512);
  c.num_layers = 0;
  EXPECT_NE(c.Validate().message().find("num_layers"), absl::string_view::npos);
  c = GptConfig::Tiny(0);
  EXPECT_NE(c.Validate().message().find("vocab_size"), absl::string_view::npos);
}

TEST(ParamLayoutTest, Gpt2SmallHas124MParametersAndContiguousTensors) {
  ParamLayout layout(GptConfig::Gpt2Small());
  EXPECT_EQ(layout.total_size(), 124439808);  // GPT-2 small with tied embeddings
  int64_t expected_offset = 0;
  for (const auto& t : layout.tensors()) {
    EXPECT_EQ(t.offset, expected_offset) << t.name;
    expected_offset += t.size;
  }
  const ParamTensor* qkv = layout.Find("h.11.attn.c_attn.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{2304, 768}));
  EXPECT_TRUE(qkv->decay);
  EXPECT_FALSE(layout.Find("ln_f.bias")->decay);
  EXPECT_EQ(layout.Find("nope"), nullptr);
}

// The backward pass's report ranges: each holds exactly its part's tensors (by name), and in the
// order the pass reports them they tile the flat buffer with no gap and no overlap.
TEST(ParamLayoutTest, PartRangesHoldTheirTensorsAndTileTheBuffer) {
  const GptConfig config = GptConfig::Tiny(97);
  const ParamLayout layout(config);
  auto names_in = [&](std::pair<int64_t, int64_t> r) {
    std::vector<std::string> names;
    for (const auto& t : layout.tensors()) {
      if (t.offset >= r.first && t.offset + t.size <= r.second) names.push_back(t.name);
    }
    return names;
  };
  EXPECT_EQ(names_in(layout.final_norm_range()),
            (std::vector<std::string>{"ln_f.weight", "ln_f.bias"}));
  EXPECT_EQ(names_in(layout.embeddings_range()), (std::vector<std::string>{"wte", "wpe"}));
  std::vector<std::pair<int64_t, int64_t>> order{layout.final_norm_range()};
  for (int l = config.num_layers - 1; l >= 0; --l) {
    const std::vector<std::string> names = names_in(layout.block_range(l));
    ASSERT_EQ(names.size(), 12u) << "block " << l;
    for (const std::string& n : names) EXPECT_EQ(n.rfind("h." + std::to_string(l) + ".", 0), 0u);
    order.push_back(layout.block_range(l));
  }
  order.push_back(layout.embeddings_range());
  int64_t end = layout.total_size();
  for (const auto& [b, e] : order) {
    EXPECT_EQ(e, end) << "a range must end where the one reported before it began";
    EXPECT_LT(b, e);
    end = b;
  }
  EXPECT_EQ(end, 0);
}

}  // namespace
}  // namespace troupe::model
