// Compressed all-reduce with error feedback. Each rank adds its residual to the input, encodes
// (top-k: the k largest magnitudes as (index, value) pairs; int8: per-block scale + int8 codes),
// keeps what the encoding lost as the new residual, all-gathers the fixed-size encodings and
// decodes them in rank order (so every rank computes the bit-identical sum).
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

size_t EncodedBytes(const CollectiveOptions& o, size_t count, size_t* k_out) {
  if (o.compression == Compression::kTopK) {
    size_t k = static_cast<size_t>(std::ceil(o.topk_fraction * static_cast<double>(count)));
    k = std::min(std::max<size_t>(k, 1), count);
    *k_out = k;
    return k * sizeof(TopKEntry);
  }
  const size_t blocks = (count + kInt8Block - 1) / kInt8Block;
  return blocks * (sizeof(float) + kInt8Block);
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

void DecodeAdd(const CollectiveOptions& o, const uint8_t* src, size_t count, size_t k, float* out) {
  if (o.compression == Compression::kTopK) {
    const auto* e = reinterpret_cast<const TopKEntry*>(src);
    for (size_t i = 0; i < k; ++i) {
      if (e[i].index < count) out[e[i].index] += e[i].value;
    }
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

}  // namespace

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
  for (size_t i = 0; i < count; ++i) residual[i] += in[i];
  size_t k = 0;
  const size_t enc = EncodedBytes(o, count, &k);
  auto* all = static_cast<uint8_t*>(c.t->Scratch(3, enc * n));
  if (o.compression == Compression::kTopK) {
    EncodeTopK(residual.data(), count, k, all + r * enc);
  } else {
    EncodeInt8(residual.data(), count, all + r * enc);
  }
  std::vector<size_t> off(n + 1);
  for (int i = 0; i <= n; ++i) off[i] = enc * i;
  TROUPE_RETURN_IF_ERROR(RingAllGather(c, all, off, 8));
  std::fill(out, out + count, 0.0f);
  for (int q = 0; q < n; ++q) DecodeAdd(o, all + q * enc, count, k, out);
  if (op == ReduceOp::kAvg) {
    for (size_t i = 0; i < count; ++i) out[i] /= static_cast<float>(n);
  }
  return absl::OkStatus();
}

}  // namespace troupe::collectives
