#include "troupe/model/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::model {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  std::vector<unsigned char> ones(32, 0xFF);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32cTest, ExtendEqualsOneShotAtEveryCut) {
  std::string s;
  for (int i = 0; i < 100; ++i) s.push_back(static_cast<char>(i * 37 + 11));
  const uint32_t whole = Crc32c(s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(Crc32cExtend(Crc32c(s.data(), cut), s.data() + cut, s.size() - cut), whole);
  }
}

TEST(Crc32cTest, HardwareAndTablePathsAgreeAtEveryLengthAndAlignment) {
  std::vector<unsigned char> buf(4096 + 64);
  uint32_t x = 2463534242u;
  for (auto& b : buf) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63},
                       size_t{1000}, size_t{4096}}) {
      EXPECT_EQ(Crc32cExtend(0x12345678u, buf.data() + offset, len),
                Crc32cExtendPortable(0x12345678u, buf.data() + offset, len))
          << "offset " << offset << " length " << len;
    }
  }
}

}  // namespace
}  // namespace troupe::model
