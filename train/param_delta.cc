#include "param_delta.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "troupe/model/crc32c.h"

namespace troupe::train {
namespace {

constexpr uint32_t kMagic = 0x544c4454;  // "TDLT"
enum Kind : uint32_t { kRaw = 0, kPlanes = 1 };
// zstd's fastest levels: a piece must cost less CPU than the link time it saves.
constexpr int kLevel = 1;

struct Header {
  uint32_t magic = kMagic;
  uint32_t kind = kRaw;
  uint64_t count = 0;    // floats
  uint64_t payload = 0;  // bytes after the header
  uint32_t crc = 0;      // CRC-32C of the floats' bits
  uint32_t reserved = 0;
};
static_assert(sizeof(Header) == 32);

}  // namespace

size_t DeltaCapacity(size_t count) { return sizeof(Header) + count * sizeof(float); }

size_t EncodeRaw(const float* now, size_t count, uint8_t* dst) {
  Header h;
  h.count = count;
  h.payload = count * sizeof(float);
  std::memcpy(dst, &h, sizeof(h));
  std::memcpy(dst + sizeof(Header), now, h.payload);
  return sizeof(Header) + h.payload;
}

size_t EncodeDelta(const float* now, const float* base, size_t count, uint8_t* dst,
                   std::vector<uint8_t>* scratch) {
  const size_t raw = count * sizeof(float);
  scratch->resize(raw);
  uint8_t* planes = scratch->data();
  for (size_t i = 0; i < count; ++i) {
    uint32_t a, b;
    std::memcpy(&a, now + i, 4);
    std::memcpy(&b, base + i, 4);
    const uint32_t x = a ^ b;
    planes[i] = static_cast<uint8_t>(x);
    planes[count + i] = static_cast<uint8_t>(x >> 8);
    planes[2 * count + i] = static_cast<uint8_t>(x >> 16);
    planes[3 * count + i] = static_cast<uint8_t>(x >> 24);
  }
  // No smaller than raw (or zstd failed): raw floats behind the header.
  const size_t z = ZSTD_compress(dst + sizeof(Header), raw, planes, raw, kLevel);
  if (ZSTD_isError(z) || z >= raw) return EncodeRaw(now, count, dst);
  Header h;
  h.kind = kPlanes;
  h.count = count;
  h.payload = z;
  h.crc = model::Crc32c(now, raw);
  std::memcpy(dst, &h, sizeof(h));
  return sizeof(Header) + h.payload;
}

bool EncodeNextShare(bool encoding, uint64_t bytes, double posting, double seconds) {
  // The link kept up with the optimizer (the sends were done soon after the last was posted):
  // fewer bytes would not end the step sooner, and encoding only costs CPU. An encoded share
  // posts later and sends a quarter fewer bytes, so it ends its sends sooner after the last
  // post than the same share raw would: it stays on unless its tail was under a tenth.
  if (seconds - posting < (encoding ? 0.1 : 0.25) * seconds) return false;
  const double rate = static_cast<double>(bytes) / std::max(seconds, 1e-9);  // bytes a second
  return rate < (encoding ? 100e6 : 50e6);
}

bool DeltaCompressed(const uint8_t* src, size_t bytes) {
  Header h;
  if (bytes < sizeof(h)) return false;
  std::memcpy(&h, src, sizeof(h));
  return h.magic == kMagic && h.kind == kPlanes;
}

absl::Status DecodeDelta(const uint8_t* src, size_t bytes, const float* base, size_t count,
                         float* out, std::vector<uint8_t>* scratch) {
  Header h;
  if (bytes < sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter delta: ", bytes, " bytes, shorter than its 32-byte header"));
  }
  std::memcpy(&h, src, sizeof(h));
  const size_t raw = count * sizeof(float);
  if (h.magic != kMagic || h.count != count || (h.kind != kRaw && h.kind != kPlanes) ||
      h.payload > bytes - sizeof(h) || (h.kind == kRaw && h.payload != raw)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "parameter delta: header (magic %08x, kind %u, %u floats, %u bytes) does not fit a "
        "piece of %u floats in %u bytes (magic %08x expected)",
        h.magic, h.kind, h.count, h.payload, count, bytes, kMagic));
  }
  const uint8_t* payload = src + sizeof(h);
  if (h.kind == kRaw) {
    std::memcpy(out, payload, raw);
    return absl::OkStatus();
  }
  scratch->resize(raw);
  uint8_t* planes = scratch->data();
  const size_t got = ZSTD_decompress(planes, raw, payload, h.payload);
  if (ZSTD_isError(got) || got != raw) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter delta: the compressed planes do not decode to ", raw,
        " bytes: ", ZSTD_isError(got) ? ZSTD_getErrorName(got) : absl::StrCat(got, " bytes")));
  }
  for (size_t i = 0; i < count; ++i) {
    const uint32_t x = uint32_t{planes[i]} | uint32_t{planes[count + i]} << 8 |
                       uint32_t{planes[2 * count + i]} << 16 |
                       uint32_t{planes[3 * count + i]} << 24;
    uint32_t b;
    std::memcpy(&b, base + i, 4);
    b ^= x;
    std::memcpy(out + i, &b, 4);
  }
  if (const uint32_t crc = model::Crc32c(out, raw); crc != h.crc) {
    return absl::DataLossError(absl::StrFormat(
        "parameter delta: the decoded piece's CRC-32C is %08x, the sender's %08x (the ranks' "
        "committed parameters differ, or the message was damaged)",
        crc, h.crc));
  }
  return absl::OkStatus();
}

}  // namespace troupe::train
