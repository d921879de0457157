#include "envelope.h"

#include <capnp/serialize.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "troupe/model/crc32c.h"

namespace troupe::train {

std::string SealMessage(absl::string_view magic, capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  kj::ArrayPtr<const kj::byte> message = words.asBytes();
  std::string out(magic.data(), magic.size());
  const uint32_t length = static_cast<uint32_t>(message.size());
  const uint32_t crc = model::Crc32c(message.begin(), message.size());
  out.append(reinterpret_cast<const char*>(&length), 4);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  out.append(reinterpret_cast<const char*>(message.begin()), message.size());
  return out;
}

absl::StatusOr<kj::Array<capnp::word>> UnsealMessage(absl::string_view bytes,
                                                     absl::string_view magic, size_t max_bytes,
                                                     const std::string& what) {
  auto loss = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(what, ": ", why));
  };
  if (bytes.size() < kEnvelopeSize) {
    return loss(
        absl::StrCat(bytes.size(), " bytes, shorter than the ", kEnvelopeSize, "-byte header"));
  }
  if (bytes.size() > max_bytes) {
    return loss(absl::StrCat(bytes.size(), " bytes, at most ", max_bytes));
  }
  if (std::memcmp(bytes.data(), magic.data(), magic.size()) != 0) return loss("bad magic");
  uint32_t length, crc;
  std::memcpy(&length, bytes.data() + 8, 4);
  std::memcpy(&crc, bytes.data() + 12, 4);
  if (length != bytes.size() - kEnvelopeSize || length % sizeof(capnp::word) != 0) {
    return loss(absl::StrCat("message length ", length, ", file holds ",
                             bytes.size() - kEnvelopeSize, " bytes after the header"));
  }
  const char* message = bytes.data() + kEnvelopeSize;
  if (uint32_t actual = model::Crc32c(message, length); actual != crc) {
    return loss(absl::StrCat("CRC32C ", actual, ", header says ", crc));
  }
  // Copy into word-aligned storage; Cap'n Proto reads words in place.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(length / sizeof(capnp::word));
  std::memcpy(words.begin(), message, length);
  return words;
}

}  // namespace troupe::train
