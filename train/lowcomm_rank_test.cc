// LowCommRank in one process: ranks are threads over the in-process communicator, their groups
// training apart and meeting at the outer step. Against a DiLoCo reference written here from
// model::Trainer (one per group, on the group's data stream) and the outer step's formula, bit for
// bit — through a group that loses a rank mid-round (memory restore inside the group) and a group
// lost whole (the others go on; its Δ missing from the rounds after).
#include "troupe/train/lowcomm_rank.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <thread>

#include "troupe/collectives/inprocess.h"
#include "troupe/model/data_source.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/trainer.h"
#include "troupe/train/diloco_reference.h"

namespace troupe::train {
namespace {

constexpr int kM = 4;
constexpr int kSteps = 8;

class LowCommRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe_lowcomm_rank_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    uint32_t x = 99;
    for (auto& t : tokens) {
      x = x * 1664525u + 1013904223u;
      t = static_cast<int32_t>((x >> 16) % 300);
    }
    ASSERT_TRUE(model::WriteTokenShard(dir_ + "/train-00000.tok", tokens, 300).ok());
    spec_.data_dir = dir_;
    spec_.seq_len = 16;
    spec_.microbatch_size = 2;
    spec_.microbatches = kM;
    spec_.seed = 7;
    schedule_.max_lr = 3e-3f;
    schedule_.warmup_steps = 1;
    schedule_.total_steps = kSteps;
    lowcomm_.inner_steps = 2;
    lowcomm_.outer_lr = 0.7f;
    lowcomm_.outer_momentum = 0.9f;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // DiLoCo in one process: a model::Trainer per group on its data stream; after each round the
  // mean of θ_global − θ_g drives Nesterov, and every group continues from θ_global. `groups` of
  // each step (a group leaving at step s is in groups[s] no more).
  // `stale` (stale_outer): Δ_g is the change since the round began, and a round's mean is
  // applied where the next round ends (over the groups still there), after which each group goes
  // on from θ_global − its newest Δ; after the last step the newest are applied too.
  std::vector<float> Reference(const std::vector<std::vector<std::string>>& groups_at,
                               bool stale = false) {
    std::map<std::string, std::unique_ptr<model::DataSource>> data;
    std::map<std::string, std::unique_ptr<model::Trainer>> trainers;
    DiLoCoReference ref(0.7f, 0.9f, stale);
    for (int s = 0; s < kSteps; ++s) {
      const std::vector<std::string>& groups = groups_at[s];
      for (size_t g = 0; g < groups.size(); ++g) {
        if (!data.count(groups[g])) {
          auto d = model::DataSource::Open(
              {dir_ + "/train-00000.tok"}, 300,
              {.seq_len = 16, .microbatch_size = 2, .microbatches_per_step = kM, .seed = 7});
          EXPECT_TRUE(d.ok());
          data[groups[g]] = std::make_unique<model::DataSource>(*std::move(d));
          auto t = model::Trainer::Create({.config = model::GptConfig::Tiny(300),
                                           .adamw = {},
                                           .schedule = schedule_,
                                           .init_seed = 3},
                                          data[groups[g]].get());
          EXPECT_TRUE(t.ok());
          trainers[groups[g]] = std::make_unique<model::Trainer>(*std::move(t));
          ref.Start(groups[g], trainers[groups[g]]->model().params(),
                    trainers[groups[g]]->model().num_params());
        }
        EXPECT_TRUE(data[groups[g]]
                        ->SetStream(static_cast<int32_t>(g), static_cast<int32_t>(groups.size()))
                        .ok());
      }
      for (const std::string& g : groups) EXPECT_TRUE(trainers[g]->Step().ok());
      if ((s + 1) % lowcomm_.inner_steps != 0 && s + 1 != kSteps) continue;
      std::vector<std::pair<std::string, float*>> at;
      for (const std::string& g : groups) at.emplace_back(g, trainers[g]->model().params());
      ref.RoundEnd(at, s + 1 == kSteps);
    }
    return ref.global();
  }

  struct Rank {
    std::unique_ptr<Trainable> model;
    std::unique_ptr<ElasticRank> inner;
    std::unique_ptr<LowCommRank> rank;
  };
  std::unique_ptr<Rank> NewRank() {
    auto r = std::make_unique<Rank>();
    auto t = CreateGptTrainable(spec_);
    EXPECT_TRUE(t.ok()) << t.status();
    r->model = *std::move(t);
    ElasticRank::Options o;
    o.microbatches = kM;
    o.seed = 3;
    o.schedule = schedule_;
    o.collective.timeout = timeout_;
    r->inner = std::make_unique<ElasticRank>(r->model.get(), o);
    r->rank = std::make_unique<LowCommRank>(r->inner.get(),
                                            LowCommRank::Options{lowcomm_, kSteps, o.collective});
    return r;
  }

