// The parameter share's lossless delta encoding (the overlapped step's all-gather of updated
// parameters over slow links): a piece of updated parameters as the XOR of its bits with the
// parameters every rank already holds bit for bit (the committed step's), split into byte planes
// (sign and exponent bytes barely change in one AdamW step, so their plane is nearly all zeros)
// and compressed with zstd. Exact: the receiver gets the same bits, so deterministic mode keeps
// its bit-identity. A header carries the piece's length and, for a delta, the CRC-32C of the
// updated bits, so a receiver whose base differs (or a damaged delta) fails with DataLoss instead
// of training on wrong parameters. Where the delta would not be smaller, the piece travels raw
// behind the header (no CRC: raw floats need no base).
// A delta of one AdamW step of GPT-2-scale parameters is about 3/4 of the raw bytes.
//
//   std::vector<uint8_t> wire(DeltaCapacity(n)), scratch;
//   size_t bytes = EncodeDelta(now, base, n, wire.data(), &scratch);  // send wire[0, bytes)
//   absl::Status s = DecodeDelta(wire.data(), bytes, base, n, out, &scratch);
#ifndef TROUPE_TRAIN_PARAM_DELTA_H_
#define TROUPE_TRAIN_PARAM_DELTA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace troupe::train {

// Bytes an encoding of `count` floats may take (header + raw floats): a receive buffer's size.
size_t DeltaCapacity(size_t count);
// Writes now[0, count) raw behind a header to dst (DeltaCapacity(count) bytes): what a rank sends
// when it does not encode; returns DeltaCapacity(count). No CRC: raw floats need no base.
size_t EncodeRaw(const float* now, size_t count, uint8_t* dst);
// Writes the encoding of now[0, count) against base[0, count) to dst (DeltaCapacity(count)
// bytes); returns how many bytes it wrote. `scratch` is reused between calls.
size_t EncodeDelta(const float* now, const float* base, size_t count, uint8_t* dst,
                   std::vector<uint8_t>* scratch);
// out[0, count) = what EncodeDelta or EncodeRaw encoded, given the same base; src is a buffer of
// `bytes` bytes that received the message (it may be shorter: the header says how much of the
// buffer it fills). out may be base (overwritten even when the CRC then differs). InvalidArgument
// for a malformed message, DataLoss when a delta's result has another CRC than the sender's.
absl::Status DecodeDelta(const uint8_t* src, size_t bytes, const float* base, size_t count,
                         float* out, std::vector<uint8_t>* scratch);
// Whether an encoding of `bytes` bytes was compressed (false: raw floats behind the header).
bool DeltaCompressed(const uint8_t* src, size_t bytes);

// [elastic] param_delta = "auto": whether a rank encodes its next share, given whether it
// encoded this one and how this one went: its sends carried `bytes` to all receivers, were all
// posted within `posting` seconds of the first (the optimizer and the encoding of the later
// pieces) and all done within `seconds` of it. Off where the link kept up with the optimizer
// (the sends done within a quarter of `seconds` after the last was posted, a tenth if this share
// was encoded: the link did not hold the step up, so fewer bytes would not shorten it).
// Otherwise, with the link the limit: on below 50 MB/s, off again above 100: the encoding saves
// about a quarter of the bytes and costs about 2 ns a byte sent to encode and 1.3 to decode on a
// 2-vCPU VM, so it pays below ~70 MB/s; the margins leave room for busier CPUs and keep a rank
// near the line from switching every step.
bool EncodeNextShare(bool encoding, uint64_t bytes, double posting, double seconds);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_PARAM_DELTA_H_
