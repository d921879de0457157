// The on-disk checkpoint store: atomic, sharded, checksummed, restorable into any world size.
//
// Layout under `dir` (default "ckpt"):
//   step-<n>/shard-00000.bin …  raw little-endian fp32: params[begin, end), then m, then v (then,
//                               of a [lowcomm] job, θ_global and the outer momentum)
//   step-<n>/manifest.bin       Cap'n Proto manifest (manifest.h): config, step, seed, layout,
//                               ranges, byte size and CRC32C of every shard file, format version
//   LATEST                      "step-<n>\n": the newest complete checkpoint
//   FENCE                       "<epoch>\n": the highest lease epoch that has claimed the store
//
// Write order (a crash at any point leaves LATEST naming a complete checkpoint):
//   1. each shard file and then the manifest: temp name, write, fsync, close, rename;
//   2. fsync step-<n>/, then fsync dir/ (the step directory's own entry);
//   3. LATEST the same way (temp, fsync, rename), then fsync dir/ — the commit point;
//   4. delete checkpoints older than the newest `keep_last` committed ones (manifest first, so a
//      crash mid-delete leaves an incomplete directory that loading skips); no directory fsync
//      here — a deletion a crash undoes is redone by the next prune.
//
// LoadLatestValid() tries LATEST's step, then older step directories newest first; each candidate
// is verified (manifest decodes and validates, every shard file has the manifest's size and
// CRC32C) and a bad one is skipped with a warning naming the file and what was wrong. The returned
// Checkpoint's ReadRange() reads any [begin, end) of the flat vector, whatever shard layout it was
// saved with, so a job saved by W writers restores into W' owners.
//
// Thread-compatible: one thread at a time (the CheckpointWriter's thread, or the caller).
//
// Example:
//   auto store = CheckpointStore::Open({.dir = "ckpt", .keep_last = 3});
//   CheckpointManifest meta{.gpt_config = config, .num_params = n, .step = 100, .seed = 1};
//   RETURN_IF_ERROR((*store)->Write(meta, {{0, n, params, m, v}}));
//   absl::StatusOr<Checkpoint> ckpt = (*store)->LoadLatestValid();
//   RETURN_IF_ERROR(ckpt->ReadRange(my_begin, my_end, my_params, my_m, my_v));
#ifndef TROUPE_TRAIN_CHECKPOINT_STORE_H_
#define TROUPE_TRAIN_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "troupe/train/file_system.h"
#include "troupe/train/manifest.h"

namespace troupe::train {

// Elements [begin, end) of the flat vector; each pointer points at element `begin` (range-local
// storage). adam_m and adam_v are null for a checkpoint without optimizer moments; outer_global
// and outer_momentum for one without the low-communication mode's outer state.
struct ShardView {
  int64_t begin = 0;
  int64_t end = 0;
  const float* params = nullptr;
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
  const float* outer_global = nullptr;
  const float* outer_momentum = nullptr;
};

struct CheckpointStoreOptions {
  std::string dir = "ckpt";
  int keep_last = 3;                                // committed checkpoints kept, >= 1
  FileSystem* fs = nullptr;                         // PosixFileSystem() when null
  std::function<void(const std::string&)> warning;  // one line each; stderr when empty
};

// A checkpoint whose manifest and files were verified when it was loaded.
class Checkpoint {
 public:
  const CheckpointManifest& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.step; }
  const std::string& dir() const { return dir_; }

  // Copies elements [begin, end) into range-local buffers (params[0] is element begin). adam_m
  // and adam_v may be null; if set, the checkpoint must hold moments (else FailedPrecondition).
  // Files are read, not re-checksummed: they were verified at load time.
  [[nodiscard]] absl::Status ReadRange(int64_t begin, int64_t end, float* params, float* adam_m,
                                       float* adam_v) const;
  // The same for the outer state (FailedPrecondition unless the checkpoint holds it).
  [[nodiscard]] absl::Status ReadOuterRange(int64_t begin, int64_t end, float* global,
                                            float* momentum) const;

