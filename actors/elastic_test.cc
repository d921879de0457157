// The sharded step against the single-process reference (model::Trainer), bit for bit, for any
// world size, across a rank's death, a scale-up and a checkpoint restore. Ranks are in-process
// communicators driven from threads; the process-level kills are in tests/training.
#include "troupe/actors/elastic.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "troupe/collectives/inprocess.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/trainer.h"

namespace troupe::actors {
namespace {

using collectives::Communicator;
using collectives::InProcessGroup;

constexpr int32_t kM = 8;

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe_elastic_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    uint32_t x = 12345;
    for (auto& t : tokens) {
      x = x * 1664525u + 1013904223u;
      t = static_cast<int32_t>((x >> 16) % 300);
    }
    ASSERT_TRUE(model::WriteTokenShard(dir_ + "/train-00000.tok", tokens, 300).ok());
    spec_.data_dir = dir_;
    spec_.seq_len = 32;
    spec_.microbatch_size = 2;
    spec_.microbatches = kM;
    spec_.seed = 7;
    schedule_.warmup_steps = 2;
    schedule_.total_steps = 20;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Parameters and moments of the single-process reference after `steps` steps.
  void Reference(int steps, std::vector<float>* params, std::vector<float>* m) {
    auto data = model::DataSource::Open(
        {dir_ + "/train-00000.tok"}, 300,
        {.seq_len = 32, .microbatch_size = 2, .microbatches_per_step = kM, .seed = 7});
    ASSERT_TRUE(data.ok()) << data.status();
    auto trainer = model::Trainer::Create(
        {.config = model::GptConfig::Tiny(300), .adamw = {}, .schedule = schedule_, .init_seed = 3},
        &*data);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int i = 0; i < steps; ++i) ASSERT_TRUE(trainer->Step().ok());
    params->assign(trainer->model().params(),
                   trainer->model().params() + trainer->model().num_params());
    *m = trainer->adam_m();
  }

  struct Rank {
    std::unique_ptr<Trainable> model;
    std::unique_ptr<ElasticRank> rank;
  };
  Rank NewRank() {
    Rank r;
    auto t = CreateGptTrainable(spec_);
    EXPECT_TRUE(t.ok()) << t.status();
    r.model = std::move(*t);
    ElasticRank::Options o;
    o.microbatches = kM;
    o.seed = 3;
    o.schedule = schedule_;
    o.collective.timeout = absl::Seconds(20);
    o.on_serve = [this](int64_t s, int32_t k) {
      absl::MutexLock l(&mu_);
      served_.emplace_back(s, k);
    };
    r.rank = std::make_unique<ElasticRank>(r.model.get(), o);
    return r;
  }

  // Runs f(i) on a thread per rank; returns each rank's status.
  static std::vector<absl::Status> Parallel(int n, const std::function<absl::Status(int)>& f) {
    std::vector<absl::Status> st(n);
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i) ts.emplace_back([&, i] { st[i] = f(i); });
    for (auto& t : ts) t.join();
    return st;
  }
  static void ExpectAllOk(const std::vector<absl::Status>& st) {
    for (size_t i = 0; i < st.size(); ++i) EXPECT_TRUE(st[i].ok()) << "rank " << i << ": " << st[i];
  }

  // Configures ranks (ranks[i] becomes rank i) with `plan` and commits.
  void Configure(std::vector<Rank*> ranks, GenerationPlan plan, uint64_t gen,
                 CheckpointStore* store = nullptr) {
    std::vector<std::unique_ptr<Communicator>> comms;
    groups_.push_back(InProcessGroup::Create(ranks.size(), gen, &comms));
    auto st = Parallel(ranks.size(), [&](int i) {
      GenerationPlan p = plan;
      p.world = ranks.size();
      p.rank = i;
      return ranks[i]->rank->Configure(comms[i].get(), p, store);
    });
    ExpectAllOk(st);
    for (Rank* r : ranks) r->rank->Commit();
    for (auto& c : comms) comms_.push_back(std::move(c));
  }
  void Steps(std::vector<Rank*> ranks, int until) {
    while (ranks[0]->rank->committed_steps() < until) {
      auto st = Parallel(ranks.size(), [&](int i) { return ranks[i]->rank->RunStep().status(); });
      ExpectAllOk(st);
      if (!st[0].ok()) return;
      for (Rank* r : ranks) r->rank->Commit();
    }
  }
  static void ExpectBitIdentical(Rank& r, const std::vector<float>& want) {
    ASSERT_EQ(r.model->num_params(), static_cast<int64_t>(want.size()));
    EXPECT_EQ(0, std::memcmp(r.model->params(), want.data(), want.size() * sizeof(float)))
        << "parameters differ from the single-process reference";
  }

  std::string dir_;
  ModelSpec spec_;
  model::LrSchedule schedule_;
  std::vector<std::shared_ptr<InProcessGroup>> groups_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, int32_t>> served_;
};

