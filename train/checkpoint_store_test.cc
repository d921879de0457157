#include "troupe/train/checkpoint_store.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "gtest/gtest.h"
#include "troupe/train/fake_file_system.h"

namespace troupe::train {
namespace {

using testing::BitEqual;
using testing::MakeState;
using testing::Meta;
using testing::Split;
using testing::SplitEven;
using testing::State;

constexpr int64_t kN = 1000;

struct Fixture {
  FakeFileSystem fs;
  std::vector<std::string> warnings;
  std::unique_ptr<CheckpointStore> store;

  explicit Fixture(int keep_last = 3) { Reopen(keep_last); }
  void Reopen(int keep_last = 3) {
    CheckpointStoreOptions options;
    options.dir = "ckpt";
    options.keep_last = keep_last;
    options.fs = &fs;
    options.warning = [this](const std::string& w) { warnings.push_back(w); };
    absl::StatusOr<std::unique_ptr<CheckpointStore>> s = CheckpointStore::Open(options);
    ASSERT_TRUE(s.ok()) << s.status();
    store = *std::move(s);
  }
  bool WarnedAbout(const std::string& a, const std::string& b) const {
    for (const std::string& w : warnings) {
      if (w.find(a) != std::string::npos && w.find(b) != std::string::npos) return true;
    }
    return false;
  }
};

// Restores the whole vector from ckpt through ranges of the given cuts (a layout of W' owners).
State Restore(const Checkpoint& ckpt, const std::vector<int64_t>& cuts) {
  const int64_t n = ckpt.manifest().num_params;
  State out{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  std::vector<int64_t> ends = cuts;
  ends.push_back(n);
  int64_t begin = 0;
  for (int64_t end : ends) {
    absl::Status s = ckpt.ReadRange(begin, end, out.params.data() + begin, out.m.data() + begin,
                                    out.v.data() + begin);
    EXPECT_TRUE(s.ok()) << s;
    begin = end;
  }
  return out;
}

bool SameState(const State& a, const State& b) {
  return BitEqual(a.params, b.params) && BitEqual(a.m, b.m) && BitEqual(a.v, b.v);
}

TEST(CheckpointStoreTest, RoundTripIsBitExactOnDisk) {
  char tmpl[] = "/tmp/troupe-ckpt-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/ckpt";
  CheckpointStoreOptions options;
  options.dir = dir;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const State state = MakeState(kN, 1);
  CheckpointManifest meta = Meta(kN, 12, 3);
  ASSERT_TRUE((*store)->Write(meta, SplitEven(state, 3)).ok());
  absl::StatusOr<Checkpoint> ckpt = (*store)->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step(), 12);
  EXPECT_EQ(ckpt->manifest().world_size, 3);
  EXPECT_EQ(ckpt->manifest().generation, 3);
  EXPECT_EQ(ckpt->manifest().seed, 7u);
  EXPECT_EQ(ckpt->manifest().optimizer_step, 13);
  EXPECT_EQ(ckpt->manifest().shards.size(), 3u);
  EXPECT_TRUE(SameState(Restore(*ckpt, {}), state));
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

TEST(CheckpointStoreTest, GptConfigAndParamsOnlyCheckpoint) {
  Fixture f;
  const model::GptConfig config = model::GptConfig::Tiny(32);
  const int64_t n = model::ParamLayout(config).total_size();
  const State state = MakeState(n, 2);
  CheckpointManifest meta = Meta(n, 5);
  meta.gpt_config = config;
  meta.has_moments = false;
  ASSERT_TRUE(f.store->Write(meta, {ShardView{0, n, state.params.data()}}).ok());
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->manifest().gpt_config, config);
  std::vector<float> params(n), m(n);
  ASSERT_TRUE(ckpt->ReadRange(0, n, params.data(), nullptr, nullptr).ok());
  EXPECT_TRUE(BitEqual(params, state.params));
  EXPECT_EQ(ckpt->ReadRange(0, n, params.data(), m.data(), m.data()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointStoreTest, RestoresIntoAnyLayout) {
  Fixture f;
  const State state = MakeState(kN, 3);
  ASSERT_TRUE(f.store->Write(Meta(kN, 1, 3), Split(state, {17, 600})).ok());
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok());
  for (int w = 1; w <= 7; ++w) {
    std::vector<int64_t> cuts;
    for (int i = 1; i < w; ++i) cuts.push_back(kN * i / w);
    EXPECT_TRUE(SameState(Restore(*ckpt, cuts), state)) << "W'=" << w;
  }
  EXPECT_TRUE(SameState(Restore(*ckpt, {1, 17, 18, 599, 600, 601, 999}), state));
  // A sub-range crossing both shard boundaries.
  std::vector<float> p(700), m(700), v(700);
  ASSERT_TRUE(ckpt->ReadRange(10, 710, p.data(), m.data(), v.data()).ok());
  EXPECT_TRUE(
      BitEqual(p, std::vector<float>(state.params.begin() + 10, state.params.begin() + 710)));
  EXPECT_TRUE(BitEqual(v, std::vector<float>(state.v.begin() + 10, state.v.begin() + 710)));
  EXPECT_EQ(ckpt->ReadRange(10, kN + 1, p.data(), nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ckpt->ReadRange(5, 5, p.data(), nullptr, nullptr).ok());
}

// [lowcomm]: θ_global and the outer momentum ride in the shard files after the moments, restore
// into any layout, leave params/m/v where they were, and a checkpoint without them says so.
TEST(CheckpointStoreTest, TheOuterStateRestoresIntoAnyLayoutBesideTheModel) {
  Fixture f;
  const State state = MakeState(kN, 5), outer = MakeState(kN, 6);
  std::vector<ShardView> shards = Split(state, {300, 301});
  for (ShardView& s : shards) {
    s.outer_global = outer.params.data() + s.begin;
    s.outer_momentum = outer.m.data() + s.begin;
  }
  CheckpointManifest meta = Meta(kN, 2, 3);
  EXPECT_EQ(f.store->Write(meta, shards).code(), absl::StatusCode::kInvalidArgument)
      << "shards with the outer state, a manifest without";
  meta.has_outer = true;
  ASSERT_TRUE(f.store->Write(meta, shards).ok());
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->manifest().has_outer);
  EXPECT_TRUE(SameState(Restore(*ckpt, {123, 777}), state));
  std::vector<float> global(kN), momentum(kN);
  for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 250}, {250, 301}, {301, kN}}) {
    ASSERT_TRUE(ckpt->ReadOuterRange(lo, hi, global.data() + lo, momentum.data() + lo).ok());
  }
  EXPECT_TRUE(BitEqual(global, outer.params));
  EXPECT_TRUE(BitEqual(momentum, outer.m));
  ASSERT_TRUE(f.store->Write(Meta(kN, 3, 1), Split(state, {})).ok());
  EXPECT_EQ(f.store->LoadLatestValid()->ReadOuterRange(0, kN, global.data(), nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  ShardView half = shards[0];
  half.outer_momentum = nullptr;
  EXPECT_EQ(f.store->WriteShard(4, 0, half).status().code(), absl::StatusCode::kInvalidArgument);
}

struct Damage {
  const char* name;
  const char* file;      // in step-2/
  const char* expected;  // in the warning
  void (*apply)(FakeFileSystem&, const std::string& path);
};

class DamagedNewestTest : public ::testing::TestWithParam<Damage> {};

TEST_P(DamagedNewestTest, IsSkippedWithAWarningNamingTheFile) {
  Fixture f;
  const State one = MakeState(kN, 11), two = MakeState(kN, 22);
  ASSERT_TRUE(f.store->Write(Meta(kN, 1, 2), SplitEven(one, 2)).ok());
  ASSERT_TRUE(f.store->Write(Meta(kN, 2, 2), SplitEven(two, 2)).ok());
  const std::string path = std::string("ckpt/step-2/") + GetParam().file;
  GetParam().apply(f.fs, path);
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step(), 1);
  EXPECT_TRUE(SameState(Restore(*ckpt, {}), one));
  EXPECT_TRUE(f.WarnedAbout(path, GetParam().expected))
      << (f.warnings.empty() ? "no warning" : f.warnings[0]);
  EXPECT_EQ(f.store->Load(2).status().code(), absl::StatusCode::kDataLoss);
}

INSTANTIATE_TEST_SUITE_P(Damages, DamagedNewestTest,
                         ::testing::Values(Damage{"FlippedByte", "shard-00001.bin", "CRC32C",
                                                  [](FakeFileSystem& fs, const std::string& p) {
                                                    ASSERT_TRUE(fs.FlipByte(p, 77).ok());
                                                  }},
                                           Damage{"Truncated", "shard-00000.bin", "truncated",
                                                  [](FakeFileSystem& fs, const std::string& p) {
                                                    ASSERT_TRUE(fs.Truncate(p, 100).ok());
                                                  }},
                                           Damage{"MissingShard", "shard-00001.bin", "unreadable",
                                                  [](FakeFileSystem& fs, const std::string& p) {
                                                    ASSERT_TRUE(fs.DeleteFile(p).ok());
                                                  }},
                                           Damage{"MissingManifest", "manifest.bin", "partial",
                                                  [](FakeFileSystem& fs, const std::string& p) {
                                                    ASSERT_TRUE(fs.DeleteFile(p).ok());
                                                  }},
                                           Damage{"BadManifestBytes", "manifest.bin", "CRC32C",
                                                  [](FakeFileSystem& fs, const std::string& p) {
                                                    ASSERT_TRUE(fs.FlipByte(p, 40).ok());
                                                  }},
                                           Damage{"GarbageManifest", "manifest.bin", "magic",
                                                  [](FakeFileSystem& fs, const std::string& p) {
                                                    ASSERT_TRUE(
                                                        fs.PutFile(p, std::string(200, 'x')).ok());
                                                  }}),
                         [](const ::testing::TestParamInfo<Damage>& info) {
                           return std::string(info.param.name);
                         });

TEST(CheckpointStoreTest, EveryCheckpointBadIsNotFound) {
  Fixture f;
  EXPECT_EQ(f.store->LoadLatestValid().status().code(), absl::StatusCode::kNotFound);
  const State s = MakeState(kN, 1);
  ASSERT_TRUE(f.store->Write(Meta(kN, 1), SplitEven(s, 1)).ok());
  ASSERT_TRUE(f.fs.FlipByte("ckpt/step-1/shard-00000.bin", 0).ok());
  EXPECT_EQ(f.store->LoadLatestValid().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(f.WarnedAbout("ckpt/step-1/shard-00000.bin", "no older one left"));
}

TEST(CheckpointStoreTest, DamagedLatestFileFallsBackToScanning) {
  Fixture f;
  const State s = MakeState(kN, 1);
  ASSERT_TRUE(f.store->Write(Meta(kN, 1), SplitEven(s, 2)).ok());
  ASSERT_TRUE(f.store->Write(Meta(kN, 4), SplitEven(s, 2)).ok());
  ASSERT_TRUE(f.fs.PutFile("ckpt/LATEST", "step-x\n").ok());
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ(ckpt->step(), 4);
  EXPECT_TRUE(f.WarnedAbout("ckpt/LATEST", "step-<n>"));
}

TEST(CheckpointStoreTest, IgnoresCheckpointsNewerThanLatest) {
  Fixture f;
  const State s = MakeState(kN, 1);
  ASSERT_TRUE(f.store->Write(Meta(kN, 1), SplitEven(s, 2)).ok());
  ASSERT_TRUE(f.store->Write(Meta(kN, 2), SplitEven(s, 2)).ok());
  ASSERT_TRUE(f.fs.PutFile("ckpt/LATEST", "step-1\n").ok());
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ(ckpt->step(), 1);
}

TEST(CheckpointStoreTest, KeepsTheLastK) {
  Fixture f(/*keep_last=*/2);
  const State s = MakeState(kN, 1);
  for (int64_t step : {10, 20, 30, 40, 50}) {
    ASSERT_TRUE(f.store->Write(Meta(kN, step), SplitEven(s, 2)).ok());
  }
  absl::StatusOr<std::vector<int64_t>> steps = f.store->ListSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{40, 50}));
  EXPECT_TRUE(f.store->Load(40).ok());
  EXPECT_TRUE(f.warnings.empty());
}

