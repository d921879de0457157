// elastic_internal.h — private to ElasticRank's three sources: the point-to-point tags, so that
// the step (elastic.cc), the pipeline grid (elastic_stages.cc) and reconfiguration
// (elastic_configure.cc) never reuse one another's, and the few helpers they share.
#ifndef TROUPE_TRAIN_ELASTIC_INTERNAL_H_
#define TROUPE_TRAIN_ELASTIC_INTERNAL_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "troupe/collectives/canonical_combine.h"
#include "troupe/collectives/communicator.h"
#include "troupe/model/array_ops.h"
#include "troupe/train/shard_layout.h"

namespace troupe::train::elastic_internal {

// Point-to-point tags: mirror to buddy, then state moves (two per piece: m, v; parameters from
// kTagParamMoveBase: old rank × kParamPiecesPerOldRank + the piece's index in that old range).
constexpr uint32_t kTagMirrorM = 1, kTagMirrorV = 2, kTagMirrorP = 3, kTagCrc = 4,
                   kTagMirrorGrad = 5, kTagMoveBase = 16, kTagParamMoveBase = 1u << 24,
                   kParamPiecesPerOldRank = 16;
// Pipeline tags (user tags have 31 bits): bit 30; bit 29 for the gradient exchange, bit 28 for
// the parameters' share (else the schedule's moves); the step's low 8 bits in bits 20–27.
constexpr uint32_t kTagPipelineBase = 1u << 30, kTagExchange = 1u << 29, kTagParamShare = 1u << 28;
inline uint32_t StepTagBits(int64_t step) { return (static_cast<uint32_t>(step) & 0xff) << 20; }

// The same status (code and payloads: a blamed peer), its message prefixed with the step phase
// it failed in.
absl::Status Phase(const char* phase, const absl::Status& s);

// Waits for every one of `works`; the first error.
absl::Status WaitAll(const std::vector<collectives::Work>& works);

// A mirror of the real elements of each range (ranges of padding move nothing): `mine` (my
// range's) to my buddy, the range of the rank I mirror into `theirs`.
void AddRangeMirror(const ShardLayout& layout, int rank, int buddy, const float* mine,
                    float* theirs, uint32_t tag,
                    std::vector<collectives::Communicator::PointToPoint>* moves);

inline collectives::Buffer Buf(model::FloatArray& a) {
  return collectives::Buffer::F32(a.data(), static_cast<size_t>(a.size()));
}
inline collectives::Buffer Buf(const model::FloatArray& a) {
  return collectives::Buffer::F32(const_cast<float*>(a.data()), static_cast<size_t>(a.size()));
}

// The ranks' partials of one flat piece [lo, hi) of an owner's range, by rank (or replica).
struct ExchangePiece {
  int64_t lo = 0, hi = 0;
  std::vector<const float*> partial;
};
// Each piece's partials combined by `plan` (the canonical tree over the ranks' microbatch
// blocks) into shard + (piece.lo - shard_begin); `inner` holds the plan's temporaries, grown as
// needed and kept for the next call.
[[nodiscard]] absl::Status CombinePieces(model::ArrayOps* ops, const collectives::CombinePlan& plan,
                                         const std::vector<ExchangePiece>& pieces, float* shard,
                                         int64_t shard_begin,
                                         std::vector<model::FloatArray>* inner);

// Wall time since construction.
class Stopwatch {
 public:
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace troupe::train::elastic_internal

#endif  // TROUPE_TRAIN_ELASTIC_INTERNAL_H_
