// The overlapped step's schedule (elastic_overlap.cc): pieces are planned on whole norm chunks,
// and a piece's exchange runs while the backward pass goes on — a fake communicator holds each
// piece's exchange until the fake model has finished the next piece's backward, and the model
// waits for the previous piece to be posted before it goes on: a step that posted the exchange
// only after the backward pass (or waited for a piece before going on) fails on the model's
// deadline. The bits against the serial reference are ElasticTest's
// (OverlappedStepIsBitIdenticalForEveryBucketSizeAndWorldSize); kills in the middle of an
// overlapped exchange are tests/training's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "troupe/collectives/inprocess.h"
#include "troupe/kernels/norm.h"
#include "troupe/train/elastic.h"

namespace troupe::train {
namespace {

using collectives::Buffer;
using collectives::CollectiveOptions;
using collectives::Communicator;
using collectives::Work;

constexpr int64_t kChunk = kernels::kNormChunk;

TEST(GradientPiecesTest, EachOwnersRangeIsCutInBucketsOfWholeChunks) {
  const ShardLayout layout = ShardLayout::Make(10 * kChunk + 5, 3);  // per_rank: 4 chunks
  ASSERT_EQ(layout.per_rank, 4 * kChunk);
  const std::vector<GradientPiece> pieces =
      PlanGradientPieces(layout, layout.num_params, 3 * kChunk);
  std::vector<std::tuple<int, int32_t, int64_t, int64_t>> got;
  for (const GradientPiece& p : pieces) got.emplace_back(p.owner, p.index, p.lo, p.hi);
  const std::vector<std::tuple<int, int32_t, int64_t, int64_t>> want = {
      {0, 0, 0, 3 * kChunk},
      {0, 1, 3 * kChunk, 4 * kChunk},
      {1, 0, 4 * kChunk, 7 * kChunk},
      {1, 1, 7 * kChunk, 8 * kChunk},
      {2, 0, 8 * kChunk, 10 * kChunk + 5}};
  EXPECT_EQ(got, want);
}

// Replicated state: the whole gradient in buckets of whole chunks (at most a rank's share, so each
// rank combines some), piece j combined by rank j mod W.
TEST(GradientPiecesTest, SharedPiecesCoverTheGradientRoundRobinInWholeChunks) {
  const int64_t n = 10 * kChunk + 5;
  std::vector<std::tuple<int, int32_t, int64_t, int64_t>> got;
  for (const GradientPiece& p : PlanSharedGradientPieces(n, 3, 3 * kChunk)) {
    got.emplace_back(p.owner, p.index, p.lo, p.hi);
  }
  EXPECT_EQ(got,
            (std::vector<std::tuple<int, int32_t, int64_t, int64_t>>{{0, 0, 0, 3 * kChunk},
                                                                     {1, 1, 3 * kChunk, 6 * kChunk},
                                                                     {2, 2, 6 * kChunk, 9 * kChunk},
                                                                     {0, 3, 9 * kChunk, n}}));
  // A bucket above a rank's share is cut to it (4 chunks each of 11): every rank combines one.
  got.clear();
  for (const GradientPiece& p : PlanSharedGradientPieces(n, 3, 1 << 28)) {
    got.emplace_back(p.owner, p.index, p.lo, p.hi);
  }
  EXPECT_EQ(got,
            (std::vector<std::tuple<int, int32_t, int64_t, int64_t>>{
                {0, 0, 0, 4 * kChunk}, {1, 1, 4 * kChunk, 8 * kChunk}, {2, 2, 8 * kChunk, n}}));
  EXPECT_EQ(PlanSharedGradientPieces(5, 4, kChunk).size(), 1u);  // less than a chunk: one piece
}

TEST(GradientPiecesTest, BucketSizesRoundToWholeChunksAndFollowTheLink) {
  EXPECT_EQ(BucketFloats(0, /*same_host=*/true), (16 << 20) / 4);
  EXPECT_EQ(BucketFloats(0, /*same_host=*/false), (4 << 20) / 4);
  EXPECT_EQ(BucketFloats(1, false), kChunk);                      // at least one chunk
  EXPECT_EQ(BucketFloats(5 * kChunk * 4 + 7, true), 5 * kChunk);  // whole chunks
}

// When each piece's exchange was posted, and whether it may complete — by (step, piece), the
// exchange tag's low 28 bits (elastic_internal.h: the step's low 8 bits, then the piece).
struct Gate {
  static uint32_t Key(int64_t step, int piece) {
    return ((static_cast<uint32_t>(step) & 0xff) << 20) | static_cast<uint32_t>(piece);
  }
  std::mutex mu;
  std::map<uint32_t, absl::Notification> posted;
  std::map<uint32_t, absl::Notification> released;
  absl::Notification& Posted(uint32_t piece) {
    std::lock_guard<std::mutex> l(mu);
    return posted[piece];
  }
  absl::Notification& Released(uint32_t piece) {
    std::lock_guard<std::mutex> l(mu);
    return released[piece];
  }
  void Release(uint32_t piece) {
    std::lock_guard<std::mutex> l(mu);
    if (!released[piece].HasBeenNotified()) released[piece].Notify();
  }
  // A failed step: nothing is held any more (the held works' threads finish).
  void ReleaseAll() {
    std::lock_guard<std::mutex> l(mu);
    for (auto& [key, n] : released) {
      if (!n.HasBeenNotified()) n.Notify();
    }
  }
};

constexpr uint32_t kExchangeTagBits = (1u << 30) | (1u << 29);  // elastic_internal.h
constexpr uint32_t kKeyMask = (1u << 28) - 1;

// Forwards to an in-process communicator. Every point-to-point operation's tag goes to
// `posted` as it is posted; one for which `hold` names a notification completes only once that
// notification comes (within 10 s: else it fails, and so does the step, rather than hang).
// `release_all` ends every hold (a failed step, the end).
class GatedComm final : public Communicator {
 public:
  struct Policy {
    std::function<void(uint32_t tag)> posted;
    std::function<absl::Notification*(uint32_t tag)> hold;
    std::function<void()> release_all;
  };
  GatedComm(Communicator* inner, Policy policy) : inner_(inner), policy_(std::move(policy)) {}
  ~GatedComm() override {
    policy_.release_all();
    for (std::thread& t : waiters_) t.join();
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  uint64_t generation() const override { return inner_->generation(); }
  Work AllReduce(Buffer in, Buffer out, collectives::ReduceOp op,
                 const CollectiveOptions& o) override {
    return inner_->AllReduce(in, out, op, o);
  }
  Work ReduceScatter(Buffer in, Buffer out, collectives::ReduceOp op,
                     const CollectiveOptions& o) override {
    return inner_->ReduceScatter(in, out, op, o);
  }
  Work AllGather(Buffer in, Buffer out, const CollectiveOptions& o) override {
    return inner_->AllGather(in, out, o);
  }
  Work Broadcast(Buffer b, int root, const CollectiveOptions& o) override {
    return inner_->Broadcast(b, root, o);
  }
  Work Send(Buffer b, int peer, uint32_t tag, const CollectiveOptions& o) override {
    return inner_->Send(b, peer, tag, o);
  }
  Work Recv(Buffer b, int peer, uint32_t tag, const CollectiveOptions& o) override {
    return inner_->Recv(b, peer, tag, o);
  }
  Work Barrier(const CollectiveOptions& o) override { return inner_->Barrier(o); }
  std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                     const CollectiveOptions& o) override {
    std::vector<Work> works = inner_->PostPointToPoint(ops, o);
    for (size_t i = 0; i < ops.size(); ++i) {
      policy_.posted(ops[i].tag);
      absl::Notification* released = policy_.hold(ops[i].tag);
      if (released == nullptr) continue;
      auto held = std::make_shared<Work::State>();
      waiters_.emplace_back([held, inner = works[i], released] {
        held->status = inner.Wait();
        // A step that waits for a piece before its backward pass goes on never releases it:
        // fail the piece (the step then fails) rather than hang.
        if (!released->WaitForNotificationWithTimeout(absl::Seconds(10)) && held->status.ok()) {
          held->status = absl::DeadlineExceededError(
              "a held operation was waited for before what releases it happened");
        }
        held->done.Notify();
      });
      works[i] = Work(held);
    }
    return works;
  }
  void Abort(absl::Status status) override {
    inner_->Abort(std::move(status));
    policy_.release_all();
  }
  collectives::CommStats stats() const override { return inner_->stats(); }
  std::string DebugString() const override { return "gated:" + inner_->DebugString(); }
  bool PeersShareHost() const override { return inner_->PeersShareHost(); }
  bool MatchesByTag() const override { return inner_->MatchesByTag(); }

