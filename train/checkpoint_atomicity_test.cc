// A crash or an I/O error at every file-system operation of a checkpoint write, in turn: LATEST
// must always name a complete checkpoint, and LoadLatestValid must return it bit for bit.
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "gtest/gtest.h"
#include "troupe/train/checkpoint_store.h"
#include "troupe/train/fake_file_system.h"

namespace troupe::train {
namespace {

using testing::BitEqual;
using testing::MakeState;
using testing::Meta;
using testing::SplitEven;
using testing::State;

constexpr int64_t kN = 333;

std::unique_ptr<CheckpointStore> OpenStore(FakeFileSystem* fs, std::vector<std::string>* warnings) {
  CheckpointStoreOptions options;
  options.dir = "ckpt";
  options.keep_last = 1;  // step 2's commit prunes step 1: crashes hit the deletes too
  options.fs = fs;
  options.warning = [warnings](const std::string& w) { warnings->push_back(w); };
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

bool Matches(const Checkpoint& ckpt, const State& state) {
  State got{std::vector<float>(kN), std::vector<float>(kN), std::vector<float>(kN)};
  if (!ckpt.ReadRange(0, kN, got.params.data(), got.m.data(), got.v.data()).ok()) return false;
  return BitEqual(got.params, state.params) && BitEqual(got.m, state.m) && BitEqual(got.v, state.v);
}

// Mutating calls one Write of step 2 (after step 1) makes, with pruning of step 1.
int64_t CallsPerWrite(const State& one, const State& two) {
  FakeFileSystem fs;
  std::vector<std::string> warnings;
  auto store = OpenStore(&fs, &warnings);
  EXPECT_TRUE(store->Write(Meta(kN, 1, 3), SplitEven(one, 3)).ok());
  fs.Reboot(/*lose_unsynced=*/false);  // resets the call counter
  EXPECT_TRUE(store->Write(Meta(kN, 2, 2), SplitEven(two, 2)).ok());
  return fs.mutating_calls();
}

struct Mode {
  const char* name;
  FakeFileSystem::Fault fault;
  bool lose_unsynced;
};

class CrashEveryOperationTest : public ::testing::TestWithParam<Mode> {};

TEST_P(CrashEveryOperationTest, LatestAlwaysNamesACompleteCheckpoint) {
  const Mode mode = GetParam();
  const State one = MakeState(kN, 1), two = MakeState(kN, 2), three = MakeState(kN, 3);
  const int64_t calls = CallsPerWrite(one, two);
  ASSERT_GT(calls, 20);  // 2 shards × 7, manifest 5, syncs, LATEST 4, prune
  int saw_old = 0, saw_new = 0;
  for (int64_t at = 1; at <= calls; ++at) {
    SCOPED_TRACE("fault at call " + std::to_string(at));
    FakeFileSystem fs;
    std::vector<std::string> warnings;
    auto store = OpenStore(&fs, &warnings);
    ASSERT_TRUE(store->Write(Meta(kN, 1, 3), SplitEven(one, 3)).ok());
    fs.Reboot(/*lose_unsynced=*/false);
    fs.InjectAt(at, mode.fault);
    const absl::Status write = store->Write(Meta(kN, 2, 2), SplitEven(two, 2));
    const std::string op =
        fs.call_log().size() >= static_cast<size_t>(at) ? fs.call_log()[at - 1] : std::string("?");
    SCOPED_TRACE("operation: " + op);
    if (mode.fault == FakeFileSystem::Fault::kCrash) {
      ASSERT_TRUE(fs.crashed());
      // A crash while pruning the old checkpoint only warns: the new one is already committed.
      ASSERT_TRUE(write.code() == absl::StatusCode::kAborted || write.ok()) << write;
      fs.Reboot(mode.lose_unsynced);
      store = OpenStore(&fs, &warnings);  // a new process
    }
    // LATEST names a checkpoint that verifies on its own.
    absl::StatusOr<std::string> latest = ReadSmallFile(&fs, "ckpt/LATEST", 64);
    ASSERT_TRUE(latest.ok()) << latest.status();
    const int64_t named = *latest == "step-2\n" ? 2 : 1;
    ASSERT_TRUE(*latest == "step-1\n" || *latest == "step-2\n") << *latest;
    absl::StatusOr<Checkpoint> direct = store->Load(named);
    ASSERT_TRUE(direct.ok()) << direct.status();
    absl::StatusOr<Checkpoint> ckpt = store->LoadLatestValid();
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ASSERT_EQ(ckpt->step(), named);
    EXPECT_TRUE(Matches(*ckpt, named == 2 ? two : one));
    if (write.ok()) {
      EXPECT_EQ(named, 2);
    }
    (named == 2 ? saw_new : saw_old)++;
    // The job goes on: the next checkpoint commits over whatever the crash left behind.
    const int64_t next = named == 2 ? 3 : 2;
    ASSERT_TRUE(store->Write(Meta(kN, next, 1), SplitEven(three, 1)).ok());
    absl::StatusOr<Checkpoint> after = store->LoadLatestValid();
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->step(), next);
    EXPECT_TRUE(Matches(*after, three));
  }
  // Both outcomes happen: crashes before the LATEST rename keep step 1, later ones keep step 2.
  EXPECT_GT(saw_old, 0);
  EXPECT_GT(saw_new, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CrashEveryOperationTest,
    ::testing::Values(Mode{"PowerCut", FakeFileSystem::Fault::kCrash, true},
                      Mode{"ProcessKill", FakeFileSystem::Fault::kCrash, false},
                      Mode{"IoError", FakeFileSystem::Fault::kFail, false}),
    [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace troupe::train
