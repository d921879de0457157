// The direct channel's frame header: round trip, and every kind of bad header rejected with a
// message naming the field.
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

}  // namespace
}  // namespace troupe::runtime::direct
