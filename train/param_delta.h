// The parameter share's lossless delta encoding (the overlapped step's all-gather of updated
// parameters over slow links): a piece of updated parameters as the XOR of its bits with the
// parameters every rank already holds bit for bit (the committed step's), split into byte planes
// (sign and exponent bytes barely change in one AdamW step, so their plane is nearly all zeros)
// and compressed with zstd. Exact: the receiver gets the same bits, so deterministic mode keeps
// its bit-identity. A header carries the piece's length and the CRC-32C of the updated bits, so a
// receiver whose base differs (or a damaged message) fails with DataLoss instead of training on
// wrong parameters. Where the delta would not be smaller, the piece travels raw behind the header.
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
// when it does not encode; returns DeltaCapacity(count).
size_t EncodeRaw(const float* now, size_t count, uint8_t* dst);
// Writes the encoding of now[0, count) against base[0, count) to dst (DeltaCapacity(count)
// bytes); returns how many bytes it wrote. `scratch` is reused between calls.
size_t EncodeDelta(const float* now, const float* base, size_t count, uint8_t* dst,
                   std::vector<uint8_t>* scratch);
// out[0, count) = what EncodeDelta encoded, given the same base; src holds `bytes` received bytes
// (a message shorter than its buffer: the header says how much of it is the encoding). out may be
// base. InvalidArgument for a malformed message, DataLoss when the result's CRC differs.
absl::Status DecodeDelta(const uint8_t* src, size_t bytes, const float* base, size_t count,
                         float* out, std::vector<uint8_t>* scratch);
// Whether an encoding of `bytes` bytes was compressed (false: raw floats behind the header).
bool DeltaCompressed(const uint8_t* src, size_t bytes);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_PARAM_DELTA_H_
