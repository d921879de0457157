#include "reduce.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace troupe::collectives {

size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

void Bf16ToF32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}

void F32ToBf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = F32ToBf16(in[i]);
}

void ReduceInto(float* __restrict dst, const float* __restrict src, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
}

void Combine(float* dst, const float* a, const float* b, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
  }
}

namespace {

// 64 bytes a turn, stored around the caches (non-temporal) or through them.
template <bool kStreamed>
void CopyLines(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    for (size_t k = 0; k < 64; k += 16) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k));
      if constexpr (kStreamed) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + k), x);
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + k), x);
      }
    }
  }
  std::memcpy(d + i, s + i, bytes - i);
  if constexpr (kStreamed) _mm_sfence();  // ordered before the release store that tells the peers
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace

void StreamCopy(void* dst, const void* src, size_t bytes) { CopyLines<true>(dst, src, bytes); }
void VectorCopy(void* dst, const void* src, size_t bytes) { CopyLines<false>(dst, src, bytes); }

int StagingCopy::KindOf(size_t bytes, bool gather) {
  int c = 0;
  while (c + 1 < kSizeClasses && (bytes >> (2 * (c + 1))) > 0) ++c;
  return 2 * c + (gather ? 1 : 0);
}

StagingCopy::Choice StagingCopy::Next(size_t bytes, bool gather, bool can_read_peers, bool prior) {
  Kind& k = kinds_[KindOf(bytes, gather)];
  if (k.ops == 0) k.single_copy = prior && can_read_peers;
  const uint64_t op = k.ops++;
  // The path not taken is measured every `stretch` periods only.
  const uint64_t staged_every = kMeasureEvery * (k.single_copy ? k.stretch : 1);
  const uint64_t single_every = kMeasureEvery * (k.single_copy ? 1 : k.stretch);
  if (op % staged_every == 0) return {false, true, false};
  if (op % staged_every == kMeasureEvery / 2) return {true, true, false};
  if (can_read_peers && op % single_every == kMeasureEvery / 4) return {false, true, true};
  if (k.single_copy) return {false, false, true};
  // Until streamed writes were measured (the first kMeasureEvery / 2 operations), cached ones.
  return {k.ns_per_byte[1] > 0 && k.ns_per_byte[1] < k.ns_per_byte[0], false, false};
}

void StagingCopy::Record(size_t bytes, bool gather, Choice how, double seconds) {
  if (bytes == 0) return;
  double& mean = kinds_[KindOf(bytes, gather)].ns_per_byte[how.single_copy ? 2
                                                           : how.streamed  ? 1
                                                                           : 0];
  const double x = std::max(seconds * 1e9 / static_cast<double>(bytes), 1e-6);
  mean = mean == 0 ? x : 0.5 * mean + 0.5 * x;
}

StagingCopy::Estimate StagingCopy::Estimated(size_t bytes, bool gather) const {
  const Kind& k = kinds_[KindOf(bytes, gather)];
  const double cached = k.ns_per_byte[0], streamed = k.ns_per_byte[1];
  return {streamed > 0 && cached > 0 ? std::min(cached, streamed) : cached, k.ns_per_byte[2]};
}

void StagingCopy::Agree(size_t bytes, bool gather, const std::vector<Estimate>& all) {
  double staged = 0, single_copy = 0;
  for (const Estimate& e : all) {
    if (e.staged <= 0 || e.single_copy <= 0) return;
    staged = std::max(staged, e.staged);
    single_copy = std::max(single_copy, e.single_copy);
  }
  if (all.empty()) return;
  Kind& k = kinds_[KindOf(bytes, gather)];
  k.single_copy = k.single_copy ? !(staged * 1.05 < single_copy) : single_copy * 1.05 < staged;
  const double loser_over_winner = k.single_copy ? staged / single_copy : single_copy / staged;
  k.stretch = loser_over_winner < 1.25 ? 1 : loser_over_winner < 2 ? 4 : 16;
}

void DivideBy(float* x, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) x[i] /= divisor;
}

}  // namespace troupe::collectives
