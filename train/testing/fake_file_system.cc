#include "troupe/train/fake_file_system.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

namespace troupe::train {

class FakeWritableFile : public WritableFile {
 public:
  FakeWritableFile(FakeFileSystem* fs, std::string path,
                   std::shared_ptr<FakeFileSystem::Inode> inode)
      : fs_(fs), path_(std::move(path)), inode_(std::move(inode)) {}

  absl::Status Append(const void* data, size_t size) override {
    absl::MutexLock lock(&fs_->mu_);
    TROUPE_RETURN_IF_ERROR(fs_->Tick(absl::StrCat("Append ", path_)));
    inode_->data.append(static_cast<const char*>(data), size);
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    absl::MutexLock lock(&fs_->mu_);
    TROUPE_RETURN_IF_ERROR(fs_->Tick(absl::StrCat("Sync ", path_)));
    inode_->synced = inode_->data;
    return absl::OkStatus();
  }
  absl::Status Close() override {
    absl::MutexLock lock(&fs_->mu_);
    return fs_->Tick(absl::StrCat("Close ", path_));
  }

 private:
  FakeFileSystem* fs_;
  std::string path_;
  std::shared_ptr<FakeFileSystem::Inode> inode_;
};

namespace {

class FakeReadableFile : public ReadableFile {
 public:
  explicit FakeReadableFile(std::string data) : data_(std::move(data)) {}
  uint64_t size() const override { return data_.size(); }
  absl::Status ReadAt(uint64_t offset, size_t size, void* out) const override {
    if (offset > data_.size() || size > data_.size() - offset) {
      return absl::OutOfRangeError("read past the end of a fake file");
    }
    std::memcpy(out, data_.data() + offset, size);
    return absl::OkStatus();
  }

 private:
  std::string data_;
};

}  // namespace

void FakeFileSystem::InjectAt(int64_t n, Fault fault) {
  absl::MutexLock lock(&mu_);
  fault_at_ = n;
  fault_ = fault;
}

void FakeFileSystem::Reboot(bool lose_unsynced) {
  absl::MutexLock lock(&mu_);
  if (lose_unsynced) {
    // Keep durable entries whose every ancestor directory survived; files keep synced bytes.
    std::map<std::string, Entry> next;
    for (const auto& [path, entry] : durable_) {
      bool reachable = true;
      for (std::string p = Parent(path); !p.empty(); p = Parent(p)) {
        auto it = durable_.find(p);
        if (it == durable_.end() || !it->second.is_dir) {
          reachable = false;
          break;
        }
      }
      if (reachable) next.emplace(path, entry);
    }
    for (auto& [path, entry] : next) {
      if (entry.inode) entry.inode->data = entry.inode->synced;
    }
    live_ = next;
    durable_ = std::move(next);
  }
  crashed_ = false;
  fault_at_ = 0;
  calls_ = 0;
  log_.clear();
}

int64_t FakeFileSystem::mutating_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

std::vector<std::string> FakeFileSystem::call_log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

bool FakeFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::Status FakeFileSystem::Tick(const std::string& what) {
  if (crashed_) return absl::AbortedError(absl::StrCat("fake fs crashed; refused: ", what));
  ++calls_;
  log_.push_back(what);
  if (calls_ != fault_at_) return absl::OkStatus();
  if (fault_ == Fault::kFail) {
    return absl::InternalError(absl::StrCat("injected failure at call ", calls_, ": ", what));
  }
  crashed_ = true;
  return absl::AbortedError(absl::StrCat("injected crash at call ", calls_, ": ", what));
}

std::string FakeFileSystem::Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

bool FakeFileSystem::IsDir(const std::string& path) const {
  auto it = live_.find(path);
  return it != live_.end() && it->second.is_dir;
}

void FakeFileSystem::SetEntry(const std::string& path, const Entry* entry) {
  if (entry) {
    live_[path] = *entry;
  } else {
    live_.erase(path);
  }
  if (Parent(path).empty()) {  // top-level: a mount point, always durable
    if (entry) {
      durable_[path] = *entry;
    } else {
      durable_.erase(path);
    }
  }
}

absl::Status FakeFileSystem::FlipByte(const std::string& path, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(path);
  if (it == live_.end() || !it->second.inode || offset >= it->second.inode->data.size()) {
    return absl::NotFoundError(absl::StrCat("FlipByte: no byte ", offset, " in ", path));
  }
  it->second.inode->data[offset] ^= 0x5a;
  it->second.inode->synced = it->second.inode->data;
  return absl::OkStatus();
}

absl::Status FakeFileSystem::Truncate(const std::string& path, uint64_t size) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(path);
  if (it == live_.end() || !it->second.inode) return absl::NotFoundError(path);
  it->second.inode->data.resize(size);
  it->second.inode->synced = it->second.inode->data;
  return absl::OkStatus();
}