  // Runs `fn(rank index)` on a thread per rank.
  static void Each(size_t n, const std::function<void(size_t)>& fn) {
    std::vector<std::thread> ts;
    for (size_t i = 0; i < n; ++i) ts.emplace_back(fn, i);
    for (auto& t : ts) t.join();
  }

  // A generation over `ranks` (world order) with `plan` (world, source, ...) completed per rank.
  void Configure(const std::vector<Rank*>& ranks, GenerationPlan plan, uint64_t generation) {
    std::vector<std::unique_ptr<collectives::Communicator>> comms;
    keep_ = collectives::InProcessGroup::Create(static_cast<int>(ranks.size()), generation, &comms);
    if (wrap_) {
      for (auto& c : comms) c = wrap_(std::move(c));
    }
    comms_ = std::move(comms);
    Each(ranks.size(), [&](size_t i) {
      GenerationPlan p = plan;
      p.rank = static_cast<int>(i);
      absl::Status s = ranks[i]->rank->Configure(comms_[i].get(), p, nullptr);
      EXPECT_TRUE(s.ok()) << s;
    });
    for (Rank* r : ranks) r->rank->Commit();
  }
  // Steps [from, to) on every rank, committed; the syncs each rank reported.
  void Steps(const std::vector<Rank*>& ranks, int from, int to) {
    for (int s = from; s < to; ++s) {
      Each(ranks.size(), [&](size_t i) {
        OuterSync sync;
        absl::StatusOr<StepOutcome> out = ranks[i]->rank->RunStep(&sync);
        EXPECT_TRUE(out.ok()) << out.status();
        if ((s + 1) % 2 == 0) {
          EXPECT_EQ(sync.fragments, std::vector<int32_t>{0}) << "step " << s;
        }
      });
      for (Rank* r : ranks) r->rank->Commit();
    }
  }
  // A generation restored from memory after `committed` steps: `gone` of the `old_world` ranks
  // (in `old_groups`) lost, the ranks of `groups` (survivors first) going on.
  static GenerationPlan MemoryPlan(int64_t committed, int old_world, std::vector<int> gone,
                                   std::vector<std::string> old_groups,
                                   std::vector<std::string> groups) {
    GenerationPlan p;
    p.world = static_cast<int>(groups.size());
    p.source = RestoreSource::kMemory;
    p.committed_steps = committed;
    p.old_world = old_world;
    p.gone = std::move(gone);
    p.old_groups = std::move(old_groups);
    p.groups = std::move(groups);
    return p;
  }
  static std::vector<float> Params(Rank& r) {
    return std::vector<float>(r.model->params(), r.model->params() + r.model->num_params());
  }
  // A fault-free run of every layout (each rank's group, in world order): every rank ends on
  // `want`, parameters and θ_global.
  void EndOnAtEveryLayout(const std::vector<float>& want,
                          const std::vector<std::vector<std::string>>& layouts) {
    for (const std::vector<std::string>& groups : layouts) {
      std::vector<std::unique_ptr<Rank>> owned;
      std::vector<Rank*> ranks;
      for (size_t i = 0; i < groups.size(); ++i) {
        owned.push_back(NewRank());
        ranks.push_back(owned.back().get());
      }
      GenerationPlan plan;
      plan.world = static_cast<int>(groups.size());
      plan.groups = groups;
      Configure(ranks, plan, 1);
      Steps(ranks, 0, kSteps);
      for (Rank* r : ranks) {
        EXPECT_EQ(Params(*r), want) << groups.size() << " ranks";
        EXPECT_EQ(r->rank->global(), want);
      }
    }
  }

