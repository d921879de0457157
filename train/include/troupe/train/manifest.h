// The checkpoint manifest in memory, and its bounded, validated Cap'n Proto encoding
// (schema: train/checkpoint.capnp).
//
// On disk: a 16-byte envelope — magic "TRPCKMAN", u32 message length, u32 CRC32C of the message —
// then the flat Cap'n Proto message. DecodeManifest never crashes on any input: a damaged envelope
// or message, or one whose fields are inconsistent (shards not covering [0, num_params) in order,
// sizes that disagree with the ranges, unsafe file names, an invalid GPT config), is DataLoss
// naming the file and what was expected.
//
// Example:
//   CheckpointManifest m{.num_params = n, .step = 10, .shards = {{"shard-00000.bin", 0, n, ...}}};
//   std::string bytes = EncodeManifest(m);
//   absl::StatusOr<CheckpointManifest> back = DecodeManifest(bytes, "ckpt/step-10/manifest.bin");
#ifndef TROUPE_TRAIN_MANIFEST_H_
#define TROUPE_TRAIN_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "troupe/model/config.h"

namespace troupe::train {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr uint64_t kMaxManifestBytes = 16 << 20;
inline constexpr size_t kMaxShardFiles = 1 << 16;

// One shard file: elements [begin, end) of the flat vector; params, then (with moments) m, v.
struct ShardFileInfo {
  std::string name;  // a plain file name inside the step directory
  int64_t begin = 0;
  int64_t end = 0;
  uint64_t byte_size = 0;
  uint32_t crc32c = 0;

  bool operator==(const ShardFileInfo& o) const;
};

struct CheckpointManifest {
  uint32_t format_version = kCheckpointFormatVersion;
  std::optional<model::GptConfig> gpt_config;  // absent for models other than the GPT
  int64_t num_params = 0;
  int64_t step = 0;
  uint64_t seed = 0;
  int32_t world_size = 1;  // layout at save time
  int64_t generation = 0;
  bool has_moments = true;
  bool has_outer = false;  // [lowcomm]: θ_global and the outer momentum after the moments
  int64_t optimizer_step = 0;
  std::vector<ShardFileInfo> shards;  // in range order

  bool operator==(const CheckpointManifest& o) const;
  std::string DebugString() const;
};

// Bytes a shard file of elements [begin, end) holds.
uint64_t ShardByteSize(int64_t begin, int64_t end, bool has_moments, bool has_outer = false);

// DataLoss naming `file` unless the manifest is self-consistent (see the banner).
[[nodiscard]] absl::Status ValidateManifest(const CheckpointManifest& manifest,
                                            const std::string& file);

std::string EncodeManifest(const CheckpointManifest& manifest);
[[nodiscard]] absl::StatusOr<CheckpointManifest> DecodeManifest(absl::string_view bytes,
                                                                const std::string& file);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_MANIFEST_H_
