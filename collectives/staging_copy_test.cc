// StagingCopy: the copies are memcpy's, and the mode follows the measured times per size class.
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "reduce.h"

namespace troupe::collectives {
namespace {

TEST(StagingCopyTest, BothCopiesAreMemcpyAtEveryLengthAndSourceOffset) {
  std::vector<uint8_t> src(4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
  for (bool streamed : {false, true}) {
    for (size_t offset : {0, 1, 4, 13}) {
      for (size_t bytes : {0, 1, 15, 16, 63, 64, 65, 1000, 4096}) {
        alignas(64) uint8_t dst[4096 + 64];
        std::memset(dst, 0xee, sizeof(dst));
        StagingCopy::Copy(streamed, dst, src.data() + offset, bytes);
        EXPECT_EQ(std::memcmp(dst, src.data() + offset, bytes), 0)
            << "streamed=" << streamed << " offset=" << offset << " bytes=" << bytes;
        EXPECT_EQ(dst[bytes], 0xee) << "wrote past the end: streamed=" << streamed;
      }
    }
  }
}

TEST(StagingCopyTest, TakesTheFasterModeAndExploresTheOtherOnceInSixteen) {
  StagingCopy s;
  constexpr size_t kBytes = 1 << 20;
  // Unmeasured: each mode once, through the caches first.
  ASSERT_FALSE(s.Streamed(kBytes));
  s.Record(kBytes, false, 300e-6);
  ASSERT_TRUE(s.Streamed(kBytes));
  s.Record(kBytes, true, 100e-6);
  // Streamed is 3x faster: it is taken, except for one operation in 16.
  int cached = 0;
  for (int i = 0; i < 32; ++i) {
    const bool streamed = s.Streamed(kBytes);
    cached += streamed ? 0 : 1;
    s.Record(kBytes, streamed, streamed ? 100e-6 : 300e-6);
  }
  EXPECT_EQ(cached, 2);
  // The machine changes: streamed writes become slow; the mean follows and the mode flips for
  // good (two cached operations in a row cannot both be explorations).
  int in_a_row = 0;
  for (int i = 0; i < 64 && in_a_row < 2; ++i) {
    const bool streamed = s.Streamed(kBytes);
    s.Record(kBytes, streamed, streamed ? 900e-6 : 300e-6);
    in_a_row = streamed ? 0 : in_a_row + 1;
  }
  EXPECT_EQ(in_a_row, 2) << "never went back to cached writes after streamed ones slowed down";
}

TEST(StagingCopyTest, SizeClassesAreMeasuredApart) {
  StagingCopy s;
  // 1 MiB operations prefer streamed writes...
  ASSERT_FALSE(s.Streamed(1 << 20));
  s.Record(1 << 20, false, 300e-6);
  ASSERT_TRUE(s.Streamed(1 << 20));
  s.Record(1 << 20, true, 100e-6);
  EXPECT_TRUE(s.Streamed(1 << 20));
  // ...which says nothing about 64 KiB ones: they start unmeasured, cached first.
  EXPECT_FALSE(s.Streamed(64 << 10));
}

}  // namespace
}  // namespace troupe::collectives