  std::string dir_;
  ModelSpec spec_;
  model::LrSchedule schedule_;
  LowCommOptions lowcomm_;
  absl::Duration timeout_ = absl::Seconds(20);  // the ranks' collectives'
  std::shared_ptr<collectives::InProcessGroup> keep_;
  // Wraps each communicator Configure makes, when set.
  std::function<std::unique_ptr<collectives::Communicator>(
      std::unique_ptr<collectives::Communicator>)>
      wrap_;
  std::vector<std::unique_ptr<collectives::Communicator>> comms_;
};

TEST_F(LowCommRankTest, TwoGroupsOfAnySizeMatchTheReferenceAndEndOnTheGlobalWeights) {
  const std::vector<float> want =
      Reference(std::vector<std::vector<std::string>>(kSteps, {"zone:a", "zone:b"}));
  EndOnAtEveryLayout(want, {{"zone:a", "zone:b"},
                            {"zone:b", "zone:a", "zone:a", "zone:b"},
                            {"zone:a", "zone:a", "zone:a", "zone:b"}});
}

// Group a (a0, a1, a2) loses a1 in the middle of step 4 (the round of steps 4-5): the step is
// abandoned, group a restored from its survivors' memory, the step re-run. Group b is lost whole
// once step 6 is committed: the round of steps 6-7 is group a's alone, on the one data stream.
TEST_F(LowCommRankTest, ARankLostInAGroupAndAGroupLostWholeMatchTheirMembershipHistory) {
  std::vector<std::vector<std::string>> history(kSteps, {"zone:a", "zone:b"});
  for (int s = 6; s < kSteps; ++s) history[s] = {"zone:a"};
  const std::vector<float> want = Reference(history);
  std::vector<std::unique_ptr<Rank>> owned;
  for (int i = 0; i < 4; ++i) owned.push_back(NewRank());
  Rank *a0 = owned[0].get(), *a1 = owned[1].get(), *b0 = owned[2].get(), *a2 = owned[3].get();
  GenerationPlan plan;
  plan.world = 4;
  plan.groups = {"zone:a", "zone:a", "zone:b", "zone:a"};
  Configure({a0, a1, b0, a2}, plan, 1);
  Steps({a0, a1, b0, a2}, 0, 4);
  // a1 dies in step 4: the survivors' staged step is abandoned; generation 2 restores group a
  // from its survivors' memory (a0, a2), b0 keeps its own.
  for (Rank* r : {a0, b0, a2}) r->rank->Abandon();
  const GenerationPlan mem = MemoryPlan(4, 4, {1}, plan.groups, {"zone:a", "zone:b", "zone:a"});
  Configure({a0, b0, a2}, mem, 2);
  Steps({a0, b0, a2}, 4, 6);
  // Group b is lost whole: a0 and a2 go on alone, on the one data stream left.
  const GenerationPlan alone = MemoryPlan(6, 3, {1}, mem.groups, {"zone:a", "zone:a"});
  Configure({a0, a2}, alone, 3);
  Steps({a0, a2}, 6, kSteps);
  EXPECT_EQ(Params(*a0), want);
  EXPECT_EQ(Params(*a2), want);
}

// stale_outer: a round's mean lands where the next round ends, and each group goes on from
// θ_global − its own newest Δ. The bits are the one-round-late reference's at any group size, and
// not the synchronous one's.
TEST_F(LowCommRankTest, StaleOuterMatchesOneRoundLateDiLoCoAtAnyGroupSize) {
  lowcomm_.stale_outer = true;
  const std::vector<std::vector<std::string>> both(kSteps, {"zone:a", "zone:b"});
  const std::vector<float> want = Reference(both, true);
  ASSERT_NE(want, Reference(both, false));
  EndOnAtEveryLayout(want, {{"zone:a", "zone:b"}, {"zone:b", "zone:a", "zone:a", "zone:b"}});
}

// stale_outer through generation changes, whose communicators take the flights with them: a1
// dies in step 4 with step 4's round in flight (the survivors exchange it again on generation 2)
// and a3 joins group a there (handed the round's start and the Δ in flight); group b is lost
// whole at step 6: the round in flight then is applied with group a's Δ alone.
TEST_F(LowCommRankTest, StaleOuterPostsTheRoundInFlightAgainAfterAGenerationChange) {
  lowcomm_.stale_outer = true;
  std::vector<std::vector<std::string>> history(kSteps, {"zone:a", "zone:b"});
  for (int s = 6; s < kSteps; ++s) history[s] = {"zone:a"};
  const std::vector<float> want = Reference(history, true);
  std::vector<std::unique_ptr<Rank>> owned;
  for (int i = 0; i < 5; ++i) owned.push_back(NewRank());
  Rank *a0 = owned[0].get(), *a1 = owned[1].get(), *b0 = owned[2].get(), *a2 = owned[3].get(),
       *a3 = owned[4].get();
  GenerationPlan plan;
  plan.world = 4;
  plan.groups = {"zone:a", "zone:a", "zone:b", "zone:a"};
  Configure({a0, a1, b0, a2}, plan, 1);
  Steps({a0, a1, b0, a2}, 0, 4);
  for (Rank* r : {a0, b0, a2}) r->rank->Abandon();
  const GenerationPlan mem =
      MemoryPlan(4, 4, {1}, plan.groups, {"zone:a", "zone:b", "zone:a", "zone:a"});
  Configure({a0, b0, a2, a3}, mem, 2);
  Steps({a0, b0, a2, a3}, 4, 6);
  const GenerationPlan next = MemoryPlan(6, 4, {1}, mem.groups, {"zone:a", "zone:a", "zone:a"});
  Configure({a0, a2, a3}, next, 3);
  Steps({a0, a2, a3}, 6, kSteps);
  for (Rank* r : {a0, a2, a3}) EXPECT_EQ(Params(*r), want);
}

// stale_outer with 2 fragments (staggered: fragment 1 syncs a step after fragment 0) and int8 with
// error feedback checked by every rank after every sync (verify_feedback fails the step when
// Σ sent + residual ≠ Σ Δ, Δ counted from each round's start): the ranks of both groups end on
// the same θ_global.
TEST_F(LowCommRankTest, StaleOuterWithFragmentsAndInt8KeepsTheFeedbackExactAndEndsTogether) {
  lowcomm_.stale_outer = true;
  lowcomm_.fragments = 2;
  lowcomm_.compression = collectives::Compression::kInt8;
  lowcomm_.verify_feedback = true;
  std::vector<std::unique_ptr<Rank>> owned;
  std::vector<Rank*> ranks;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(NewRank());
    ranks.push_back(owned.back().get());
  }
  GenerationPlan plan;
  plan.world = 4;
  plan.groups = {"zone:a", "zone:b", "zone:a", "zone:b"};
  Configure(ranks, plan, 1);
  const std::vector<float> init = Params(*ranks[0]);
  std::vector<std::vector<int32_t>> synced(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    Each(ranks.size(), [&](size_t i) {
      OuterSync sync;
      absl::StatusOr<StepOutcome> out = ranks[i]->rank->RunStep(&sync);
      ASSERT_TRUE(out.ok()) << out.status();
      if (i == 0) synced[s] = sync.fragments;
      if (!sync.fragments.empty()) {
        EXPECT_LE(sync.feedback_error, 1e-5);
      }
    });
    for (Rank* r : ranks) r->rank->Commit();
  }
  EXPECT_EQ(synced, (std::vector<std::vector<int32_t>>{{}, {0}, {1}, {0}, {1}, {0}, {1}, {0, 1}}));
  const std::vector<float> first = ranks[0]->rank->global();
  EXPECT_NE(first, init) << "nothing trained";
  for (Rank* r : ranks) {
    EXPECT_EQ(Params(*r), first);
    EXPECT_EQ(r->rank->global(), first);
  }
}

