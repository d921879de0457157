// troupe/train/lowcomm_rank.h — one rank of a low-communication job (lowcomm.h): its group's data
// parallelism, an ElasticRank over the group's ranks of the generation's communicator
// (collectives::SubCommunicator), and the outer step across the groups.
//
// The generation's plan names every rank's group (GenerationPlan::groups: its failure domain;
// the groups in name order are the order of the outer sum). GroupPlanOf cuts the group's plan out
// of it: the group's ranks in world order, buddies inside the group, a memory restore from the
// group's own survivors. The outer state — θ_global, the outer momentum, and the group's
// error-feedback residual — is kept whole on every rank (identical across all ranks, the residual
// across the group's), so any survivor hands it to a rank that joins.
//
// A step (RunStep) is the group's inner step; after it, the fragments due (FragmentsDueAfter) are
// synchronised: every rank encodes its group's Δ with the residual (the same bits on every rank of
// a group), each group's first rank sends it to the other groups' first ranks and passes what
// they sent to its group, and every rank takes the same OuterStep and continues from θ_global.
// All of it is staged with the step: Commit applies it, Abandon drops it, so a step that fails
// anywhere — inside a group or across them — is re-run whole, with the groups the next
// generation has. Host memory only (a model on CUDA is refused by the job spec).
//
// stale_outer: the leaders' exchange of a round is posted where it ends and left running (a
// Flight) through the next round's inner steps; where that round ends it is waited for (the
// collective timeout counting from there) and applied. Every rank of a group keeps the group's
// encoded Δ of the round in flight (`pending`, part of the outer state a joiner is handed; a
// corrupt-update corrupts only what the leader sends), so after a generation change, whose
// communicator
// took the flights with it, the groups of the new generation exchange their pending Δ again: the
// round is applied with the groups that are in the generation where it is applied and have one
// (a group that joined has none). A checkpoint restore drops the round in flight: every group
// restarts from the checkpoint's θ_global.
#ifndef TROUPE_TRAIN_LOWCOMM_RANK_H_
#define TROUPE_TRAIN_LOWCOMM_RANK_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/collectives/communicator.h"
#include "troupe/collectives/sub_communicator.h"
#include "troupe/train/elastic.h"
#include "troupe/train/lowcomm.h"

namespace troupe::train {

// The leaders' outer exchange of fragment f: point-to-point tag kOuterExchangeTag | f, and with
// kOuterHeldTag set the one float before it that says whether a leader holds a Δ
// (LowCommRank::PostAgain).
inline constexpr uint32_t kOuterExchangeTag = 0x78000000u, kOuterHeldTag = 0x10000u;

// The group part of a generation's plan, for rank plan.rank.
struct GroupPlan {
  std::string group;         // its name
  int index = 0;             // its place in `names`: the order of the outer sum, its data stream
  std::vector<int> members;  // the group's world ranks, increasing
  std::vector<std::string> names;  // every group of the generation, in order
  std::vector<int> leaders;        // each one's first world rank, in that order
  GenerationPlan plan;  // the group's: rank = the index in members, world = members.size()
  // Every rank of the group is new to it: its parameters are θ_global (handed over), its inner
  // moments zero, its residual zero.
  bool new_group = false;
};
[[nodiscard]] absl::StatusOr<GroupPlan> GroupPlanOf(const GenerationPlan& plan);

// What a step's outer synchronisation did (empty `fragments`: none was due).
struct OuterSync {
  std::vector<int32_t> fragments;
  std::vector<std::string> applied, clipped, rejected;  // group names, in order
  uint64_t bytes_sent = 0;                              // by this rank to other groups' ranks
  // How long the step waited for the exchange between groups and its broadcast in the group:
  // the exposed part (stale_outer hides the rest behind the next round's inner steps).
  double wait_seconds = 0;
  // LowCommOptions::verify_feedback: the largest |Σ sent + residual − Σ Δ| / max |Σ Δ| so far
  // (-1: not checked).
  double feedback_error = -1;
};

class LowCommRank {
 public:
  struct Options {
    LowCommOptions lowcomm;
    int64_t total_steps = 0;                    // the job's: every fragment syncs after the last
    collectives::CollectiveOptions collective;  // timeout of the exchanges
    // Chaos (corrupt-update), asked by every rank in the sync that ends step `step` (`leads`:
    // this rank is its group's first, which sends): true when it is to send 1000 × its Δ (the
    // residual stays the true one's).
    std::function<bool(int64_t step, bool leads)> corrupt{};
  };
  LowCommRank(ElasticRank* inner, Options options) : inner_(inner), o_(std::move(options)) {}

