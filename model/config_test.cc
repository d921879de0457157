#include "troupe/model/config.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::model