// The generation's communicator, except that the outer exchange's payloads (kOuterExchangeTag |
// f, not the one-float kOuterHeldTag ones) are not handed on until `open`: a send waits on a
// thread of its own, so the Work a rank holds stays pending meanwhile.
class HeldExchange : public collectives::Communicator {
 public:
  HeldExchange(std::unique_ptr<Communicator> c, std::atomic<bool>* open, std::atomic<int>* held)
      : c_(std::move(c)), open_(open), held_(held) {}
  ~HeldExchange() override {
    for (std::thread& t : threads_) t.join();
  }
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  uint64_t generation() const override { return c_->generation(); }
  collectives::Work AllReduce(collectives::Buffer in, collectives::Buffer out,
                              collectives::ReduceOp op,
                              const collectives::CollectiveOptions& o) override {
    return c_->AllReduce(in, out, op, o);
  }
  collectives::Work ReduceScatter(collectives::Buffer in, collectives::Buffer out,
                                  collectives::ReduceOp op,
                                  const collectives::CollectiveOptions& o) override {
    return c_->ReduceScatter(in, out, op, o);
  }
  collectives::Work AllGather(collectives::Buffer in, collectives::Buffer out,
                              const collectives::CollectiveOptions& o) override {
    return c_->AllGather(in, out, o);
  }
  collectives::Work Broadcast(collectives::Buffer b, int root,
                              const collectives::CollectiveOptions& o) override {
    return c_->Broadcast(b, root, o);
  }
  collectives::Work Send(collectives::Buffer b, int peer, uint32_t tag,
                         const collectives::CollectiveOptions& o) override {
    const uint32_t outer = kOuterExchangeTag | 0x04000000u;  // bits 26..30: not the outer state's
    if ((tag & outer) != kOuterExchangeTag || (tag & kOuterHeldTag) != 0) {
      return c_->Send(b, peer, tag, o);
    }
    ++*held_;
    auto state = std::make_shared<collectives::Work::State>();
    threads_.emplace_back([this, state, b, peer, tag, o] {
      const absl::Time give_up = absl::Now() + absl::Seconds(60);
      while (!open_->load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
      state->status = c_->Send(b, peer, tag, o).Wait();
      state->done.Notify();
    });
    return collectives::Work(state);
  }
  collectives::Work Recv(collectives::Buffer b, int peer, uint32_t tag,
                         const collectives::CollectiveOptions& o) override {
    return c_->Recv(b, peer, tag, o);
  }
  collectives::Work Barrier(const collectives::CollectiveOptions& o) override {
    return c_->Barrier(o);
  }
  void Abort(absl::Status s) override { c_->Abort(std::move(s)); }
  collectives::CommStats stats() const override { return c_->stats(); }
  std::string DebugString() const override { return "held(" + c_->DebugString() + ")"; }

 private:
  std::unique_ptr<Communicator> c_;
  std::atomic<bool>* open_;
  std::atomic<int>* held_;
  std::vector<std::thread> threads_;
};

// The round ending at step 2 exchanges while step 3 trains: its payloads are held until step 3
// is committed and twice the collective timeout has passed. An exchange finished inside the step
// that ends the round could never finish (that step would wait out the deadline and fail), nor
// could one whose deadline ran from its post; the overlapping one ends on the bits of the
// one-round-late reference.
TEST_F(LowCommRankTest, StaleOuterExchangesARoundWhileTheNextOneTrains) {
  lowcomm_.stale_outer = true;
  timeout_ = absl::Seconds(1);
  std::atomic<bool> open{false};
  std::atomic<int> held{0};
  wrap_ = [&](std::unique_ptr<collectives::Communicator> c) {
    return std::make_unique<HeldExchange>(std::move(c), &open, &held);
  };
  std::vector<std::unique_ptr<Rank>> owned;
  for (int i = 0; i < 2; ++i) owned.push_back(NewRank());
  std::vector<Rank*> ranks = {owned[0].get(), owned[1].get()};
  GenerationPlan plan;
  plan.world = 2;
  plan.groups = {"zone:a", "zone:b"};
  Configure(ranks, plan, 1);
  Steps(ranks, 0, 3);
  EXPECT_EQ(held.load(), 2) << "each leader's payload of the round ending at step 2";
  absl::SleepFor(2 * timeout_);
  open = true;
  Steps(ranks, 3, kSteps);
  const std::vector<float> want =
      Reference(std::vector<std::vector<std::string>>(kSteps, {"zone:a", "zone:b"}), true);
  for (Rank* r : ranks) EXPECT_EQ(Params(*r), want);
  comms_.clear();  // joins the held sends' threads
}

TEST_F(LowCommRankTest, GroupPlansAreCutFromTheWorldsPlan) {
  GenerationPlan p;
  p.world = 4;
  p.rank = 3;
  p.buddy = 3;
  p.source = RestoreSource::kMemory;
  p.committed_steps = 9;
  p.old_world = 5;
  p.gone = {0, 3};
  p.old_groups = {"b", "a", "b", "b", "c"};
  p.groups = {"a", "b", "c", "b"};  // kept: 1 2 4 (a b c), then a joiner in b
  absl::StatusOr<GroupPlan> g = GroupPlanOf(p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->group, "b");
  EXPECT_EQ(g->index, 1);
  EXPECT_EQ(g->members, (std::vector<int>{1, 3}));
  EXPECT_EQ(g->names, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(g->leaders, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(g->plan.world, 2);
  EXPECT_EQ(g->plan.rank, 1);
  EXPECT_EQ(g->plan.buddy, 1);
  EXPECT_EQ(g->plan.old_world, 3) << "b's old ranks 0, 2, 3";
  EXPECT_EQ(g->plan.gone, (std::vector<int>{0, 2}));
  EXPECT_FALSE(g->new_group);
  p.rank = 2;
  p.old_groups = {"b", "a", "b", "b", "d"};  // c: nobody of it was there
  g = GroupPlanOf(p);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->new_group);
  EXPECT_EQ(g->plan.source, RestoreSource::kInit);
  p.groups.pop_back();
  EXPECT_EQ(GroupPlanOf(p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::train
