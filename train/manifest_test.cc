#include "troupe/train/manifest.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "troupe/model/crc32c.h"

namespace troupe::train {
namespace {

CheckpointManifest TwoShards() {
  CheckpointManifest m;
  m.gpt_config = model::GptConfig::Tiny(64);
  m.num_params = model::ParamLayout(*m.gpt_config).total_size();
  m.step = 42;
  m.seed = 0xfeedbeefcafe;
  m.world_size = 2;
  m.generation = 5;
  m.optimizer_step = 43;
  const int64_t half = m.num_params / 2;
  m.shards = {
      {"shard-00000.bin", 0, half, ShardByteSize(0, half, true), 0x1234},
      {"shard-00001.bin", half, m.num_params, ShardByteSize(half, m.num_params, true), 0xabcdef01}};
  return m;
}

TEST(ManifestTest, RoundTripsEveryField) {
  const CheckpointManifest m = TwoShards();
  absl::StatusOr<CheckpointManifest> back = DecodeManifest(EncodeManifest(m), "m.bin");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m) << back->DebugString();
}

TEST(ManifestTest, RoundTripsWithoutGptConfigOrMoments) {
  CheckpointManifest m;
  m.num_params = 10;
  m.has_moments = false;
  m.shards = {{"a", 0, 10, 40, 1}};
  absl::StatusOr<CheckpointManifest> back = DecodeManifest(EncodeManifest(m), "m.bin");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->gpt_config.has_value());
  EXPECT_EQ(*back, m);
}

// [lowcomm]: shard files twice the size of the moments' (θ_global and the outer momentum after
// them); a manifest whose sizes leave them out does not validate.
TEST(ManifestTest, RoundTripsTheOuterStateAndSizesItsSections) {
  CheckpointManifest m;
  m.num_params = 10;
  m.has_outer = true;
  m.shards = {{"a", 0, 10, ShardByteSize(0, 10, true, true), 1}};
  EXPECT_EQ(m.shards[0].byte_size, 10u * 4 * 5);
  absl::StatusOr<CheckpointManifest> back = DecodeManifest(EncodeManifest(m), "m.bin");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->has_outer);
  EXPECT_EQ(*back, m);
  m.shards[0].byte_size = ShardByteSize(0, 10, true);
  EXPECT_EQ(ValidateManifest(m, "m.bin").code(), absl::StatusCode::kDataLoss);
}

// A checkpoint of many ranks: one shard file each (8,192 ranks of a 1B-parameter model). Every
// word of the message is read once, within the reader's traversal limit (the message's size): a
// shard's name read twice once made any manifest of more than a few dozen shards undecodable.
TEST(ManifestTest, RoundTripsEightThousandShards) {
  CheckpointManifest m;
  m.num_params = 1'000'000'000;
  m.world_size = 8192;
  const int64_t per = (m.num_params + 8191) / 8192;
  for (int r = 0; r < 8192; ++r) {
    const int64_t b = r * per, e = std::min(m.num_params, (r + 1) * per);
    m.shards.push_back({"shard-" + std::to_string(100000 + r) + ".bin", b, e,
                        ShardByteSize(b, e, true), static_cast<uint32_t>(r)});
  }
  absl::StatusOr<CheckpointManifest> back = DecodeManifest(EncodeManifest(m), "m.bin");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
}

TEST(ManifestTest, EveryFlippedByteIsDataLossNamingTheFile) {
  const std::string bytes = EncodeManifest(TwoShards());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x01;
    absl::StatusOr<CheckpointManifest> m = DecodeManifest(bad, "ckpt/step-42/manifest.bin");
    ASSERT_FALSE(m.ok()) << "byte " << i;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    EXPECT_NE(m.status().message().find("ckpt/step-42/manifest.bin"), std::string::npos);
  }
}

TEST(ManifestTest, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodeManifest(TwoShards());
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<CheckpointManifest> m = DecodeManifest(bytes.substr(0, n), "f");
    ASSERT_FALSE(m.ok()) << n;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  }
}

// Garbage that passes the envelope's checksum reaches Cap'n Proto's decoder: it must be bounded
// and turn into DataLoss, never a crash or a huge allocation.
TEST(ManifestTest, GarbageMessageWithValidEnvelopeIsDataLoss) {
  const std::string good = EncodeManifest(TwoShards());
  uint32_t x = 1;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string message(good.size() - 16, '\0');
    for (char& c : message) {
      x = x * 1103515245u + 12345u;
      c = static_cast<char>(x >> 24);
    }
    if (trial % 2 == 0) message.replace(0, 8, good.substr(16, 8));  // keep the segment table
    // Re-wrap with a correct envelope by encoding through the public API is impossible for
    // garbage, so build it here the same way EncodeManifest does.
    std::string bytes = good.substr(0, 8);
    const uint32_t length = static_cast<uint32_t>(message.size());
    const uint32_t crc = model::Crc32c(message.data(), message.size());
    bytes.append(reinterpret_cast<const char*>(&length), 4);
    bytes.append(reinterpret_cast<const char*>(&crc), 4);
    bytes += message;
    absl::StatusOr<CheckpointManifest> m = DecodeManifest(bytes, "garbage.bin");
    ASSERT_FALSE(m.ok()) << trial;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  }
}

TEST(ManifestTest, ValidateRejectsInconsistentManifests) {
  struct Case {
    const char* what;
    void (*mutate)(CheckpointManifest&);
  };
  const Case cases[] = {
      {"version", [](CheckpointManifest& m) { m.format_version = 2; }},
      {"gap", [](CheckpointManifest& m) { m.shards[1].begin += 1; }},
      {"short", [](CheckpointManifest& m) { m.shards[1].end -= 1; }},
      {"size", [](CheckpointManifest& m) { m.shards[0].byte_size += 4; }},
      {"name", [](CheckpointManifest& m) { m.shards[0].name = "../x"; }},
      {"dup", [](CheckpointManifest& m) { m.shards[1].name = m.shards[0].name; }},
      {"params", [](CheckpointManifest& m) { m.gpt_config->width = 128; }},
      {"world", [](CheckpointManifest& m) { m.world_size = 0; }},
      {"empty", [](CheckpointManifest& m) { m.shards.clear(); }},
  };
  for (const Case& c : cases) {
    CheckpointManifest m = TwoShards();
    c.mutate(m);
    absl::Status s = ValidateManifest(m, "x.bin");
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.what;
    absl::StatusOr<CheckpointManifest> decoded = DecodeManifest(EncodeManifest(m), "x.bin");
    EXPECT_FALSE(decoded.ok()) << c.what;
  }
}

}  // namespace
}  // namespace troupe::train
