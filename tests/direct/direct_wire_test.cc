// The direct channel's frame header: round trip, and every kind of bad header rejected with a
// message naming the field; the error and hello payloads.
#include "direct_wire.h"

#include <gtest/gtest.h>

#include <cstring>

namespace troupe::runtime::direct {
namespace {

TEST(DirectWire, HeaderRoundTrip) {
  char buf[kHeaderBytes];
  EncodeHeader({FrameKind::kReply, 1234, 0xdeadbeef}, buf);
  EXPECT_EQ(std::memcmp(buf, "TRDC", 4), 0);  // little-endian magic reads as text
  FrameHeader h;
  ASSERT_TRUE(DecodeHeader(buf, kDefaultMaxPayload, &h).ok());
  EXPECT_EQ(h.kind, FrameKind::kReply);
  EXPECT_EQ(h.length, 1234u);
  EXPECT_EQ(h.call_id, 0xdeadbeefu);
}

absl::Status DecodeMutated(int index, char value, uint32_t cap = kDefaultMaxPayload) {
  char buf[kHeaderBytes];
  EncodeHeader({FrameKind::kCall, 8, 1}, buf);
  buf[index] = value;
  FrameHeader h;
  return DecodeHeader(buf, cap, &h);
}

TEST(DirectWire, RejectsBadMagicVersionKindAndReserved) {
  absl::Status magic = DecodeMutated(0, 'X');
  EXPECT_TRUE(absl::IsInvalidArgument(magic));
  EXPECT_NE(magic.message().find("magic"), std::string::npos) << magic;
  absl::Status version = DecodeMutated(4, 9);
  EXPECT_NE(version.message().find("version is 9, expected 1"), std::string::npos) << version;
  absl::Status kind = DecodeMutated(5, 77);
  EXPECT_NE(kind.message().find("kind is 77"), std::string::npos) << kind;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeMutated(6, 1)));
}

TEST(DirectWire, RejectsLengthAboveCap) {
  char buf[kHeaderBytes];
  EncodeHeader({FrameKind::kCall, 0xffffffffu, 1}, buf);
  FrameHeader h;
  absl::Status s = DecodeHeader(buf, 4096, &h);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("4294967295 bytes, the cap is 4096"), std::string::npos) << s;
  EncodeHeader({FrameKind::kCall, 4096, 1}, buf);
  EXPECT_TRUE(DecodeHeader(buf, 4096, &h).ok());  // the cap itself is allowed
}

TEST(DirectWire, ErrorFrameCarriesCodeAndText) {
  std::vector<char> out;
  AppendErrorFrame(absl::NotFoundError("no actor named 'x'"), 7, &out);
  FrameHeader h;
  ASSERT_TRUE(DecodeHeader(out.data(), kDefaultMaxPayload, &h).ok());
  EXPECT_EQ(h.kind, FrameKind::kError);
  EXPECT_EQ(h.call_id, 7u);
  ASSERT_EQ(out.size(), kHeaderBytes + h.length);
  absl::Status s = DecodeErrorPayload(out.data() + kHeaderBytes, h.length);
  EXPECT_TRUE(absl::IsNotFound(s));
  EXPECT_EQ(s.message(), "no actor named 'x'");
  EXPECT_TRUE(absl::IsDataLoss(DecodeErrorPayload(out.data(), 3)));
}

TEST(DirectWire, HelloFrameCarriesTheNameAndAnOptionalGeneration) {
  for (uint64_t generation : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}}) {
    std::vector<char> out;
    AppendHelloFrame("echo-1", generation, &out);
    FrameHeader h;
    ASSERT_TRUE(DecodeHeader(out.data(), kDefaultMaxPayload, &h).ok());
    EXPECT_EQ(h.kind, FrameKind::kHello);
    ASSERT_EQ(out.size(), kHeaderBytes + h.length);
    EXPECT_EQ(h.length, generation == 0 ? 6u : 15u);
    std::string name;
    uint64_t got = 1;
    ASSERT_TRUE(DecodeHelloPayload(out.data() + kHeaderBytes, h.length, &name, &got).ok());
    EXPECT_EQ(name, "echo-1");
    EXPECT_EQ(got, generation);
  }
  std::string name;
  uint64_t generation = 0;
  const std::string short_generation = std::string("echo-1") + '\0' + "abc";
  absl::Status s =
      DecodeHelloPayload(short_generation.data(), short_generation.size(), &name, &generation);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("8-byte generation"), std::string::npos) << s;
  const std::string no_name = std::string(1, '\0') + std::string(8, 'g');
  s = DecodeHelloPayload(no_name.data(), no_name.size(), &name, &generation);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("got 0"), std::string::npos) << s;
  const std::string long_name(kMaxActorName + 1, 'n');
  s = DecodeHelloPayload(long_name.data(), long_name.size(), &name, &generation);
  EXPECT_NE(s.message().find("got 257"), std::string::npos) << s;
}

}  // namespace
}  // namespace troupe::runtime::direct
