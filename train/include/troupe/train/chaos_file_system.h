// chaos_file_system.h — the checkpoint disk's faults (disk-full, disk-fail, disk-slow) and the
// mid-checkpoint instant, injected under the checkpoint store: a FileSystem that passes every
// call to the real one, except that writes of a checkpoint the job's faults name go wrong.
//
// A fault covers the checkpoints of steps [from, to): whatever process writes a file of such a
// checkpoint (a rank its shard, the coordinator the manifest) meets it, on any host, with no
// message between them — the step is read from the path (<dir>/step-<n>/...). What goes wrong is
// what a real disk does:
//   full  every Append writes half of its bytes, then fails with ENOSPC (the store removes the
//         partial file; the checkpoint is dropped and training goes on);
//   fail  every Sync fails with EIO (the write-back failed: the data may not be on the disk);
//   slow  every Append and Sync first waits `delay`.
// The mid-checkpoint instant: `on_shard_write(step)` is called after the first half of the first
// Append of a shard file, so a rank can die in the middle of writing its shard.
//
//   ChaosFileSystem fs(PosixFileSystem(), dir, DiskFaultsOf(spec), [](int64_t step) { ... });
//   CheckpointStore::Open({.dir = dir, .fs = &fs});
//
// Thread-safe (the wrapped FileSystem must be).
#ifndef TROUPE_TRAIN_CHAOS_FILE_SYSTEM_H_
#define TROUPE_TRAIN_CHAOS_FILE_SYSTEM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "troupe/train/file_system.h"
#include "troupe/train/job_spec.h"

namespace troupe::train {

struct DiskFault {
  FaultKind kind = FaultKind::kDiskFull;  // disk-full, disk-fail or disk-slow
  int64_t from = 0;                       // the checkpoints of steps [from, to)
  int64_t to = 0;
  absl::Duration delay;  // disk-slow
  std::string name;      // "disk-full@20:10", in the errors it causes
};

// The spec's disk faults (a disk-*@S:N fault covers [S, S + N), N default checkpoint.every).
std::vector<DiskFault> DiskFaultsOf(const JobSpec& spec);

// The checkpoint step of a path in checkpoint directory `root` ("<root>/step-<n>/..."), if any.
std::optional<int64_t> CheckpointStepOf(const std::string& root, const std::string& path);

class ChaosFileSystem : public FileSystem {
 public:
  // `root`: the checkpoint directory (CheckpointStoreOptions::dir) whose step directories the
  // faults act on.
  ChaosFileSystem(FileSystem* base, std::string root, std::vector<DiskFault> faults,
                  std::function<void(int64_t step)> on_shard_write = {});

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    return base_->OpenForRead(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status CreateDir(const std::string& dir) override { return base_->CreateDir(dir); }
  absl::Status DeleteFile(const std::string& path) override { return base_->DeleteFile(path); }
  absl::Status DeleteDir(const std::string& dir) override { return base_->DeleteDir(dir); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }

 private:
  class File;
  // The fault that covers `path`'s checkpoint, if any.
  const DiskFault* FaultAt(const std::string& path) const;

  FileSystem* base_;
  std::string root_;
  std::vector<DiskFault> faults_;
  std::function<void(int64_t)> on_shard_write_;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_CHAOS_FILE_SYSTEM_H_