 private:
  Communicator* inner_;
  Policy policy_;
  std::vector<std::thread> waiters_;
};

// The gradient exchange's operations (partials and, replicated, shares; sharded, the combined
// pieces' mirror to the buddy: their tags carry the exchange's bits) complete only once the gate
// releases their piece; each one's posting is noted in the gate.
GatedComm::Policy GatePolicy(Gate* gate) {
  return {[gate](uint32_t tag) {
            if ((tag & kExchangeTagBits) != kExchangeTagBits) return;
            absl::Notification& posted = gate->Posted(tag & kKeyMask);
            if (!posted.HasBeenNotified()) posted.Notify();
          },
          [gate](uint32_t tag) {
            return (tag & kExchangeTagBits) == kExchangeTagBits ? &gate->Released(tag & kKeyMask)
                                                                : nullptr;
          },
          [gate] { gate->ReleaseAll(); }};
}

// A model of kBlocks blocks of kBlock floats whose backward pass runs from the last block to the
// first, reporting each; with a gate, before block b it waits (up to 5 s) until block b + 1's
// exchange was posted, and once block b is done it releases block b + 1's exchange.
constexpr int kBlocks = 4;
constexpr int64_t kBlock = 2 * kChunk;

class BlockModel final : public Trainable {
 public:
  explicit BlockModel(Gate* gate) : gate_(gate), params_(kBlocks * kBlock), grads_(params_.size()) {
    tensors_.push_back({"w", 0, num_params(), {num_params()}, false});
  }
  int64_t num_params() const override { return static_cast<int64_t>(params_.size()); }
  const std::vector<model::ParamTensor>& tensors() const override { return tensors_; }
  float* params() override { return params_.data(); }
  const float* grads() const override { return grads_.data(); }
  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i] = 0.01f * static_cast<float>((i + seed) % 97);
  }
  int64_t tokens_per_microbatch() const override { return 1; }
  absl::StatusOr<double> ComputeGradient(int64_t step, int32_t k) override {
    return ComputeGradientReporting(step, k, nullptr);
  }
  absl::StatusOr<double> ComputeGradientReporting(int64_t step, int32_t k,
                                                  const GradientReady& ready) override {
    if (ready) ++reporting_calls_;
    for (int b = kBlocks - 1; b >= 0; --b) {
      if (ready && gate_ != nullptr && b + 1 < kBlocks) {
        const uint32_t previous = Gate::Key(step, b + 1);  // one piece per block here
        if (!gate_->Posted(previous).WaitForNotificationWithTimeout(absl::Seconds(5))) {
          return absl::DeadlineExceededError(
              absl::StrCat("block ", b + 1,
                           "'s gradient exchange was not posted while the backward pass went "
                           "on (a serial step)"));
        }
      }
      for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
        grads_[i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(k) +
                             0.5f * static_cast<float>(step)) *
                    (1.0f + params_[i]);
      }
      if (ready) ready(b * kBlock, (b + 1) * kBlock);
      if (ready && gate_ != nullptr && b + 1 < kBlocks) {
        gate_->Release(Gate::Key(step, b + 1));
      }
    }
    if (ready && gate_ != nullptr) gate_->Release(Gate::Key(step, 0));
    return 1.0;
  }
  // Calls with a GradientReady: the trainer asks for reports on each step's last microbatch.
  int reporting_calls() const { return reporting_calls_; }

 private:
  Gate* gate_;
  int reporting_calls_ = 0;
  std::vector<float> params_, grads_;
  std::vector<model::ParamTensor> tensors_;
};

