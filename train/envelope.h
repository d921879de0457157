// The envelope around every Cap'n Proto file train/ persists (checkpoint manifests, the
// coordinator's record): 8 bytes of magic, the message length (u32 LE), its CRC32C (u32 LE), then
// the message in Cap'n Proto's flat (unpacked, single-segment) encoding. Private to train/.
//
//   std::string bytes = SealMessage("TRPCKMAN", builder);
//   absl::StatusOr<kj::Array<capnp::word>> words =
//       UnsealMessage(bytes, "TRPCKMAN", kMaxBytes, "checkpoint manifest
//       ckpt/step-10/manifest.bin");
#ifndef TROUPE_TRAIN_ENVELOPE_H_
#define TROUPE_TRAIN_ENVELOPE_H_

#include <capnp/message.h>
#include <kj/array.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::train {

inline constexpr size_t kEnvelopeSize = 16;

// `magic` is exactly 8 characters.
std::string SealMessage(absl::string_view magic, capnp::MessageBuilder& builder);

// The message's words (aligned, ready for capnp::FlatArrayMessageReader), or DataLoss starting
// with `what` and naming the damage: short, too large, bad magic, length, CRC.
[[nodiscard]] absl::StatusOr<kj::Array<capnp::word>> UnsealMessage(absl::string_view bytes,
                                                                   absl::string_view magic,
                                                                   size_t max_bytes,
                                                                   const std::string& what);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_ENVELOPE_H_
