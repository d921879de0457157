// The encodings (troupe/collectives/compression.h), and the compressed all-reduce with error
// feedback: each rank adds its residual to the input, encodes (top-k: the k largest magnitudes as
// (index, value) pairs; int8: per-block scale + int8 codes), keeps what the encoding lost as the
// new residual, all-gathers the fixed-size encodings and decodes them in rank order (so every
// rank computes the bit-identical sum).
#include "troupe/collectives/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine.h"
#include "troupe/base/status_macros.h"

namespace troupe::collectives {
namespace {

constexpr size_t kInt8Block = 256;

struct TopKEntry {
  uint32_t index;
  float value;
};

size_t TopK(double fraction, size_t count) {
  const size_t k = static_cast<size_t>(std::ceil(fraction * static_cast<double>(count)));
  return std::min(std::max<size_t>(k, 1), count);
}

void EncodeTopK(float* acc, size_t count, size_t k, uint8_t* dst) {
  std::vector<uint32_t> idx(count);
  std::iota(idx.begin(), idx.end(), 0u);
  auto greater = [acc](uint32_t a, uint32_t b) {
    float fa = std::fabs(acc[a]), fb = std::fabs(acc[b]);
    return fa > fb || (fa == fb && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), greater);
  std::sort(idx.begin(), idx.begin() + k);
  auto* e = reinterpret_cast<TopKEntry*>(dst);
  for (size_t i = 0; i < k; ++i) {
    e[i] = {idx[i], acc[idx[i]]};
    acc[idx[i]] = 0.0f;  // sent: nothing left over
  }
}

void EncodeInt8(float* acc, size_t count, uint8_t* dst) {
  for (size_t b = 0; b * kInt8Block < count; ++b) {
    const size_t lo = b * kInt8Block, hi = std::min(count, lo + kInt8Block);
    float maxabs = 0.0f;
    for (size_t i = lo; i < hi; ++i) maxabs = std::max(maxabs, std::fabs(acc[i]));
    const float scale = maxabs > 0.0f ? maxabs / 127.0f : 1.0f;
    uint8_t* rec = dst + b * (sizeof(float) + kInt8Block);
    std::memcpy(rec, &scale, sizeof(float));
    auto* q = reinterpret_cast<int8_t*>(rec + sizeof(float));
    for (size_t i = lo; i < hi; ++i) {
      const float v = std::nearbyint(acc[i] / scale);
      const int8_t c = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v)));
      q[i - lo] = c;
      acc[i] -= static_cast<float>(c) * scale;
    }
    for (size_t i = hi - lo; i < kInt8Block; ++i) q[i] = 0;
  }
}

}  // namespace

size_t CompressedBytes(Compression c, double topk_fraction, size_t count) {
  switch (c) {
    case Compression::kTopK:
      return TopK(topk_fraction, count) * sizeof(TopKEntry);
    case Compression::kInt8:
      return (count + kInt8Block - 1) / kInt8Block * (sizeof(float) + kInt8Block);
    case Compression::kNone:
      break;
  }
  return count * sizeof(float);
}

void EncodeWithFeedback(Compression c, double topk_fraction, const float* in, size_t count,
                        float* residual, uint8_t* dst) {
  for (size_t i = 0; i < count; ++i) residual[i] += in[i];
  switch (c) {
    case Compression::kTopK:
      return EncodeTopK(residual, count, TopK(topk_fraction, count), dst);
    case Compression::kInt8:
      return EncodeInt8(residual, count, dst);
    case Compression::kNone:
      break;
  }
  std::memcpy(dst, residual, count * sizeof(float));
  std::fill(residual, residual + count, 0.0f);
}

void DecodeAdd(Compression c, double topk_fraction, const uint8_t* src, size_t count, float* out) {
  if (c == Compression::kTopK) {
    const auto* e = reinterpret_cast<const TopKEntry*>(src);
    for (size_t i = 0, k = TopK(topk_fraction, count); i < k; ++i) {
      if (e[i].index < count) out[e[i].index] += e[i].value;
    }
    return;
  }
  if (c == Compression::kNone) {
    const auto* f = reinterpret_cast<const float*>(src);
    for (size_t i = 0; i < count; ++i) out[i] += f[i];
    return;
  }
  for (size_t b = 0; b * kInt8Block < count; ++b) {
    const size_t lo = b * kInt8Block, hi = std::min(count, lo + kInt8Block);
    const uint8_t* rec = src + b * (sizeof(float) + kInt8Block);
    float scale;
    std::memcpy(&scale, rec, sizeof(float));
    const auto* q = reinterpret_cast<const int8_t*>(rec + sizeof(float));
    for (size_t i = lo; i < hi; ++i) out[i] += static_cast<float>(q[i - lo]) * scale;
  }
}

absl::Status CompressedAllReduce(const OpContext& c, const float* in, float* out, size_t count,
                                 ReduceOp op, const CollectiveOptions& o) {
  const int n = c.t->size(), r = c.t->rank();
  std::vector<float>& residual = o.compression_state->residual;
  if (residual.empty()) residual.assign(count, 0.0f);
  if (residual.size() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllReduce: compression_state.residual.size() expected ", count, ", got ",
                     residual.size()));
  }
  // The residual becomes the accumulator; encoding leaves the new residual behind in it.
  const size_t enc = CompressedBytes(o.compression, o.topk_fraction, count);
  auto* all = static_cast<uint8_t*>(c.t->Scratch(3, enc * n));
  EncodeWithFeedback(o.compression, o.topk_fraction, in, count, residual.data(), all + r * enc);
  std::vector<size_t> off(n + 1);
  for (int i = 0; i <= n; ++i) off[i] = enc * i;
  TROUPE_RETURN_IF_ERROR(RingAllGather(c, all, off, 8));
  std::fill(out, out + count, 0.0f);
  for (int q = 0; q < n; ++q) DecodeAdd(o.compression, o.topk_fraction, all + q * enc, count, out);
  if (op == ReduceOp::kAvg) {
    for (size_t i = 0; i < count; ++i) out[i] /= static_cast<float>(n);
  }
  return absl::OkStatus();
}

}  // namespace troupe::collectives
