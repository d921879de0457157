#include "troupe/actors/pipeline.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace troupe::actors {

absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(const std::string& text) {
  if (text == "1f1b") return PipelineSchedule::kOneFOneB;
  if (text == "gpipe") return PipelineSchedule::kGPipe;
  return absl::InvalidArgumentError(
      absl::StrCat("pipeline schedule: expected \"1f1b\" or \"gpipe\", got \"", text, "\""));
}

std::string PipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b";
}

std::vector<PipelineOp> StageOps(PipelineSchedule schedule, int stages, int stage,
                                 int microbatches) {
  using Kind = PipelineOp::Kind;
  const int m = std::max(0, microbatches);
  const int warmup =
      schedule == PipelineSchedule::kGPipe ? m : std::clamp(stages - stage - 1, 0, m);
  std::vector<PipelineOp> ops;
  ops.reserve(2 * m);
  for (int k = 0; k < warmup; ++k) ops.push_back({Kind::kForward, k});
  for (int k = 0; k < m - warmup; ++k) {
    ops.push_back({Kind::kForward, warmup + k});
    ops.push_back({Kind::kBackward, k});
  }
  for (int k = m - warmup; k < m; ++k) ops.push_back({Kind::kBackward, k});
  return ops;
}

int MaxInFlight(const std::vector<PipelineOp>& ops) {
  int now = 0, most = 0;
  for (const PipelineOp& op : ops) {
    now += op.kind == PipelineOp::Kind::kForward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

absl::StatusOr<std::vector<std::pair<int, int>>> PartitionUnits(int units, int stages) {
  if (stages < 1 || stages > units) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stages: expected 1 to ", units,
                                                   " (the model's blocks), got ", stages));
  }
  std::vector<std::pair<int, int>> out;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int size = units / stages + (s < units % stages ? 1 : 0);
    out.emplace_back(first, first + size);
    first += size;
  }
  return out;
}

int ChooseStages(int world, int requested, int units, int microbatches) {
  int best = 0;
  for (int d = 1; d <= std::min(world, units); ++d) {
    if (world % d != 0 || world / d > microbatches) continue;
    if (best == 0 || std::abs(d - requested) <= std::abs(best - requested)) best = d;
  }
  return best;
}

}  // namespace troupe::actors
