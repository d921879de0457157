#include "troupe/train/chaos_file_system.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace troupe::train {

std::vector<DiskFault> DiskFaultsOf(const JobSpec& spec) {
  std::vector<DiskFault> out;
  for (const Fault& f : spec.faults) {
    if (!IsDiskFault(f.kind)) continue;
    const int64_t n = f.arg > 0 ? f.arg : std::max<int64_t>(1, spec.checkpoint_every);
    out.push_back({f.kind, f.step, f.step + n, spec.disk_delay, f.ToString()});
  }
  return out;
}

std::optional<int64_t> CheckpointStepOf(const std::string& root, const std::string& path) {
  const std::string prefix = root + "/step-";
  if (path.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const size_t at = prefix.size();
  const size_t end = path.find('/', at);
  int64_t step = 0;
  if (end == std::string::npos || !absl::SimpleAtoi(path.substr(at, end - at), &step)) {
    return std::nullopt;
  }
  return step;
}

class ChaosFileSystem::File : public WritableFile {
 public:
  File(std::unique_ptr<WritableFile> base, const DiskFault* fault, std::string path,
       std::function<void()> on_first_write)
      : base_(std::move(base)),
        fault_(fault),
        path_(std::move(path)),
        on_first_write_(std::move(on_first_write)) {}

  absl::Status Append(const void* data, size_t size) override {
    if (fault_ != nullptr && fault_->kind == FaultKind::kDiskSlow) {
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(fault_->delay));
    }
    const bool full = fault_ != nullptr && fault_->kind == FaultKind::kDiskFull;
    if (on_first_write_ || full) {
      const size_t half = size / 2;
      if (absl::Status s = base_->Append(data, half); !s.ok()) return s;
      if (on_first_write_) std::exchange(on_first_write_, nullptr)();
      if (full) {
        return absl::ResourceExhaustedError(
            absl::StrCat("write ", path_, ": ", strerror(ENOSPC), " (chaos: ", fault_->name, ")"));
      }
      return base_->Append(static_cast<const char*>(data) + half, size - half);
    }
    return base_->Append(data, size);
  }
  absl::Status Sync() override {
    if (fault_ != nullptr && fault_->kind == FaultKind::kDiskSlow) {
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(fault_->delay));
    }
    if (fault_ != nullptr && fault_->kind == FaultKind::kDiskFail) {
      return absl::DataLossError(
          absl::StrCat("fsync ", path_, ": ", strerror(EIO), " (chaos: ", fault_->name, ")"));
    }
    return base_->Sync();
  }
  absl::Status Close() override { return base_->Close(); }

 private:
  std::unique_ptr<WritableFile> base_;
  const DiskFault* fault_;
  std::string path_;
  std::function<void()> on_first_write_;
};

ChaosFileSystem::ChaosFileSystem(FileSystem* base, std::string root, std::vector<DiskFault> faults,
                                 std::function<void(int64_t step)> on_shard_write)
    : base_(base),
      root_(std::move(root)),
      faults_(std::move(faults)),
      on_shard_write_(std::move(on_shard_write)) {}

const DiskFault* ChaosFileSystem::FaultAt(const std::string& path) const {
  std::optional<int64_t> step = CheckpointStepOf(root_, path);
  if (!step) return nullptr;
  for (const DiskFault& f : faults_) {
    if (*step >= f.from && *step < f.to) return &f;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<WritableFile>> ChaosFileSystem::NewWritableFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = base_->NewWritableFile(path);
  if (!file.ok()) return file;
  std::function<void()> first;
  std::optional<int64_t> step = CheckpointStepOf(root_, path);
  const size_t slash = path.rfind('/');
  if (on_shard_write_ && step && absl::StartsWith(path.substr(slash + 1), "shard-")) {
    first = [this, s = *step] { on_shard_write_(s); };
  }
  return std::unique_ptr<WritableFile>(
      std::make_unique<File>(*std::move(file), FaultAt(path), path, std::move(first)));
}

absl::Status ChaosFileSystem::SyncDir(const std::string& dir) {
  const DiskFault* f = FaultAt(dir + "/");
  if (f != nullptr && f->kind == FaultKind::kDiskSlow) {
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(f->delay));
  }
  if (f != nullptr && f->kind == FaultKind::kDiskFail) {
    return absl::DataLossError(
        absl::StrCat("fsync ", dir, ": ", strerror(EIO), " (chaos: ", f->name, ")"));
  }
  return base_->SyncDir(dir);
}

}  // namespace troupe::train