// Runs `steps` steps on `world` ranks of BlockModel (gated where `gated`), each rank's
// communicator held by `policy` (default: GatePolicy of its gate); every rank's params.
std::vector<std::vector<float>> Train(
    int world, int steps, bool gated, bool replicated = false,
    const std::function<GatedComm::Policy(int rank, Gate* gate)>& policy = nullptr) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = collectives::InProcessGroup::Create(world, 0, &comms);
  std::vector<std::unique_ptr<Gate>> gates;
  std::vector<std::unique_ptr<Communicator>> gated_comms;
  std::vector<std::unique_ptr<BlockModel>> models;
  std::vector<std::unique_ptr<ElasticRank>> ranks;
  for (int r = 0; r < world; ++r) {
    gates.push_back(std::make_unique<Gate>());
    Gate* gate = gates.back().get();
    gated_comms.push_back(
        std::make_unique<GatedComm>(comms[r].get(), policy ? policy(r, gate) : GatePolicy(gate)));
    models.push_back(std::make_unique<BlockModel>(gated ? gates.back().get() : nullptr));
    ElasticRank::Options o;
    o.microbatches = 4;
    o.seed = 5;
    o.bucket_bytes = kBlock * 4;  // a piece per block
    o.replicate_optimizer = replicated;
    o.collective.timeout = absl::Seconds(20);
    ranks.push_back(std::make_unique<ElasticRank>(models.back().get(), o));
  }
  auto parallel = [&](const std::function<absl::Status(int)>& f) {
    std::vector<absl::Status> st(world);
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r) ts.emplace_back([&, r] { st[r] = f(r); });
    for (auto& t : ts) t.join();
    for (int r = 0; r < world; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    return std::all_of(st.begin(), st.end(), [](const absl::Status& s) { return s.ok(); });
  };
  std::vector<std::vector<float>> out(world);
  const bool configured = parallel([&](int r) {
    GenerationPlan plan;
    plan.world = world;
    plan.rank = r;
    // A replicated state runs on the host communicator alone.
    return ranks[r]->Configure(gated_comms[r].get(), plan, nullptr,
                               replicated ? gated_comms[r].get() : comms[r].get());
  });
  if (!configured) return out;
  for (auto& r : ranks) r->Commit();
  for (int s = 0; s < steps; ++s) {
    if (!parallel([&](int r) { return ranks[r]->RunStep().status(); })) return out;
    for (auto& r : ranks) r->Commit();
  }
  parallel([&](int r) {
    absl::StatusOr<std::vector<float>> p = ranks[r]->ParamsOnHost();
    if (p.ok()) out[r] = *std::move(p);
    return p.status();
  });
  gated_comms.clear();  // joins the gates' waiters before the group goes
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(models[r]->reporting_calls(), steps)
        << "rank " << r << " never asked the model to report its backward pass's progress";
  }
  return out;
}

