#include "troupe/train/checkpoint_writer.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "checkpoint_test_util.h"
#include "gtest/gtest.h"
#include "troupe/train/fake_file_system.h"

namespace troupe::train {
namespace {

using testing::BitEqual;
using testing::MakeState;
using testing::Meta;
using testing::SplitEven;
using testing::State;

constexpr int64_t kN = 500;

// Holds the first write's first file creation until released (optionally failing it), so a test
// knows exactly what is in flight without sleeping.
class GatedFileSystem : public testing::HookedFileSystem {
 public:
  explicit GatedFileSystem(FileSystem* base) : HookedFileSystem(base) {}
  absl::Status Before(const std::string& op) override {
    // Write's helper threads may create files at once: exactly one is held.
    if (op.rfind("NewWritableFile", 0) != 0 || gated_.exchange(true)) return absl::OkStatus();
    entered.Notify();
    release.WaitForNotification();
    return fail_gated ? absl::InternalError("disk on fire") : absl::OkStatus();
  }
  absl::Notification entered, release;
  bool fail_gated = false;

 private:
  std::atomic<bool> gated_{false};
};

std::unique_ptr<CheckpointStore> OpenStore(FileSystem* fs, int keep_last = 10) {
  CheckpointStoreOptions options;
  options.dir = "ckpt";
  options.keep_last = keep_last;
  options.fs = fs;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

State ReadAll(CheckpointStore& store, int64_t step) {
  absl::StatusOr<Checkpoint> ckpt = store.Load(step);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  State s{std::vector<float>(kN), std::vector<float>(kN), std::vector<float>(kN)};
  if (ckpt.ok()) {
    EXPECT_TRUE(ckpt->ReadRange(0, kN, s.params.data(), s.m.data(), s.v.data()).ok());
  }
  return s;
}

TEST(CheckpointWriterTest, WritesEverySnapshotAsItWasAtSubmit) {
  FakeFileSystem fs;
  auto store = OpenStore(&fs);
  CheckpointWriter writer(store.get());
  State live = MakeState(kN, 0);
  std::vector<State> expected;
  for (int64_t step = 1; step <= 5; ++step) {
    live = MakeState(kN, static_cast<uint32_t>(step));
    expected.push_back(live);
    ASSERT_TRUE(writer.Submit(Meta(kN, step, 2), SplitEven(live, 2)).ok());
    writer.WaitForSnapshot();
    // Training goes on and overwrites its buffers at once: the snapshot must not change.
    std::fill(live.params.begin(), live.params.end(), -1.0f);
    std::fill(live.v.begin(), live.v.end(), -2.0f);
  }
  ASSERT_TRUE(writer.Flush().ok());
  const CheckpointWriterStats stats = writer.stats();
  EXPECT_EQ(stats.submitted, 5);
  EXPECT_EQ(stats.written, 5);
  EXPECT_EQ(stats.superseded, 0);
  EXPECT_EQ(stats.last_written_step, 5);
  for (int64_t step = 1; step <= 5; ++step) {
    const State got = ReadAll(*store, step);
    EXPECT_TRUE(BitEqual(got.params, expected[step - 1].params)) << step;
    EXPECT_TRUE(BitEqual(got.m, expected[step - 1].m)) << step;
    EXPECT_TRUE(BitEqual(got.v, expected[step - 1].v)) << step;
  }
  absl::StatusOr<Checkpoint> latest = store->LoadLatestValid();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step(), 5);
}

TEST(CheckpointWriterTest, SupersedeReplacesTheQueuedSnapshot) {
  FakeFileSystem fake;
  GatedFileSystem fs(&fake);
  auto store = OpenStore(&fs);
  CheckpointWriterOptions options;
  options.when_busy = CheckpointWriterOptions::WhenBusy::kSupersede;
  CheckpointWriter writer(store.get(), options);
  const State a = MakeState(kN, 1), b = MakeState(kN, 2), c = MakeState(kN, 3);
  ASSERT_TRUE(writer.Submit(Meta(kN, 1), SplitEven(a, 1)).ok());
  fs.entered.WaitForNotification();                               // step 1 is being written
  ASSERT_TRUE(writer.Submit(Meta(kN, 2), SplitEven(b, 1)).ok());  // queued
  ASSERT_TRUE(writer.Submit(Meta(kN, 3), SplitEven(c, 1)).ok());  // replaces step 2
  fs.release.Notify();
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(writer.stats().superseded, 1);
  EXPECT_EQ(writer.stats().written, 2);
  EXPECT_EQ(*store->ListSteps(), (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(BitEqual(ReadAll(*store, 3).params, c.params));
}

TEST(CheckpointWriterTest, WaitWritesEverySnapshotWhenTheDiskIsSlow) {
  FakeFileSystem fake;
  GatedFileSystem fs(&fake);
  auto store = OpenStore(&fs);
  CheckpointWriter writer(store.get());  // kWait
  const State a = MakeState(kN, 1), b = MakeState(kN, 2), c = MakeState(kN, 3);
  ASSERT_TRUE(writer.Submit(Meta(kN, 1), SplitEven(a, 1)).ok());
  fs.entered.WaitForNotification();
  ASSERT_TRUE(writer.Submit(Meta(kN, 2), SplitEven(b, 1)).ok());
  absl::Status third;
  std::thread trainer([&] { third = writer.Submit(Meta(kN, 3), SplitEven(c, 1)); });
  fs.release.Notify();  // the third Submit can only return once step 2 has started
  trainer.join();
  ASSERT_TRUE(third.ok()) << third;
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(writer.stats().written, 3);
  EXPECT_EQ(writer.stats().superseded, 0);
  EXPECT_EQ(*store->ListSteps(), (std::vector<int64_t>{1, 2, 3}));
}

TEST(CheckpointWriterTest, BackgroundErrorSurfacesOnTheNextSubmit) {
  FakeFileSystem fake;
  GatedFileSystem fs(&fake);
  fs.fail_gated = true;
  auto store = OpenStore(&fs);
  CheckpointWriter writer(store.get());  // kWait
  const State a = MakeState(kN, 1), b = MakeState(kN, 2), c = MakeState(kN, 3);
  ASSERT_TRUE(writer.Submit(Meta(kN, 1), SplitEven(a, 1)).ok());
  fs.entered.WaitForNotification();
  ASSERT_TRUE(writer.Submit(Meta(kN, 2), SplitEven(b, 1)).ok());  // queued behind the failure
  fs.release.Notify();
  // Waits until step 2 has started, by which time step 1 has failed: its error comes back here,
  // and step 3 is not taken.
  absl::Status s = writer.Submit(Meta(kN, 3), SplitEven(c, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("disk on fire"), std::string::npos);
  ASSERT_TRUE(writer.Flush().ok());  // step 2 was fine
  EXPECT_EQ(writer.stats().failed, 1);
  EXPECT_EQ(writer.stats().written, 1);
  EXPECT_EQ(writer.stats().submitted, 2);
  absl::StatusOr<Checkpoint> latest = store->LoadLatestValid();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step(), 2);
}

TEST(CheckpointWriterTest, FlushReturnsTheErrorOnceAndDestructorDrains) {
  FakeFileSystem fs;
  auto store = OpenStore(&fs);
  const State a = MakeState(kN, 1);
  {
    CheckpointWriter writer(store.get());
    fs.InjectAt(fs.mutating_calls() + 2, FakeFileSystem::Fault::kFail);
    ASSERT_TRUE(writer.Submit(Meta(kN, 1), SplitEven(a, 1)).ok());
    EXPECT_EQ(writer.Flush().code(), absl::StatusCode::kInternal);
    EXPECT_TRUE(writer.Flush().ok());
    ASSERT_TRUE(writer.Submit(Meta(kN, 2), SplitEven(a, 1)).ok());
  }  // the destructor finishes step 2
  absl::StatusOr<Checkpoint> latest = store->LoadLatestValid();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step(), 2);
}

}  // namespace
}  // namespace troupe::train
