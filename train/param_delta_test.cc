#include "param_delta.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace troupe::train {
namespace {

// Parameters at GPT-2's initial scale and one AdamW step of them (each moves by about the
// learning rate: 3e-4, with a decay of 0.1).
struct Step {
  std::vector<float> before, after;
};
Step AdamWLikeStep(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> w(0.0f, 0.02f), u(0.0f, 1.0f);
  Step s{std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.before[i] = w(rng);
    s.after[i] = s.before[i] * (1.0f - 3e-4f * 0.1f) - 3e-4f * std::tanh(u(rng));
  }
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(ParamDeltaTest, AnOptimizerStepTravelsInFewerBytesAndArrivesBitForBit) {
  const size_t n = 1 << 18;
  const Step s = AdamWLikeStep(n, 1);
  std::vector<uint8_t> wire(DeltaCapacity(n)), scratch;
  const size_t bytes = EncodeDelta(s.after.data(), s.before.data(), n, wire.data(), &scratch);
  EXPECT_TRUE(DeltaCompressed(wire.data(), bytes));
  EXPECT_LT(bytes, n * 4 * 4 / 5) << "the sign and exponent bytes barely change in a step";
  std::vector<float> out(n, -1.0f);
  // The receive buffer is the whole capacity; the message fills `bytes` of it.
  ASSERT_TRUE(DecodeDelta(wire.data(), wire.size(), s.before.data(), n, out.data(), &scratch).ok());
  EXPECT_TRUE(SameBits(out, s.after));
  // In place, onto the base itself.
  std::vector<float> base = s.before;
  ASSERT_TRUE(DecodeDelta(wire.data(), bytes, base.data(), n, base.data(), &scratch).ok());
  EXPECT_TRUE(SameBits(base, s.after));
}

TEST(ParamDeltaTest, WhatDoesNotCompressTravelsRawAndStillArrivesBitForBit) {
  const size_t n = 4099;
  std::mt19937 rng(7);
  std::vector<float> now(n), base(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = rng(), b = rng();
    std::memcpy(&now[i], &a, 4);  // every bit pattern, NaNs included
    std::memcpy(&base[i], &b, 4);
  }
  std::vector<uint8_t> wire(DeltaCapacity(n)), scratch;
  const size_t bytes = EncodeDelta(now.data(), base.data(), n, wire.data(), &scratch);
  EXPECT_FALSE(DeltaCompressed(wire.data(), bytes));
  EXPECT_EQ(bytes, DeltaCapacity(n));
  std::vector<float> out(n);
  ASSERT_TRUE(DecodeDelta(wire.data(), bytes, base.data(), n, out.data(), &scratch).ok());
  EXPECT_TRUE(SameBits(out, now));
  for (size_t k : {size_t{0}, size_t{1}}) {  // empty and single-float pieces
    std::vector<uint8_t> w(DeltaCapacity(k));
    const size_t b = EncodeDelta(now.data(), base.data(), k, w.data(), &scratch);
    std::vector<float> o(k + 1, 0.5f);
    ASSERT_TRUE(DecodeDelta(w.data(), b, base.data(), k, o.data(), &scratch).ok()) << k;
    EXPECT_EQ(std::memcmp(o.data(), now.data(), k * 4), 0);
    EXPECT_EQ(o[k], 0.5f) << "nothing written past the piece";
  }
}

TEST(ParamDeltaTest, AReceiverWithOtherBaseParametersFailsWithDataLoss) {
  const size_t n = 1 << 14;
  const Step s = AdamWLikeStep(n, 2);
  std::vector<uint8_t> wire(DeltaCapacity(n)), scratch;
  const size_t bytes = EncodeDelta(s.after.data(), s.before.data(), n, wire.data(), &scratch);
  std::vector<float> other = s.before, out(n);
  other[n / 2] = std::nextafter(other[n / 2], 1.0f);  // one bit apart
  const absl::Status st = DecodeDelta(wire.data(), bytes, other.data(), n, out.data(), &scratch);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("CRC-32C"), std::string::npos) << st;
}

TEST(ParamDeltaTest, AMalformedMessageIsRefusedWithWhatItSaid) {
  const size_t n = 1 << 12;
  const Step s = AdamWLikeStep(n, 3);
  std::vector<uint8_t> wire(DeltaCapacity(n)), scratch;
  const size_t bytes = EncodeDelta(s.after.data(), s.before.data(), n, wire.data(), &scratch);
  std::vector<float> out(n);
  // Shorter than its header.
  absl::Status st = DecodeDelta(wire.data(), 31, s.before.data(), n, out.data(), &scratch);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // A piece of another length.
  st = DecodeDelta(wire.data(), bytes, s.before.data(), n - 1, out.data(), &scratch);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("does not fit a piece of 4095 floats"), std::string::npos) << st;
  // A payload cut short (its header says more than arrived).
  st = DecodeDelta(wire.data(), bytes - 1, s.before.data(), n, out.data(), &scratch);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // Damaged compressed bytes: zstd refuses them, or the CRC does.
  std::vector<uint8_t> bad(wire.begin(), wire.begin() + bytes);
  bad[bytes / 2] ^= 0x5a;
  st = DecodeDelta(bad.data(), bad.size(), s.before.data(), n, out.data(), &scratch);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.code() == absl::StatusCode::kInvalidArgument ||
              st.code() == absl::StatusCode::kDataLoss)
      << st;
}

// "auto": where the link held the step up, on below 50 MB/s, off above 100 MB/s, and between the
// two as it was; where the link kept up with the optimizer, off at any rate.
TEST(ParamDeltaTest, AutoEncodesOnSlowLinksAndStopsOnFastOnesWithoutFlapping) {
  constexpr uint64_t kMB = 1000 * 1000;
  EXPECT_TRUE(EncodeNextShare(false, 40 * kMB, 0.2, 1.0));   // 40 MB/s
  EXPECT_FALSE(EncodeNextShare(false, 70 * kMB, 0.2, 1.0));  // 70 MB/s: not yet
  EXPECT_TRUE(EncodeNextShare(true, 70 * kMB, 0.2, 1.0));    // ... but kept on
  EXPECT_FALSE(EncodeNextShare(true, 120 * kMB, 0.2, 1.0));  // 120 MB/s: off
  EXPECT_FALSE(EncodeNextShare(false, 40 * kMB, 0.0, 0.0));  // no time at all: as fast as can be
  EXPECT_TRUE(EncodeNextShare(false, 40 * kMB, 0.5, 10.0));  // 4 MB/s
  // 40 MB/s over the whole second, but the last send was posted at 0.9 s and done at 1.0: the
  // optimizer, not the link, set the pace (the rate counted the optimizer's time as the link's).
  EXPECT_FALSE(EncodeNextShare(false, 40 * kMB, 0.9, 1.0));
  EXPECT_TRUE(EncodeNextShare(false, 40 * kMB, 0.7, 1.0));  // done 0.3 s after the last posted
  // Encoded: a tail of a fifth keeps it on (raw, the tail would be longer), one of a twentieth
  // turns it off.
  EXPECT_TRUE(EncodeNextShare(true, 40 * kMB, 0.8, 1.0));
  EXPECT_FALSE(EncodeNextShare(true, 40 * kMB, 0.95, 1.0));
}

}  // namespace
}  // namespace troupe::train
