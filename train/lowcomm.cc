#include "troupe/train/lowcomm.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "troupe/collectives/compression.h"

namespace troupe::train {

using collectives::Compression;

absl::Status ParseCompression(const std::string& text, LowCommOptions* o) {
  double fraction = 0;
  if (text == "none" || text == "int8") {
    o->compression = text == "none" ? Compression::kNone : Compression::kInt8;
    return absl::OkStatus();
  }
  if (absl::StartsWith(text, "topk:") && absl::SimpleAtod(text.substr(5), &fraction) &&
      fraction > 0 && fraction <= 1) {
    o->compression = Compression::kTopK;
    o->topk_fraction = fraction;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected \"none\", \"int8\" or \"topk:<fraction>\" (0 < fraction <= 1), got \"",
                   text, "\""));
}

std::string CompressionName(const LowCommOptions& o) {
  switch (o.compression) {
    case Compression::kInt8:
      return "int8";
    case Compression::kTopK:
      return absl::StrCat("topk:", o.topk_fraction);
    case Compression::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<RobustOuter> ParseRobustOuter(const std::string& text) {
  for (RobustOuter r : {RobustOuter::kNone, RobustOuter::kClip, RobustOuter::kReject}) {
    if (text == RobustOuterName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected \"none\", \"clip\" or \"reject\", got \"", text, "\""));
}

const char* RobustOuterName(RobustOuter r) {
  switch (r) {
    case RobustOuter::kClip:
      return "clip";
    case RobustOuter::kReject:
      return "reject";
    case RobustOuter::kNone:
      break;
  }
  return "none";
}

std::pair<int64_t, int64_t> FragmentRange(int64_t n, int32_t fragments, int32_t f) {
  const int64_t base = n / fragments, extra = n % fragments;
  const int64_t lo = f * base + std::min<int64_t>(f, extra);
  return {lo, lo + base + (f < extra ? 1 : 0)};
}

std::vector<int32_t> FragmentsDueAfter(const LowCommOptions& o, int64_t steps, int64_t total) {
  std::vector<int32_t> due;
  const int64_t h = o.inner_steps, offset = h / o.fragments;
  for (int32_t f = 0; f < o.fragments; ++f) {
    const int64_t since = steps - f * offset;
    if (steps == total || (since >= h && since % h == 0)) due.push_back(f);
  }
  return due;
}

void EncodePseudoGradient(const LowCommOptions& o, const float* global, const float* local,
                          size_t count, float* residual, uint8_t* dst) {
  std::vector<float> delta(count);
  for (size_t i = 0; i < count; ++i) delta[i] = global[i] - local[i];
  collectives::EncodeWithFeedback(o.compression, o.topk_fraction, delta.data(), count, residual,
                                  dst);
}

namespace {

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

absl::StatusOr<OuterOutcome> OuterStep(const LowCommOptions& o,
                                       const std::vector<GroupUpdate>& updates, size_t count,
                                       float* global, float* momentum) {
  for (size_t i = 1; i < updates.size(); ++i) {
    if (updates[i].group <= updates[i - 1].group) {
      return absl::InvalidArgumentError(
          absl::StrCat("OuterStep: updates expected in increasing group order, got group ",
                       updates[i].group, " after ", updates[i - 1].group));
    }
  }
  OuterOutcome out;
  std::vector<std::vector<float>> deltas(updates.size(), std::vector<float>(count, 0.0f));
  std::vector<double> finite;
  for (size_t i = 0; i < updates.size(); ++i) {
    collectives::DecodeAdd(o.compression, o.topk_fraction, updates[i].encoded, count,
                           deltas[i].data());
    out.norms.push_back(Norm(deltas[i]));
    if (std::isfinite(out.norms.back())) finite.push_back(out.norms.back());
  }
  out.median_norm = Median(finite);
  const double bound = o.robust_factor * out.median_norm;
  std::vector<float> mean(count, 0.0f);
  for (size_t i = 0; i < updates.size(); ++i) {
    const double norm = out.norms[i];
    const bool outlier = o.robust != RobustOuter::kNone && norm > bound;
    if (!std::isfinite(norm) || (outlier && o.robust == RobustOuter::kReject)) {
      out.rejected.push_back(updates[i].group);
      continue;
    }
    if (outlier) {  // kClip: scaled down to the bound
      const float scale = static_cast<float>(bound / norm);
      for (float& x : deltas[i]) x *= scale;
      out.clipped.push_back(updates[i].group);
    }
    for (size_t j = 0; j < count; ++j) mean[j] += deltas[i][j];
    out.applied.push_back(updates[i].group);
  }
  if (out.applied.empty()) return out;
  const float k = static_cast<float>(out.applied.size());
  const float mu = o.outer_momentum, lr = o.outer_lr;
  for (size_t j = 0; j < count; ++j) {
    const float g = mean[j] / k;
    momentum[j] = mu * momentum[j] + g;
    global[j] -= lr * (g + mu * momentum[j]);
  }
  return out;
}

}  // namespace troupe::train
