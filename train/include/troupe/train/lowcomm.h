// troupe/train/lowcomm.h — training over slow links: the arithmetic of the low-communication mode
// ([lowcomm] in the job spec). Pure functions over host floats, the same bits on every rank that
// calls them with the same inputs.
//
// The ranks are cut into groups (by failure domain, or by rank). Inside a group training is
// today's sharded data parallelism — the inner steps, AdamW. Every H inner steps (a round) each
// group g sends its pseudo-gradient Δ_g = θ_global − θ_g, the change its inner steps made, and an
// outer optimizer applies their average to θ_global, which every group then continues from
// (DiLoCo: Douillard et al. 2023, Nesterov momentum as there):
//
//   m ← μ·m + Δ̄        θ_global ← θ_global − lr·(Δ̄ + μ·m)        Δ̄ = mean of the Δ_g that arrived
//
// - Streaming (F fragments): the model is cut into F contiguous fragments; fragment f is
//   synchronised after inner steps k·H + f·H/F (k ≥ 1), so the exchange is spread over the round.
//   Every fragment is synchronised after the job's last step, so every group ends on θ_global.
// - Compression with error feedback (collectives/compression.h): a group sends its Δ encoded
//   (int8, or the top-k fraction of magnitudes) and keeps what the encoding lost as its residual,
//   added to its next Δ: over any number of rounds, Σ sent + residual = Σ Δ.
// - A robust outer step: a Δ whose norm is more than robust_factor × the median of the norms is
//   clipped to that norm, or left out of the round; a non-finite one always is. (A median needs
//   three groups or more to single one out.)
// - Stale (stale_outer): round k's exchange is posted where it ends and waited for where round
//   k+1 ends, so it overlaps k+1's inner steps; there θ_global takes round k's Δ̄ and a group
//   continues from θ_global − Δ_g(k+1) (its own newest round, not yet averaged).
// - Deterministic: the groups' Δ are summed in group order, the norms in a fixed order; so for a
//   given membership history (which groups contributed to which round) the bits are the same.
#ifndef TROUPE_TRAIN_LOWCOMM_H_
#define TROUPE_TRAIN_LOWCOMM_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/collectives/communicator.h"

namespace troupe::train {

enum class RobustOuter : int32_t { kNone = 0, kClip = 1, kReject = 2 };

struct LowCommOptions {
  int64_t inner_steps = 50;  // H
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;  // Nesterov
  int32_t fragments = 1;        // F; divides H
  collectives::Compression compression = collectives::Compression::kNone;
  double topk_fraction = 0.01;  // kTopK
  RobustOuter robust = RobustOuter::kNone;
  double robust_factor = 3.0;
  // Every rank checks after every round that Σ sent + residual = Σ Δ of its group (within float
  // rounding; two model-size sums of doubles): a violation fails the step, naming the element.
  bool verify_feedback = false;
  // The overlapping variant (one round stale): a round's exchange runs while the next round's
  // inner steps do, and the outer step where a round ends applies the previous round's Δ̄. A group
  // goes on from θ_global (through that round) minus its own Δ of the round just ended, and its
  // next Δ is the change from there. After the job's last step both are applied.
  bool stale_outer = false;
};

// "none", "int8" or "topk:<fraction>" (0 < fraction <= 1); InvalidArgument naming what it got.
[[nodiscard]] absl::Status ParseCompression(const std::string& text, LowCommOptions* o);
std::string CompressionName(const LowCommOptions& o);
// "none", "clip", "reject".
[[nodiscard]] absl::StatusOr<RobustOuter> ParseRobustOuter(const std::string& text);
const char* RobustOuterName(RobustOuter r);

// Fragment f of `fragments` over n parameters: [lo, hi), the fragments contiguous and covering
// [0, n) in order, sizes differing by at most one.
std::pair<int64_t, int64_t> FragmentRange(int64_t n, int32_t fragments, int32_t f);
// The fragments synchronised once `steps` inner steps are committed, in order (`total`: the job's
// steps, after which every fragment is).
std::vector<int32_t> FragmentsDueAfter(const LowCommOptions& o, int64_t steps, int64_t total);

// Δ = global − local over `count` floats, encoded with error feedback into `dst`
// (collectives::CompressedBytes of count) — `residual` the group's, updated.
void EncodePseudoGradient(const LowCommOptions& o, const float* global, const float* local,
                          size_t count, float* residual, uint8_t* dst);

// One group's encoded Δ of a fragment.
struct GroupUpdate {
  int32_t group = 0;
  const uint8_t* encoded = nullptr;
};
struct OuterOutcome {
  std::vector<int32_t> applied;   // in group order
  std::vector<int32_t> clipped;   // applied after clipping (kClip)
  std::vector<int32_t> rejected;  // left out: an outlier (kReject) or non-finite
  std::vector<double> norms;      // of every update, as given
  double median_norm = 0;
};
// The outer step on one fragment (`count` floats of θ_global and of the momentum): decodes every
// update (given in increasing group order), applies the robust rule, and takes the Nesterov step
// with the mean of the applied ones. Nothing changes when none is applied.
[[nodiscard]] absl::StatusOr<OuterOutcome> OuterStep(const LowCommOptions& o,
                                                     const std::vector<GroupUpdate>& updates,
                                                     size_t count, float* global, float* momentum);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_LOWCOMM_H_
