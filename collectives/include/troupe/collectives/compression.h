// troupe/collectives/compression.h — the encodings CollectiveOptions::compression names, as pure
// functions: the compressed AllReduce uses them, and so does training's low-communication mode
// (train/lowcomm.h), which exchanges one group's update at a time.
//
// Error feedback: EncodeWithFeedback adds `in` to `residual`, encodes that sum and leaves in
// `residual` what the encoding lost, so that over any number of calls
//   Σ decoded + residual = Σ in   (within float rounding).
// Encodings are deterministic (ties broken by index) and of a size fixed by the count alone.
//   kInt8: per 256-element block, a float scale (max |x| / 127) and 256 int8 codes;
//   kTopK: the ceil(fraction · count) largest magnitudes (at least 1) as (uint32 index, float).
#ifndef TROUPE_COLLECTIVES_COMPRESSION_H_
#define TROUPE_COLLECTIVES_COMPRESSION_H_

#include <cstddef>
#include <cstdint>

#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

// Bytes of one encoding of `count` floats (kNone: the floats themselves).
size_t CompressedBytes(Compression c, double topk_fraction, size_t count);
// residual += in; dst (CompressedBytes) = the encoding of residual; residual -= what dst carries.
void EncodeWithFeedback(Compression c, double topk_fraction, const float* in, size_t count,
                        float* residual, uint8_t* dst);
// out += the floats `src` (an encoding of `count` floats) carries. Indices past count are ignored.
void DecodeAdd(Compression c, double topk_fraction, const uint8_t* src, size_t count, float* out);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_COMPRESSION_H_