TEST(OverlapTest, APiecesExchangeRunsWhileTheBackwardPassGoesOn) {
  const std::vector<std::vector<float>> want = Train(1, 2, /*gated=*/false);
  ASSERT_EQ(want[0].size(), static_cast<size_t>(kBlocks * kBlock));
  for (int world : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    const std::vector<std::vector<float>> got = Train(world, 2, /*gated=*/true);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(got[r].size(), want[0].size()) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(got[r].data(), want[0].data(), want[0].size() * sizeof(float)))
          << "rank " << r << ": the overlapped step's bits differ from one rank's";
    }
  }
}

// Replicated state, 2 ranks, a piece per block: rank 0 combines pieces 0 and 2, and the backward
// pass finishes piece 2 before piece 0. Rank 0's receive of piece 2 completes only after its
// backward pass has returned, and its receive of piece 0 only once it has shared piece 2: a rank
// that waits for its pieces in flat order (piece 0 first, the last to arrive, while piece 2 sits
// uncombined) never shares piece 2 and fails on the hold's deadline. Waiting in the order the
// pieces were sent, it shares each piece as it comes.
TEST(OverlapTest, ACombinerTakesItsPiecesInTheOrderTheBackwardPassSentThem) {
  const std::vector<std::vector<float>> want = Train(1, 2, /*gated=*/false);
  Gate shared;  // rank 0's share of piece 2 posted, by step
  auto policy = [&shared](int rank, Gate* gate) {
    GatedComm::Policy p = GatePolicy(gate);
    p.hold = [](uint32_t) -> absl::Notification* { return nullptr; };
    if (rank != 0) return p;
    const auto posted = p.posted;
    p.posted = [posted, &shared](uint32_t tag) {
      posted(tag);
      if ((tag & kExchangeTagBits) == kExchangeTagBits && (tag & (1u << 28)) != 0 &&
          (tag & 0xfffff) == 2) {
        shared.Release(tag & kKeyMask);
      }
    };
    p.hold = [gate, &shared](uint32_t tag) -> absl::Notification* {
      if ((tag & kExchangeTagBits) != kExchangeTagBits || (tag & (1u << 28)) != 0) return nullptr;
      const uint32_t key = tag & kKeyMask, piece = tag & 0xfffff;
      if (piece == 2) return &gate->Released(key - 2);  // the model's backward pass returned
      if (piece == 0) return &shared.Released(key + 2);
      return nullptr;
    };
    const auto release_all = p.release_all;
    p.release_all = [release_all, &shared] {
      release_all();
      shared.ReleaseAll();
    };
    return p;
  };
  const std::vector<std::vector<float>> got =
      Train(2, 2, /*gated=*/true, /*replicated=*/true, policy);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].size(), want[0].size()) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(got[r].data(), want[0].data(), want[0].size() * sizeof(float)))
        << "rank " << r;
  }
}

}  // namespace
}  // namespace troupe::train
