#include "checkpoint_test_util.h"

#include <cstring>
#include <limits>

#include "troupe/base/status_macros.h"

namespace troupe::train::testing {

State MakeState(int64_t n, uint32_t seed) {
  State s;
  s.params.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  uint32_t x = seed * 2654435761u + 12345u;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
  };
  for (int64_t i = 0; i < n; ++i) {
    s.params[i] = static_cast<float>(static_cast<int32_t>(next())) * 1e-9f;
    s.m[i] = static_cast<float>(next() % 100000) * 1.3e-7f;
    s.v[i] = static_cast<float>(next() % 1000) * 1.7e-11f;
  }
  if (n > 2) {
    s.params[1] = -0.0f;
    s.v[2] = std::numeric_limits<float>::denorm_min();
  }
  return s;
}

std::vector<ShardView> Split(const State& state, const std::vector<int64_t>& cuts) {
  std::vector<ShardView> views;
  int64_t begin = 0;
  std::vector<int64_t> ends = cuts;
  ends.push_back(static_cast<int64_t>(state.params.size()));
  for (int64_t end : ends) {
    views.push_back(ShardView{begin, end, state.params.data() + begin, state.m.data() + begin,
                              state.v.data() + begin});
    begin = end;
  }
  return views;
}

std::vector<ShardView> SplitEven(const State& state, int world_size) {
  const int64_t n = static_cast<int64_t>(state.params.size());
  std::vector<int64_t> cuts;
  for (int i = 1; i < world_size; ++i) cuts.push_back(n * i / world_size);
  return Split(state, cuts);
}

CheckpointManifest Meta(int64_t num_params, int64_t step, int32_t world_size) {
  CheckpointManifest meta;
  meta.num_params = num_params;
  meta.step = step;
  meta.seed = 7;
  meta.world_size = world_size;
  meta.generation = 3;
  meta.optimizer_step = step + 1;
  return meta;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace troupe::train::testing

namespace troupe::train::testing {
namespace {

class HookedWritableFile : public WritableFile {
 public:
  HookedWritableFile(HookedFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status Append(const void* data, size_t size) override {
    TROUPE_RETURN_IF_ERROR(fs_->Before("Append " + path_));
    return base_->Append(data, size);
  }
  absl::Status Sync() override {
    TROUPE_RETURN_IF_ERROR(fs_->Before("Sync " + path_));
    return base_->Sync();
  }
  absl::Status Close() override {
    TROUPE_RETURN_IF_ERROR(fs_->Before("Close " + path_));
    return base_->Close();
  }

 private:
  HookedFileSystem* fs_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WritableFile>> HookedFileSystem::NewWritableFile(
    const std::string& path) {
  TROUPE_RETURN_IF_ERROR(Before("NewWritableFile " + path));
  absl::StatusOr<std::unique_ptr<WritableFile>> f = base_->NewWritableFile(path);
  if (!f.ok()) return f.status();
  return std::unique_ptr<WritableFile>(new HookedWritableFile(this, path, *std::move(f)));
}
absl::Status HookedFileSystem::Rename(const std::string& from, const std::string& to) {
  TROUPE_RETURN_IF_ERROR(Before("Rename " + from + " -> " + to));
  return base_->Rename(from, to);
}
absl::Status HookedFileSystem::SyncDir(const std::string& dir) {
  TROUPE_RETURN_IF_ERROR(Before("SyncDir " + dir));
  return base_->SyncDir(dir);
}
absl::Status HookedFileSystem::CreateDir(const std::string& dir) {
  TROUPE_RETURN_IF_ERROR(Before("CreateDir " + dir));
  return base_->CreateDir(dir);
}
absl::Status HookedFileSystem::DeleteFile(const std::string& path) {
  TROUPE_RETURN_IF_ERROR(Before("DeleteFile " + path));
  return base_->DeleteFile(path);
}
absl::Status HookedFileSystem::DeleteDir(const std::string& dir) {
  TROUPE_RETURN_IF_ERROR(Before("DeleteDir " + dir));
  return base_->DeleteDir(dir);
}

}  // namespace troupe::train::testing
