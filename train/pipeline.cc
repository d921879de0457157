#include "troupe/train/pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace troupe::train {

const char* StepPointName(StepPoint point) {
  switch (point) {
    case StepPoint::kGather:
      return "mid-gather";
    case StepPoint::kCheckpoint:
      return "mid-checkpoint";
    case StepPoint::kExchange:
      break;
  }
  return "mid-exchange";
}

const char* ParamDeltaName(ParamDelta d) {
  switch (d) {
    case ParamDelta::kOn:
      return "on";
    case ParamDelta::kOff:
      return "off";
    case ParamDelta::kAuto:
      break;
  }
  return "auto";
}

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

absl::StatusOr<std::vector<std::pair<int, int>>> PartitionUnits(const StageCosts& costs,
                                                                int stages) {
  const int units = static_cast<int>(costs.units.size());
  if (stages < 1 || stages > units) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stages: expected 1 to ", units,
                                                   " (the model's blocks), got ", stages));
  }
  std::vector<double> prefix(units + 1, 0);
  for (int u = 0; u < units; ++u) prefix[u + 1] = prefix[u] + costs.units[u];
  // Stage [j, i) of s + 1 stages in all, with its extras.
  auto cost = [&](int j, int i, int s) {
    return prefix[i] - prefix[j] + (s == 0 ? costs.first : 0) + (s == stages - 1 ? costs.last : 0);
  };
  // best[s][i]: the least most-expensive stage over units [0, i) cut into stages 0..s.
  const double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages, std::vector<double>(units + 1, kInf));
  for (int i = 1; i <= units; ++i) best[0][i] = cost(0, i, 0);
  for (int s = 1; s < stages; ++s) {
    for (int i = s + 1; i <= units; ++i) {
      for (int j = s; j < i; ++j)
        best[s][i] = std::min(best[s][i], std::max(best[s - 1][j], cost(j, i, s)));
    }
  }
  // Back from the last stage, each as short as the optimum allows.
  std::vector<std::pair<int, int>> out(stages);
  int end = units;
  for (int s = stages - 1; s > 0; --s) {
    int start = s;
    for (int j = end - 1; j >= s; --j) {
      if (std::max(best[s - 1][j], cost(j, end, s)) == best[s][end]) {
        start = j;
        break;
      }
    }
    out[s] = {start, end};
    end = start;
  }
  out[0] = {0, end};
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

}  // namespace troupe::train
