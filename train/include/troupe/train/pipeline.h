// troupe/train/pipeline.h — the pieces of pipeline parallelism that are pure arithmetic: where a
// rank sits in a DP × PP grid, which units (the GPT's blocks) each stage holds, and the order in
// which a stage runs its microbatches' forwards and backwards (1F1B, GPipe). ElasticRank
// (elastic.h) runs them; the coordinator plans the grid.
//
// Grid: W = dp · pp ranks; rank r is replica r % dp of stage r / dp. Replica d of every stage
// computes microbatch block d of the step (MicrobatchBlocks(M, dp)), so the canonical tree sum of
// each parameter's gradient is the one a data-parallel run of world dp computes.
//
// Example:
//   for (const PipelineOp& op : StageOps(PipelineSchedule::kOneFOneB, /*stages=*/4, /*stage=*/1,
//                                        /*microbatches=*/8)) { ... }
#ifndef TROUPE_TRAIN_PIPELINE_H_
#define TROUPE_TRAIN_PIPELINE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::train {

// Where inside a step chaos strikes a rank (kill-worker@S:R:mid-gather): once the step's gradient
// exchange is under way (posted, not complete: with the overlapped step, during the last
// microbatch's backward pass), or once the share of the updated parameters is.
enum class StepPoint : int32_t { kExchange = 0, kGather = 1, kCheckpoint = 2 };

// "mid-exchange", "mid-gather", "mid-checkpoint".
const char* StepPointName(StepPoint point);

// How the sharded step's updated parameters travel to the other ranks ([elastic] param_delta,
// ElasticRank::Options::param_delta): kOff as they are; kOn as a lossless delta against the
// parameters every rank holds (train/param_delta.h: fewer bytes, the same bits, CPU to encode);
// kAuto framed so either can travel, and delta-encoded by a rank whose share of the previous step
// crossed its link slower than the encoding pays for (host memory, peers on other hosts).
enum class ParamDelta : int32_t { kAuto = 0, kOn = 1, kOff = 2 };
const char* ParamDeltaName(ParamDelta d);

enum class PipelineSchedule : int32_t {
  // Warm-up forwards, then one forward and one backward alternately, then the remaining
  // backwards: at most min(m, p − s) microbatches in flight on stage s.
  kOneFOneB = 0,
  // Every forward, then every backward: m in flight (the reference the bubble is measured by).
  kGPipe = 1,
};

// "1f1b" or "gpipe"; anything else InvalidArgument naming the value.
[[nodiscard]] absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(const std::string& text);
std::string PipelineScheduleName(PipelineSchedule schedule);

struct PipelineOp {
  enum class Kind : uint8_t { kForward, kBackward };
  Kind kind = Kind::kForward;
  int32_t microbatch = 0;  // 0-based within the replica's block
  bool operator==(const PipelineOp& o) const {
    return kind == o.kind && microbatch == o.microbatch;
  }
};

// The ops stage `stage` of `stages` runs for `microbatches` microbatches, in order. Backwards
// come in microbatch order on every stage (the gradient sum adds them in that order).
std::vector<PipelineOp> StageOps(PipelineSchedule schedule, int stages, int stage,
                                 int microbatches);
// The most microbatches forwarded and not yet backwarded at any point of `ops`.
int MaxInFlight(const std::vector<PipelineOp>& ops);

// What each unit (the GPT's block) costs to run forward and backward, and what the first and
// the last stage cost beyond their units (the GPT: its head and loss on the last), in any one
// unit of work (the GPT: multiply-adds per token).
struct StageCosts {
  std::vector<double> units;
  double first = 0;
  double last = 0;
};

// Contiguous [first, end) unit ranges for `stages` stages, in order, minimising the most
// expensive stage; among the partitions that do, later stages take fewer units (equal costs:
// sizes differ by one at most, the earlier stages taking the extra units). InvalidArgument
// unless 1 <= stages <= the units.
[[nodiscard]] absl::StatusOr<std::vector<std::pair<int, int>>> PartitionUnits(
    const StageCosts& costs, int stages);

// The stages of a grid of `world` ranks for a job that asked for `requested`: the divisor d of
// `world` closest to `requested` with d <= units (a stage holds a unit at least) and
// world / d <= microbatches (a replica computes a microbatch at least); ties go to the larger d
// (less memory per rank). 0 when no divisor fits.
int ChooseStages(int world, int requested, int units, int microbatches);

struct GridPosition {
  int replica = 0;  // d: which microbatch block
  int stage = 0;    // s: which units
};
// Where rank `rank` of a world of dp · stages ranks sits.
inline GridPosition GridPositionOf(int rank, int world, int stages) {
  const int dp = world / stages;
  return {rank % dp, rank / dp};
}
inline int GridRank(GridPosition p, int world, int stages) {
  return p.stage * (world / stages) + p.replica;
}

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_PIPELINE_H_
