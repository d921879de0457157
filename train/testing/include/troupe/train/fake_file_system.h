// An in-memory FileSystem for tests: it models crash durability and fails or crashes on cue.
//
// Durability model (what a power cut keeps): a file's bytes survive only up to its last Sync();
// a directory entry (create, rename, delete) survives only after SyncDir() of its parent. Paths
// without a '/' are top-level directories, treated as mount points: they always survive.
//
// Faults: every mutating call (NewWritableFile, Append, Sync, Close, Rename, SyncDir, CreateDir,
// DeleteFile, DeleteDir) is numbered from 1 in call order. InjectAt(n, kFail) makes call n return
// an Internal error and then carries on normally; InjectAt(n, kCrash) "kills the process" at call
// n: that call and every later one return Aborted until Reboot(), which restores the state a
// machine would see after restarting — with lose_unsynced, only durable state (a power cut);
// without, everything done before the crash (a killed process on a live kernel).
//
// Example:
//   FakeFileSystem fs;
//   fs.InjectAt(7, FakeFileSystem::Fault::kCrash);
//   (void)store.Write(...);          // fails with Aborted at the 7th mutating call
//   fs.Reboot(/*lose_unsynced=*/true);
//   // a fresh CheckpointStore over &fs now sees what survived
#ifndef TROUPE_TRAIN_FAKE_FILE_SYSTEM_H_
#define TROUPE_TRAIN_FAKE_FILE_SYSTEM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "troupe/train/file_system.h"

namespace troupe::train {

class FakeFileSystem : public FileSystem {
 public:
  enum class Fault { kFail, kCrash };

  FakeFileSystem() = default;

  // Arms a fault at mutating call number n (1-based, counted since construction or Reboot()).
  void InjectAt(int64_t n, Fault fault);
  void Reboot(bool lose_unsynced);
  // Mutating calls so far, and their log ("Rename a -> b"), for naming a crash point in messages.
  int64_t mutating_calls() const;
  std::vector<std::string> call_log() const;
  bool crashed() const;

  // Test helpers that bypass faults and durability: corrupt or inspect stored bytes.
  [[nodiscard]] absl::Status FlipByte(const std::string& path, uint64_t offset);
  [[nodiscard]] absl::Status Truncate(const std::string& path, uint64_t size);
  [[nodiscard]] absl::Status PutFile(const std::string& path,
                                     const std::string& bytes);  // durable at once

  [[nodiscard]] absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(
      const std::string& path) override;
  [[nodiscard]] absl::Status Rename(const std::string& from, const std::string& to) override;
  [[nodiscard]] absl::Status SyncDir(const std::string& dir) override;
  [[nodiscard]] absl::Status CreateDir(const std::string& dir) override;
  [[nodiscard]] absl::Status DeleteFile(const std::string& path) override;
  [[nodiscard]] absl::Status DeleteDir(const std::string& dir) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  bool FileExists(const std::string& path) override;

 private:
  friend class FakeWritableFile;
  struct Inode {
    std::string data;
    std::string synced;
  };
  struct Entry {
    bool is_dir = false;
    std::shared_ptr<Inode> inode;  // files only
  };

  // Counts a mutating call; returns the injected error, if any. Caller holds mu_.
  [[nodiscard]] absl::Status Tick(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::string Parent(const std::string& path);
  bool IsDir(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetEntry(const std::string& path, const Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> live_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Entry> durable_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fault_at_ ABSL_GUARDED_BY(mu_) = 0;
  Fault fault_ ABSL_GUARDED_BY(mu_) = Fault::kFail;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_FAKE_FILE_SYSTEM_H_