TEST(CheckpointStoreTest, RefusesToRewriteACommittedStepButRewritesAPartialOne) {
  Fixture f;
  const State s = MakeState(kN, 1);
  ASSERT_TRUE(f.store->Write(Meta(kN, 3), SplitEven(s, 2)).ok());
  EXPECT_EQ(f.store->Write(Meta(kN, 3), SplitEven(s, 2)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(f.fs.DeleteFile("ckpt/step-3/manifest.bin").ok());
  const State t = MakeState(kN, 2);
  ASSERT_TRUE(f.store->Write(Meta(kN, 3), SplitEven(t, 3)).ok());
  absl::StatusOr<Checkpoint> ckpt = f.store->LoadLatestValid();
  ASSERT_TRUE(ckpt.ok());
  EXPECT_TRUE(SameState(Restore(*ckpt, {}), t));
}

TEST(CheckpointStoreTest, RejectsBadInput) {
  Fixture f;
  const State s = MakeState(kN, 1);
  CheckpointStoreOptions options;
  options.keep_last = 0;
  EXPECT_EQ(CheckpointStore::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
  // Shards that leave a gap.
  std::vector<ShardView> views = SplitEven(s, 2);
  views[1].begin += 1;
  EXPECT_EQ(f.store->Write(Meta(kN, 1), views).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.store->LoadLatestValid().status().code(), absl::StatusCode::kNotFound);
}

// Split brain: two coordinators' store handles on one directory, the second under a later lease
// epoch. Once it has claimed the store, the first can neither write a shard nor move LATEST.
TEST(CheckpointStoreTest, AStaleLeaseEpochCanNeitherWriteNorCommit) {
  Fixture old_side;
  ASSERT_TRUE(old_side.store->Claim(5).ok());
  const State state = MakeState(kN, 1);
  ASSERT_TRUE(old_side.store->Write(Meta(kN, 10, 1), SplitEven(state, 1)).ok());
  CheckpointStoreOptions options;
  options.dir = "ckpt";
  options.fs = &old_side.fs;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> new_side = CheckpointStore::Open(options);
  ASSERT_TRUE(new_side.ok()) << new_side.status();
  ASSERT_TRUE((*new_side)->Claim(7).ok());
  EXPECT_EQ(*ReadSmallFile(&old_side.fs, "ckpt/FENCE", 64), "7\n");

  const absl::Status commit = old_side.store->Write(Meta(kN, 20, 1), SplitEven(state, 1));
  EXPECT_EQ(commit.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(commit.message(),
            "checkpoint store ckpt refuses shard 0 of step 20 from lease epoch 5: epoch 7 has "
            "claimed it since (FENCE)");
  absl::StatusOr<ShardFileInfo> shard = (*new_side)->WriteShard(20, 0, SplitEven(state, 1)[0]);
  ASSERT_TRUE(shard.ok()) << shard.status();
  CheckpointManifest m = Meta(kN, 20, 1);
  m.shards = {*shard};
  const absl::Status publish = old_side.store->Commit(m);
  EXPECT_EQ(publish.code(), absl::StatusCode::kFailedPrecondition) << publish;
  EXPECT_NE(publish.message().find("the commit of step 20 from lease epoch 5"), std::string::npos)
      << publish;
  EXPECT_EQ(old_side.store->LoadLatestValid()->step(), 10);  // LATEST did not move
  // The stale side cannot claim back, and a claim never lowers FENCE.
  EXPECT_EQ(old_side.store->Claim(6).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadSmallFile(&old_side.fs, "ckpt/FENCE", 64), "7\n");
  // The current epoch commits.
  ASSERT_TRUE((*new_side)->Commit(m).ok());
  EXPECT_EQ((*new_side)->LoadLatestValid()->step(), 20);
  // A handle that never claimed (no cluster, no lease) does not check.
  old_side.Reopen();
  EXPECT_TRUE(old_side.store->Write(Meta(kN, 30, 1), SplitEven(state, 1)).ok());
  // An unreadable FENCE is reported, naming the file, not read as "no fence".
  ASSERT_TRUE(old_side.fs.PutFile("ckpt/FENCE", "seven").ok());
  const absl::Status bad = (*new_side)->Claim(8);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(bad.message(), "ckpt/FENCE: expected a lease epoch (a decimal number), got \"seven\"");
  EXPECT_EQ(old_side.store->Claim(0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::train