TEST(MicrobatchBlocksTest, PowerOfTwoAlignedSubtrees) {
  using B = std::vector<std::pair<int32_t, int32_t>>;
  EXPECT_EQ(*MicrobatchBlocks(8, 1), (B{{0, 8}}));
  EXPECT_EQ(*MicrobatchBlocks(8, 3), (B{{0, 2}, {2, 4}, {4, 8}}));
  EXPECT_EQ(*MicrobatchBlocks(8, 4), (B{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(*MicrobatchBlocks(6, 2), (B{{0, 4}, {4, 6}}));
  EXPECT_EQ(*MicrobatchBlocks(7, 3), (B{{0, 2}, {2, 4}, {4, 7}}));
  EXPECT_FALSE(MicrobatchBlocks(8, 9).ok());
  EXPECT_FALSE(MicrobatchBlocks(8, 0).ok());
}

TEST(ShardLayoutTest, ChunkAlignedRangesCoverTheParameters) {
  for (int w : {1, 2, 3, 4, 7}) {
    ShardLayout l = ShardLayout::Make(140000, w);
    EXPECT_EQ(l.per_rank % kernels::kNormChunk, 0);
    EXPECT_GE(l.padded(), 140000);
    EXPECT_EQ(l.begin(0), 0);
    for (int r = 0; r + 1 < w; ++r) EXPECT_EQ(l.end(r), l.begin(r + 1));
    EXPECT_EQ(l.end(w - 1), 140000);
  }
}

TEST(MemoryRestoreTest, NeedsOwnerOrBuddyOfEveryRange) {
  EXPECT_TRUE(MemoryRestorePossible({0, 1, -1, 2}));    // rank 2's buddy 3 survives
  EXPECT_FALSE(MemoryRestorePossible({0, 1, -1, -1}));  // rank 2 and its buddy both gone
  EXPECT_FALSE(MemoryRestorePossible({-1}));
  EXPECT_TRUE(MemoryRestorePossible({-1, 0}));
}

TEST_F(ElasticTest, AnyWorldSizeMatchesTheSingleProcessReference) {
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  for (int w : {1, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(w));
    std::vector<Rank> ranks(w);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .old_to_new = {}}, 0);
    Steps(ptrs, 3);
    for (auto& r : ranks) ExpectBitIdentical(r, want);
    // The moments, gathered from the owners, are the reference's too.
    for (auto& r : ranks) {
      ShardView v = r.rank->committed_shard();
      for (int64_t i = v.begin; i < v.end; ++i) {
        ASSERT_EQ(v.adam_m[i - v.begin], want_m[i]) << "element " << i;
      }
    }
  }
}

TEST_F(ElasticTest, FastModeIsCloseButNotPromisedBitIdentical) {
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  std::vector<Rank> ranks(3);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) {
    r = NewRank();
    ElasticRank::Options o;
    o.microbatches = kM;
    o.seed = 3;
    o.schedule = schedule_;
    o.deterministic = false;
    r.rank = std::make_unique<ElasticRank>(r.model.get(), o);
    ptrs.push_back(&r);
  }
  Configure(ptrs, {.source = RestoreSource::kInit, .old_to_new = {}}, 0);
  Steps(ptrs, 3);
  double max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(ranks[0].model->params()[i]) - want[i]));
  }
  EXPECT_LT(max_diff, 1e-4) << "fast-mode reduction drifted from the reference";
  for (auto& r : ranks) {  // every rank still holds the same parameters
    EXPECT_EQ(0, std::memcmp(r.model->params(), ranks[0].model->params(), want.size() * 4));
  }
}

