// The file-system seam under the checkpoint store: the few operations an atomic, durable write
// needs (create, append, fsync, rename, directory fsync) and the reads a restore needs.
//
// PosixFileSystem() is the real one. FakeFileSystem (train/testing/, test support that is not
// installed) keeps everything in memory, models what survives a crash (only fsynced data and
// directory entries made durable by a directory fsync) and can fail or "crash" at a chosen
// operation, so tests drive failures deterministically. Paths are plain strings joined with '/'.
//
// Example:
//   FileSystem* fs = PosixFileSystem();
//   absl::StatusOr<std::unique_ptr<WritableFile>> f = fs->NewWritableFile("ckpt/x.tmp");
//   RETURN_IF_ERROR((*f)->Append(data, size));
//   RETURN_IF_ERROR((*f)->Sync());
//   RETURN_IF_ERROR((*f)->Close());
//   RETURN_IF_ERROR(fs->Rename("ckpt/x.tmp", "ckpt/x"));
//   RETURN_IF_ERROR(fs->SyncDir("ckpt"));
#ifndef TROUPE_TRAIN_FILE_SYSTEM_H_
#define TROUPE_TRAIN_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::train {

// A file being written from its start. Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  [[nodiscard]] virtual absl::Status Append(const void* data, size_t size) = 0;
  [[nodiscard]] virtual absl::Status Sync() = 0;  // fsync: the data written so far survives a crash
  [[nodiscard]] virtual absl::Status Close() = 0;
};

// A file opened for positional reads. Thread-compatible (ReadAt is const).
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly size bytes at offset; OutOfRange if the file is shorter.
  [[nodiscard]] virtual absl::Status ReadAt(uint64_t offset, size_t size, void* out) const = 0;
};

// Implementations are thread-safe.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates (or truncates) path for writing.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(
      const std::string& path) = 0;
  // Atomically replaces `to` with `from` (POSIX rename).
  [[nodiscard]] virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // fsync of a directory: the entries created, renamed or removed in it survive a crash.
  [[nodiscard]] virtual absl::Status SyncDir(const std::string& dir) = 0;
  // mkdir; OK if the directory exists.
  [[nodiscard]] virtual absl::Status CreateDir(const std::string& dir) = 0;
  [[nodiscard]] virtual absl::Status DeleteFile(const std::string& path) = 0;
  [[nodiscard]] virtual absl::Status DeleteDir(const std::string& dir) = 0;  // must be empty
  // Names in dir (no "." or ".."), unsorted. NotFound if dir does not exist.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
};

// The process-wide POSIX implementation (open/write/fsync/rename/pread). Never null.
FileSystem* PosixFileSystem();

// Reads a whole file of at most max_bytes; FailedPrecondition naming the file if it is larger.
[[nodiscard]] absl::StatusOr<std::string> ReadSmallFile(FileSystem* fs, const std::string& path,
                                                        uint64_t max_bytes);

// Writes bytes to path + ".tmp", fsyncs, closes and renames it over path (no directory fsync).
[[nodiscard]] absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                               const std::string& bytes);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_FILE_SYSTEM_H_
