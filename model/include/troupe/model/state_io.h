// Save and load model + optimizer state: one little-endian, versioned, checksummed file.
//
// Layout (version 1): a 72-byte header — magic "TRPSTATE", version, flags (bit 0: AdamW moments
// present), the five GptConfig fields, step, seed, parameter count, CRC32C of the payload,
// CRC32C of the header — then params, m, v as raw fp32. Written to a temporary name, fsynced and
// renamed, so a crash never leaves a half-written file under the final name. Loading checks every
// field; a damaged file is DataLoss and a foreign or inconsistent one InvalidArgument, each naming
// the file and what was expected.
//
// Example:
//   ASSERT_OK(SaveState("run/state.bin", {config, step, seed, params, m, v}));
//   absl::StatusOr<LoadedState> s = LoadState("run/state.bin");
#ifndef TROUPE_MODEL_STATE_IO_H_
#define TROUPE_MODEL_STATE_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/model/config.h"

namespace troupe::model {

inline constexpr uint32_t kStateVersion = 1;

// What to save; pointers to ParamLayout(config).total_size() floats. m and v are both null (no
// optimizer state) or both set.
struct StateView {
  GptConfig config;
  int64_t step = 0;
  uint64_t seed = 0;
  const float* params = nullptr;
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
};

struct LoadedState {
  GptConfig config;
  int64_t step = 0;
  uint64_t seed = 0;
  std::vector<float> params;
  std::vector<float> adam_m, adam_v;  // empty when saved without optimizer state
};

[[nodiscard]] absl::Status SaveState(const std::string& path, const StateView& state);
[[nodiscard]] absl::StatusOr<LoadedState> LoadState(const std::string& path);

}  // namespace troupe::model

#endif  // TROUPE_MODEL_STATE_IO_H_