TEST_F(ElasticTest, RankDiesMidStepSurvivorsRestoreFromMemoryAndMatch) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(4);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  Configure(ptrs, {.source = RestoreSource::kInit, .old_to_new = {}}, 0);
  Steps(ptrs, 2);
  // Step 2: rank 2 dies while the others are in the gradient exchange.
  groups_.back()->KillRank(2);
  auto st = Parallel(4, [&](int i) { return ranks[i].rank->RunStep().status(); });
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(st[i].ok()) << "rank " << i;
  EXPECT_TRUE(absl::IsUnavailable(st[0])) << st[0];
  for (auto& r : ranks) r.rank->Abandon();
  // Generation 1: old ranks 0, 1, 3 become 0, 1, 2; old rank 2's moments come from its buddy.
  std::vector<Rank*> survivors = {&ranks[0], &ranks[1], &ranks[3]};
  Configure(survivors,
            {.committed_steps = 2, .source = RestoreSource::kMemory, .old_to_new = {0, 1, -1, 2}},
            1);
  Steps(survivors, 4);
  for (Rank* r : survivors) ExpectBitIdentical(*r, want);
}

TEST(MemoryRestoreTest, TheBuddyOffsetSaysWhereEachMirrorIs) {
  // Two ranks in a row gone (one host of two): with offset 2 their mirrors are on the others.
  EXPECT_TRUE(MemoryRestorePossible({0, 1, -1, -1}, 2));
  EXPECT_FALSE(MemoryRestorePossible({0, 1, -1, -1}, 1));
  EXPECT_FALSE(MemoryRestorePossible({0, -1, 1, -1}, 2));  // 1 and 3 mirror each other
}

TEST(BuddyOffsetTest, PutsEveryBuddyInAnotherDomainWhereTheGroupAllows) {
  using D = std::vector<std::string>;
  EXPECT_EQ(BuddyOffset(D{}), 1);
  EXPECT_EQ(BuddyOffset(D{"h1"}), 1);
  EXPECT_EQ(BuddyOffset(D{"h1", "h2", "h3", "h4"}), 1);
  EXPECT_EQ(BuddyOffset(D{"h1", "h1", "h2", "h2"}), 2);
  EXPECT_EQ(BuddyOffset(D{"h1", "h1", "h1", "h2", "h2", "h2"}), 3);
  EXPECT_EQ(BuddiesSharingADomain(D{"h1", "h1", "h1", "h2", "h2", "h2"}, 3), 0);
  // Survivors first, then a new host: h2 was lost, h4 joined.
  const D after = {"h1", "h1", "h3", "h3", "h4", "h4"};
  EXPECT_EQ(BuddiesSharingADomain(after, BuddyOffset(after)), 0);
  // One domain holds most ranks: no offset avoids it, the fewest sharing is chosen.
  const D most = {"a", "a", "a", "b"};
  EXPECT_EQ(BuddiesSharingADomain(most, BuddyOffset(most)), 2);
  EXPECT_EQ(BuddyOffset(D{"a", "a", "a"}), 1);  // one machine: every buddy shares it
}

