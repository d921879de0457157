// ChaosFileSystem under a real CheckpointStore on a real directory: a fault acts only on the
// checkpoints of its window, the way a real disk fails (ENOSPC half-way, EIO on fsync, slowness),
// leaves no partial file behind, and the mid-checkpoint hook runs with half a shard written.
#include "troupe/train/chaos_file_system.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "troupe/train/checkpoint_store.h"

namespace troupe::train {
namespace {

class ChaosFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/troupe_chaos_fs_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    params_.assign(1000, 0.5f);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes shard 0 of checkpoint `step` through a store on `fs`.
  absl::Status Write(FileSystem* fs, int64_t step) {
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
        CheckpointStore::Open({.dir = dir_, .keep_last = 3, .fs = fs, .warning = {}});
    if (!store.ok()) return store.status();
    ShardView v{0, static_cast<int64_t>(params_.size()), params_.data(), nullptr, nullptr};
    return (*store)->WriteShard(step, 0, v).status();
  }
  int TmpFiles() {
    int n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      n += e.path().extension() == ".tmp";
    }
    return n;
  }

  std::string dir_;
  std::vector<float> params_;
};

TEST_F(ChaosFileSystemTest, ReadsTheCheckpointStepFromThePath) {
  EXPECT_EQ(CheckpointStepOf("/w/ckpt", "/w/ckpt/step-20/shard-00001.bin.tmp"), 20);
  EXPECT_EQ(CheckpointStepOf("/w/step-3/ckpt", "/w/step-3/ckpt/step-40/manifest.bin"), 40);
  // The root's own files, even under a directory that looks like a step's.
  EXPECT_EQ(CheckpointStepOf("/w/step-3/ckpt", "/w/step-3/ckpt/LATEST.tmp"), std::nullopt);
  EXPECT_EQ(CheckpointStepOf("/w/step-3/ckpt", "/w/step-3/ckpt"), std::nullopt);
  EXPECT_EQ(CheckpointStepOf("/w/ckpt", "/w/ckpt/step-x/a"), std::nullopt);
}

TEST_F(ChaosFileSystemTest, AFullDiskFailsItsWindowsWritesHalfWayAndLeavesNoPartialFile) {
  JobSpec spec;
  spec.checkpoint_every = 5;
  spec.faults = {*ParseFault("disk-full@10:6")};  // the checkpoints of steps 10..15
  ChaosFileSystem fs(PosixFileSystem(), dir_, DiskFaultsOf(spec));
  absl::Status s = Write(&fs, 15);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("No space left on device (chaos: disk-full@10:6)"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(TmpFiles(), 0);
  EXPECT_TRUE(Write(&fs, 9).ok());
  EXPECT_TRUE(Write(&fs, 16).ok());
}

TEST_F(ChaosFileSystemTest, AFailingDiskFailsFsyncWithEioAndASlowOneWaits) {
  JobSpec spec;
  spec.checkpoint_every = 5;
  spec.disk_delay = absl::Milliseconds(30);
  spec.faults = {*ParseFault("disk-fail@5"), *ParseFault("disk-slow@20:1")};  // 5..9; 20
  ChaosFileSystem fs(PosixFileSystem(), dir_, DiskFaultsOf(spec));
  absl::Status s = Write(&fs, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("Input/output error (chaos: disk-fail@5)"), absl::string_view::npos)
      << s;
  EXPECT_EQ(TmpFiles(), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(Write(&fs, 20).ok());
  // One Append and one Sync, each waiting.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(60));
}

TEST_F(ChaosFileSystemTest, TheShardHookRunsWithHalfTheFirstWriteOnDisk) {
  std::vector<std::pair<int64_t, uintmax_t>> seen;
  ChaosFileSystem fs(PosixFileSystem(), dir_, {}, [&](int64_t step) {
    seen.emplace_back(step, std::filesystem::file_size(dir_ + "/step-10/shard-00000.bin.tmp"));
  });
  ASSERT_TRUE(Write(&fs, 10).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, 10);
  EXPECT_EQ(seen[0].second, params_.size() * sizeof(float) / 2);
}

}  // namespace
}  // namespace troupe::train