absl::Status FakeFileSystem::PutFile(const std::string& path, const std::string& bytes) {
  absl::MutexLock lock(&mu_);
  Entry entry{false, std::make_shared<Inode>(Inode{bytes, bytes})};
  live_[path] = entry;
  durable_[path] = entry;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> FakeFileSystem::NewWritableFile(
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  TROUPE_RETURN_IF_ERROR(Tick(absl::StrCat("NewWritableFile ", path)));
  if (!IsDir(Parent(path))) return absl::NotFoundError(absl::StrCat("no directory for ", path));
  if (IsDir(path)) return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
  Entry entry{false, std::make_shared<Inode>()};
  SetEntry(path, &entry);
  return std::unique_ptr<WritableFile>(new FakeWritableFile(this, path, entry.inode));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> FakeFileSystem::OpenForRead(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (crashed_) return absl::AbortedError("fake fs crashed");
  auto it = live_.find(path);
  if (it == live_.end() || !it->second.inode) return absl::NotFoundError(path);
  return std::unique_ptr<ReadableFile>(new FakeReadableFile(it->second.inode->data));
}

absl::Status FakeFileSystem::Rename(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  TROUPE_RETURN_IF_ERROR(Tick(absl::StrCat("Rename ", from, " -> ", to)));
  auto it = live_.find(from);
  if (it == live_.end()) return absl::NotFoundError(absl::StrCat("rename ", from));
  if (it->second.is_dir) return absl::UnimplementedError("fake fs renames files only");
  if (!IsDir(Parent(to))) return absl::NotFoundError(absl::StrCat("no directory for ", to));
  Entry entry = it->second;
  SetEntry(from, nullptr);
  SetEntry(to, &entry);
  return absl::OkStatus();
}

absl::Status FakeFileSystem::SyncDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  TROUPE_RETURN_IF_ERROR(Tick(absl::StrCat("SyncDir ", dir)));
  if (!IsDir(dir)) return absl::NotFoundError(absl::StrCat("SyncDir ", dir));
  for (auto it = durable_.begin(); it != durable_.end();) {
    if (Parent(it->first) == dir && live_.count(it->first) == 0) {
      it = durable_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [path, entry] : live_) {
    if (Parent(path) == dir) durable_[path] = entry;
  }
  return absl::OkStatus();
}

absl::Status FakeFileSystem::CreateDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  TROUPE_RETURN_IF_ERROR(Tick(absl::StrCat("CreateDir ", dir)));
  if (IsDir(dir)) return absl::OkStatus();
  if (live_.count(dir)) return absl::AlreadyExistsError(absl::StrCat(dir, " is a file"));
  const std::string parent = Parent(dir);
  if (!parent.empty() && !IsDir(parent)) {
    return absl::NotFoundError(absl::StrCat("no directory for ", dir));
  }
  Entry entry{true, nullptr};
  SetEntry(dir, &entry);
  return absl::OkStatus();
}

absl::Status FakeFileSystem::DeleteFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  TROUPE_RETURN_IF_ERROR(Tick(absl::StrCat("DeleteFile ", path)));
  auto it = live_.find(path);
  if (it == live_.end() || it->second.is_dir) return absl::NotFoundError(path);
  SetEntry(path, nullptr);
  return absl::OkStatus();
}

absl::Status FakeFileSystem::DeleteDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  TROUPE_RETURN_IF_ERROR(Tick(absl::StrCat("DeleteDir ", dir)));
  if (!IsDir(dir)) return absl::NotFoundError(dir);
  for (const auto& [path, entry] : live_) {
    if (Parent(path) == dir) return absl::FailedPreconditionError(dir + " is not empty");
  }
  SetEntry(dir, nullptr);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FakeFileSystem::ListDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (crashed_) return absl::AbortedError("fake fs crashed");
  if (!IsDir(dir)) return absl::NotFoundError(dir);
  std::vector<std::string> names;
  for (const auto& [path, entry] : live_) {
    if (Parent(path) == dir) names.push_back(path.substr(dir.size() + 1));
  }
  return names;
}

bool FakeFileSystem::FileExists(const std::string& path) {
  absl::MutexLock lock(&mu_);
  return live_.count(path) > 0;
}

}  // namespace troupe::train