TEST_F(ElasticTest, AHostOfTwoRanksLostRestoresFromMirrorsOnTheOtherHost) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(4);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  // Ranks 0, 1 on one host, 2, 3 on another: buddies two ranks on.
  Configure(ptrs, {.buddy = 2, .source = RestoreSource::kInit, .old_to_new = {}}, 0);
  Steps(ptrs, 2);
  groups_.back()->KillRank(2);
  groups_.back()->KillRank(3);
  auto st = Parallel(2, [&](int i) { return ranks[i].rank->RunStep().status(); });
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(st[i].ok()) << "rank " << i;
  for (auto& r : ranks) r.rank->Abandon();
  std::vector<Rank*> survivors = {&ranks[0], &ranks[1]};
  Configure(survivors,
            {.committed_steps = 2,
             .source = RestoreSource::kMemory,
             .old_to_new = {0, 1, -1, -1},
             .old_buddy = 2},
            1);
  Steps(survivors, 4);
  for (Rank* r : survivors) ExpectBitIdentical(*r, want);
}

TEST_F(ElasticTest, APlanWithABuddyOffsetOutsideItsWorldIsRefused) {
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) r = NewRank();
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  for (int bad : {0, 2}) {
    auto st = Parallel(2, [&](int i) {
      GenerationPlan p{
          .world = 2, .rank = i, .buddy = bad, .source = RestoreSource::kInit, .old_to_new = {}};
      return ranks[i].rank->Configure(comms[i].get(), p, nullptr);
    });
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[i])) << st[i];
      EXPECT_NE(st[i].message().find("buddy offsets: expected 1 <= buddy < world"),
                std::string::npos)
          << st[i];
    }
  }
}

TEST_F(ElasticTest, JoinersAreFoldedInAndMatch) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(4);
  for (auto& r : ranks) r = NewRank();
  std::vector<Rank*> two = {&ranks[0], &ranks[1]},
                     four = {&ranks[0], &ranks[1], &ranks[2], &ranks[3]};
  Configure(two, {.source = RestoreSource::kInit, .old_to_new = {}}, 0);
  Steps(two, 2);
  Configure(four, {.committed_steps = 2, .source = RestoreSource::kMemory, .old_to_new = {0, 1}},
            1);
  Steps(four, 4);
  for (Rank* r : four) ExpectBitIdentical(*r, want);
}

TEST_F(ElasticTest, CheckpointRestoreIntoAnotherWorldSizeMatches) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  auto store = CheckpointStore::Open({.dir = dir_ + "/ckpt", .keep_last = 2, .warning = {}});
  ASSERT_TRUE(store.ok()) << store.status();
  {
    std::vector<Rank> ranks(2);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .old_to_new = {}}, 0);
    Steps(ptrs, 2);
    CheckpointManifest meta;
    meta.num_params = ranks[0].model->num_params();
    meta.step = 2;
    meta.seed = 7;
    meta.world_size = 2;
    std::vector<ShardView> views;
    for (auto& r : ranks) {
      if (r.rank->committed_shard().end > r.rank->committed_shard().begin)
        views.push_back(r.rank->committed_shard());
    }
    ASSERT_TRUE((*store)->Write(meta, views).ok());
  }
  std::vector<Rank> ranks(3);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  Configure(ptrs,
            {.committed_steps = 2,
             .source = RestoreSource::kCheckpoint,
             .old_to_new = {},
             .checkpoint_step = 2},
            5, store->get());
  Steps(ptrs, 4);
  for (Rank* r : ptrs) ExpectBitIdentical(*r, want);
}

TEST_F(ElasticTest, EveryMicrobatchServedOncePerCommittedStep) {
  std::vector<Rank> ranks(3);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  Configure(ptrs, {.source = RestoreSource::kInit, .old_to_new = {}}, 0);
  Steps(ptrs, 2);
  std::vector<std::pair<int64_t, int32_t>> want;
  for (int64_t s = 0; s < 2; ++s)
    for (int32_t k = 0; k < kM; ++k) want.emplace_back(s, k);
  auto got = served_;
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace troupe::actors