 private:
  friend class CheckpointStore;
  Checkpoint(FileSystem* fs, std::string dir, CheckpointManifest manifest)
      : fs_(fs), dir_(std::move(dir)), manifest_(std::move(manifest)) {}
  // Reads [begin, end) of each section of the shard files into outs[k] where set (the sections
  // in file order: params, m, v, θ_global, outer momentum — those the manifest holds).
  [[nodiscard]] absl::Status ReadSections(int64_t begin, int64_t end,
                                          const std::vector<float*>& outs) const;
  FileSystem* fs_;
  std::string dir_;
  CheckpointManifest manifest_;
};

class CheckpointStore {
 public:
  // Creates options.dir if needed. InvalidArgument for keep_last < 1.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      CheckpointStoreOptions options);

  // Writes checkpoint meta.step from shards (in range order, covering [0, meta.num_params)) and
  // commits it; meta's shards field is ignored (filled in from what was written). AlreadyExists
  // if that step is already committed (at or before LATEST); a directory left by a crash — partial,
  // or complete but never published through LATEST — is cleared and written afresh.
  [[nodiscard]] absl::Status Write(const CheckpointManifest& meta,
                                   absl::Span<const ShardView> shards);

  // The two halves of Write, for writers that each hold one shard: WriteShard writes
  // step-<step>/shard-<index>.bin durably (not yet visible); Commit writes the manifest (with
  // every shard's info, in range order), publishes it through LATEST and prunes old ones.
  [[nodiscard]] absl::StatusOr<ShardFileInfo> WriteShard(int64_t step, int index,
                                                         const ShardView& shard);
  [[nodiscard]] absl::Status Commit(const CheckpointManifest& manifest);

  // Fencing (the coordinator's lease: lease_atom in troupe/runtime/cluster.h). FENCE in the
  // directory holds the highest epoch that has claimed the store. Claim(epoch) makes this handle
  // write under `epoch`: FailedPrecondition if a higher one has claimed the store, else FENCE is
  // raised to `epoch` (atomically, durably). From then on WriteShard and Commit re-read FENCE and
  // refuse (FailedPrecondition naming both epochs, nothing written) once a later epoch has claimed
  // the store: a coordinator cut off from the head, or one of its ranks, cannot name a checkpoint
  // in LATEST, or overwrite a shard, after another incarnation took over. Unclaimed handles do not
  // check (a store used without a cluster).
  [[nodiscard]] absl::Status Claim(uint64_t epoch);

  // The newest checkpoint that verifies, at or before LATEST; NotFound if there is none.
  [[nodiscard]] absl::StatusOr<Checkpoint> LoadLatestValid();
  // Verifies and returns checkpoint `step` (DataLoss naming the file if it is corrupt/partial).
  [[nodiscard]] absl::StatusOr<Checkpoint> Load(int64_t step);
  // Steps of the step-<n> directories present (complete or not), ascending.
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> ListSteps();

  std::string StepDir(int64_t step) const;
  const std::string& dir() const { return options_.dir; }

 private:
  explicit CheckpointStore(CheckpointStoreOptions options);
  void Warn(const std::string& line) const;
  int64_t ReadLatestStep();              // -1 when LATEST is missing or unreadable
  absl::StatusOr<uint64_t> ReadFence();  // 0 when FENCE is missing
  // OK unless this handle has claimed the store and a later epoch has claimed it since.
  [[nodiscard]] absl::Status CheckFence(const std::string& what);
  [[nodiscard]] absl::Status Prune(int64_t latest_step);
  [[nodiscard]] absl::Status DeleteStepDir(int64_t step);

  CheckpointStoreOptions options_;
  FileSystem* fs_;
  uint64_t epoch_ = 0;  // claimed; 0: none
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_CHECKPOINT_STORE_H_