  // Stages generation `plan` (plan.groups set) on the generation's communicators (all ranks;
  // `host_world` may be null as for ElasticRank::Configure), and the outer state: kept by a
  // survivor, handed to a rank that joins, from the checkpoint restored (θ_global and the outer
  // momentum; the residuals restart at zero), from the initial parameters at the start.
  [[nodiscard]] absl::Status Configure(collectives::Communicator* world, const GenerationPlan& plan,
                                       CheckpointStore* store,
                                       collectives::Communicator* host_world = nullptr);
  [[nodiscard]] absl::StatusOr<StepOutcome> RunStep(OuterSync* sync);
  void Commit();
  void Abandon();

  ElasticRank* inner() { return inner_; }
  const GroupPlan& group() const { return group_; }
  const std::vector<float>& global() const { return outer_.global; }
  // A checkpoint shard of this rank's committed state (ElasticRank::CommittedShard) also carries
  // the committed θ_global and outer momentum of its range.
  void AddOuter(ShardView* shard) const;

 private:
  struct Outer {
    std::vector<float> global, momentum, residual;
    // stale_outer: the parameters the group's current round started from, and per fragment the
    // group's slot (Post) of the round in flight, empty when there is none.
    std::vector<float> base;
    std::vector<std::vector<float>> pending;
    // verify_feedback: Σ Δ + the residual handed over, and Σ sent, since this rank's start.
    std::vector<double> meant, sent;
  };
  [[nodiscard]] absl::Status StageOuterState(const GenerationPlan& plan);
  [[nodiscard]] absl::Status StageNewOuterState(const GenerationPlan& plan, float* params,
                                                int64_t n);
  // The feedback check's sums start from the residual a rank starts with (handed over, or zero).
  static void ResetFeedbackSums(Outer* o);
  [[nodiscard]] absl::Status SyncFragment(int64_t step, int32_t f, float* params, OuterSync* sync);
  // The leaders' exchange of one fragment: every group's slot (a presence flag, then its encoded
  // Δ) in group order; a member posts nothing.
  struct Flight {
    std::vector<float> all;
    std::vector<collectives::Work> works;
    std::vector<int> peers;  // each work's
  };
  void Launch(Flight* flight, const std::vector<collectives::Communicator::PointToPoint>& moves);
  size_t SlotWords(int32_t f) const;  // of fragment f
  // `held` (PostAgain): each group's flag; a group whose flag is 0 sends and gets nothing.
  std::shared_ptr<Flight> Post(int32_t f, const std::vector<float>& slot, OuterSync* sync,
                               const std::vector<float>* held = nullptr);
  // stale_outer, where no flight of f is on this generation's communicator: the groups' held Δ
  // of the round in flight (staged_.pending), exchanged again.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Flight>> PostAgain(int32_t f, OuterSync* sync);
  // Waits for the leader's part and hands every slot to the whole group.
  [[nodiscard]] absl::Status Finish(const std::shared_ptr<Flight>& flight, OuterSync* sync);
  // The outer step on fragment f with the slots present in `all`, reported into `sync`.
  [[nodiscard]] absl::Status Apply(int32_t f, const std::vector<float>& all, OuterSync* sync);
  // verify_feedback over [lo, hi), after this group's encoding `mine` of Δ = from − params.
  [[nodiscard]] absl::Status VerifyFeedback(int64_t lo, int64_t hi, const float* from,
                                            const float* params, const uint8_t* mine,
                                            OuterSync* sync);

  ElasticRank* inner_;
  Options o_;
  collectives::Communicator* world_ = nullptr;
  std::unique_ptr<collectives::SubCommunicator> group_comm_, group_host_;
  GroupPlan group_;
  Outer outer_, staged_;
  // stale_outer: the exchanges in flight on this generation's communicator, by fragment (the
  // committed step's, and the staged step's); an abandoned step's kept until the communicator
  // they write into is gone (the next Configure).
  std::map<int32_t, std::shared_ptr<Flight>> flights_, staged_flights_;
  std::vector<std::shared_ptr<Flight>> retired_;
  bool has_outer_ = false, outer_staged_ = false;
  int64_t staged_steps_ = -1;  // the step count the staged outer state belongs to
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_LOWCOMM_RANK_H_
