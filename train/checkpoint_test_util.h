// Test helpers for the checkpoint tests: a deterministic model state and shard layouts over it.
#ifndef TROUPE_TRAIN_CHECKPOINT_TEST_UTIL_H_
#define TROUPE_TRAIN_CHECKPOINT_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/train/checkpoint_store.h"

namespace troupe::train::testing {

// A flat state of n elements whose values depend on (seed, index, which tensor), including
// values that are not round decimals, negative zero and a subnormal, to catch any conversion.
struct State {
  std::vector<float> params, m, v;
};
State MakeState(int64_t n, uint32_t seed);

// Views of state split at the given boundaries (0 < b1 < b2 < ... < n).
std::vector<ShardView> Split(const State& state, const std::vector<int64_t>& cuts);
// Views of state split into world_size near-equal ranges.
std::vector<ShardView> SplitEven(const State& state, int world_size);

// Meta for a checkpoint of state at step (no GPT config).
CheckpointManifest Meta(int64_t num_params, int64_t step, int32_t world_size = 1);

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b);

// Forwards to `base`, calling Before(op) ahead of every mutating operation (op is e.g.
// "Append ckpt/step-2/shard-00000.bin.tmp"); a non-OK result is returned instead of the operation.
class HookedFileSystem : public FileSystem {
 public:
  explicit HookedFileSystem(FileSystem* base) : base_(base) {}
  [[nodiscard]] virtual absl::Status Before(const std::string& op) = 0;

  [[nodiscard]] absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(
      const std::string& path) override {
    return base_->OpenForRead(path);
  }
  [[nodiscard]] absl::Status Rename(const std::string& from, const std::string& to) override;
  [[nodiscard]] absl::Status SyncDir(const std::string& dir) override;
  [[nodiscard]] absl::Status CreateDir(const std::string& dir) override;
  [[nodiscard]] absl::Status DeleteFile(const std::string& path) override;
  [[nodiscard]] absl::Status DeleteDir(const std::string& dir) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }

 private:
  FileSystem* base_;
};

}  // namespace troupe::train::testing

#endif  // TROUPE_TRAIN_CHECKPOINT_TEST_UTIL_H_
