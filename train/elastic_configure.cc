// ElasticRank's reconfiguration: Configure stages a new generation's state beside the committed
// one (from initialisation, the survivors' memory or a checkpoint) and Commit switches over —
// a step's commit is the same move.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "elastic_internal.h"
#include "troupe/base/status_macros.h"
#include "troupe/train/elastic.h"

namespace troupe::train {
namespace {

using collectives::Buffer;
using collectives::Work;
using elastic_internal::Buf;
using elastic_internal::kParamPiecesPerOldRank;
using elastic_internal::kTagMirrorM;
using elastic_internal::kTagMirrorP;
using elastic_internal::kTagMirrorV;
using elastic_internal::kTagMoveBase;
using elastic_internal::kTagParamMoveBase;
using elastic_internal::WaitAll;
using P2P = collectives::Communicator::PointToPoint;

// The new rank that sends old range o's pieces in a memory restore: its owner, else its buddy —
// else, where every rank held every range (`replicated`), the first survivor.
int SendingRank(const GenerationPlan& plan, int o, bool replicated) {
  const int owner = NewRank(plan.gone, o);
  if (owner >= 0) return owner;
  return replicated ? 0 : NewRank(plan.gone, BuddyRank(o, plan.old_buddy, plan.old_world));
}

}  // namespace

void ElasticRank::RankState::CopyPlacementFrom(const RankState& other) {
  layout = other.layout;
  rank = other.rank;
  buddy = other.buddy;
  stages = other.stages;
  steps = other.steps;
  units = other.units;
  held = other.held;
}

absl::Status ElasticRank::Configure(collectives::Communicator* comm, const GenerationPlan& plan,
                                    CheckpointStore* store, collectives::Communicator* host_comm) {
  // A step this rank staged and the coordinator recorded as committed, but whose commit message
  // never arrived (the coordinator died in between): apply it now. Anything else staged is
  // abandoned.
  if (staged_ == Staged::kStep && plan.source == RestoreSource::kMemory &&
      staged_state_.steps == plan.committed_steps) {
    Commit();
  }
  Abandon();
  commit_error_ = absl::OkStatus();  // the state is rebuilt from the plan's source
  comm_ = comm;
  host_comm_ = host_comm != nullptr ? host_comm : comm;
  TROUPE_RETURN_IF_ERROR(CheckPlan(*comm, plan));
  TROUPE_RETURN_IF_ERROR(StageGeneration(plan, store));
  const ShardLayout& to = staged_state_.layout;
  const float* range_params =
      to.end(plan.rank) > to.begin(plan.rank)
          ? staged_held_.data() + PackedOffset(staged_state_.my_held(), to.begin(plan.rank))
          : nullptr;
  std::vector<Work> mirror;
  TROUPE_RETURN_IF_ERROR(PostMirror(&staged_state_, range_params, &mirror));
  TROUPE_RETURN_IF_ERROR(WaitAll(mirror));
  staged_ = Staged::kConfig;
  return absl::OkStatus();
}

absl::Status ElasticRank::CheckPlan(const collectives::Communicator& comm,
                                    const GenerationPlan& plan) const {
  if (plan.rank < 0 || plan.rank >= plan.world || comm.size() != plan.world ||
      comm.rank() != plan.rank || host_comm_->size() != plan.world ||
      host_comm_->rank() != plan.rank) {
    return absl::InvalidArgumentError(absl::StrCat("configure: plan rank ", plan.rank, " of ",
                                                   plan.world, ", communicator rank ", comm.rank(),
                                                   " of ", comm.size(), ", host communicator rank ",
                                                   host_comm_->rank(), " of ", host_comm_->size()));
  }
  const int old_world = plan.old_world;
  if (!ValidBuddy(plan.buddy, plan.world) ||
      (plan.source == RestoreSource::kMemory && !ValidBuddy(plan.old_buddy, old_world))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "configure: buddy offsets: expected 1 <= buddy < world (1 for a world of one), got ",
        plan.buddy, " of ", plan.world, " (previous generation: ", plan.old_buddy, " of ",
        old_world, ")"));
  }
  if (plan.source == RestoreSource::kMemory) {
    bool sorted = true;
    for (size_t i = 0; i < plan.gone.size() && sorted; ++i) {
      sorted = plan.gone[i] >= (i == 0 ? 0 : plan.gone[i - 1] + 1) && plan.gone[i] < old_world;
    }
    if (!sorted || old_world - static_cast<int>(plan.gone.size()) > plan.world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "configure: gone ranks: expected increasing old ranks in [0, ", old_world,
          ") leaving at most ", plan.world, " kept, got [", absl::StrJoin(plan.gone, " "), "]"));
    }
  }
  if (plan.stages < 1 || plan.world % plan.stages != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("configure: pipeline stages: expected a divisor of the world size ",
                     plan.world, ", got ", plan.stages));
  }
  if (options_.replicate_optimizer && (plan.stages > 1 || !options_.deterministic ||
                                       &comm != host_comm_ || !ops_->host_accessible())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "configure: a replicated optimizer state needs deterministic data parallelism on the "
        "host communicator, got ",
        plan.stages, " pipeline stages, deterministic ", options_.deterministic ? "on" : "off",
        ", the model on ", model_->device().ToString(),
        &comm != host_comm_ ? " with a communicator of its own" : ""));
  }
  if (plan.stages > 1 && model_->staged() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("configure: ", plan.stages, " pipeline stages, but this model (on ",
                     model_->device().ToString(), ") cannot be cut into stages"));
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::StageGeneration(const GenerationPlan& plan, CheckpointStore* store) {
  restored_checkpoint_.reset();
  RankState& s = staged_state_;
  s.layout = ShardLayout::Make(model_->num_params(), plan.world);
  s.rank = plan.rank;
  s.buddy = plan.buddy;
  s.stages = plan.stages;
  s.steps = plan.committed_steps;
  s.units.clear();
  if (plan.stages > 1) {
    absl::StatusOr<std::vector<std::pair<int, int>>> units =
        PartitionUnits(model_->staged()->costs(), plan.stages);
    if (!units.ok()) return units.status();
    s.units = *std::move(units);
  }
  absl::StatusOr<std::vector<Ranges>> held = HeldRangesByRank(s.layout, plan.stages);
  if (!held.ok()) return held.status();
  s.held = *std::move(held);
  TROUPE_RETURN_IF_ERROR(ops_->Resize(&staged_held_, TotalSize(s.my_held())));
  switch (plan.source) {
    case RestoreSource::kInit:
      return StageFromInit();
    case RestoreSource::kCheckpoint:
      return RestoreFromCheckpoint(plan, store);
    case RestoreSource::kMemory:
      return RestoreFromMemory(plan);
  }
  return absl::InvalidArgumentError("configure: unknown restore source");
}

absl::Status ElasticRank::StageFromInit() {
  RankState& s = staged_state_;
  // Initialising writes the model's buffer: whatever this rank held is gone from here on.
  has_state_ = false;
  if (s.stages == 1) {
    model_->InitParams(options_.seed);
  } else {
    for (const auto& [b, e] : s.my_held()) model_->staged()->InitParamRange(options_.seed, b, e);
  }
  for (absl::Status e : {StageHeldFromModel(), ops_->Assign(&s.m, MomentsSize(s.layout), 0.0f),
                         ops_->Assign(&s.v, MomentsSize(s.layout), 0.0f)}) {
    if (!e.ok()) return e;
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::StageHeldFromModel() {
  const Ranges& held = staged_state_.my_held();
  for (const auto& [b, e] : held) {
    TROUPE_RETURN_IF_ERROR(
        ops_->Copy(staged_held_.data() + PackedOffset(held, b), model_->params() + b, e - b));
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::RestoreFromMemory(const GenerationPlan& plan) {
  if (!MemoryRestorePossible(plan.old_world, plan.gone, plan.old_buddy,
                             options_.replicate_optimizer)) {
    return absl::FailedPreconditionError(
        options_.replicate_optimizer ? "memory restore: no rank of the old world survives"
                                     : "memory restore: an old range has neither owner nor buddy");
  }
  TROUPE_RETURN_IF_ERROR(CheckSurvivor(plan));
  const ShardLayout from = ShardLayout::Make(model_->num_params(), plan.old_world);
  std::vector<P2P> moves;
  TROUPE_RETURN_IF_ERROR(AddParamMoves(plan, from, &moves));
  TROUPE_RETURN_IF_ERROR(options_.replicate_optimizer ? AddReplicatedMomentMoves(plan, &moves)
                                                      : AddMomentMoves(plan, from, &moves));
  return WaitAll(comm_->PostPointToPoint(moves, options_.collective));
}

absl::Status ElasticRank::AddReplicatedMomentMoves(const GenerationPlan& plan,
                                                   std::vector<P2P>* moves) {
  RankState& c = committed_state_;
  RankState& staged = staged_state_;
  const int64_t size = MomentsSize(staged.layout), n = model_->num_params();
  for (absl::Status s :
       {ops_->Assign(&staged.m, size, 0.0f), ops_->Assign(&staged.v, size, 0.0f)}) {
    if (!s.ok()) return s;
  }
  // Survivors keep their order and come first (NewRank): new ranks [0, kept) hold the state.
  const int kept = plan.old_world - static_cast<int>(plan.gone.size());
  const int64_t held = std::min<int64_t>(n, c.m.size());  // the real elements of a survivor's
  if (plan.rank < kept) {
    for (absl::Status s : {ops_->Copy(staged.m.data(), c.m.data(), held),
                           ops_->Copy(staged.v.data(), c.v.data(), held)}) {
      if (!s.ok()) return s;
    }
  }
  const P2P::Kind kind = plan.rank == 0 ? P2P::Kind::kSend : P2P::Kind::kRecv;
  for (int d = kept; d < plan.world; ++d) {
    if (plan.rank != 0 && plan.rank != d) continue;
    const int peer = plan.rank == 0 ? d : 0;
    float* m = plan.rank == 0 ? c.m.data() : staged.m.data();
    float* v = plan.rank == 0 ? c.v.data() : staged.v.data();
    moves->push_back({kind, Buffer::F32(m, static_cast<size_t>(n)), peer, kTagMoveBase});
    moves->push_back({kind, Buffer::F32(v, static_cast<size_t>(n)), peer, kTagMoveBase + 1});
  }
  return absl::OkStatus();
}

// Survivors must hold exactly the committed step (and mirror) the coordinator recorded; a rank
// without that state must not be named as an old rank.
absl::Status ElasticRank::CheckSurvivor(const GenerationPlan& plan) const {
  const RankState& c = committed_state_;
  const int old_world = plan.old_world;
  const bool survivor = has_state_ && c.layout.world == old_world && c.rank < old_world &&
                        NewRank(plan.gone, c.rank) == plan.rank;
  if (survivor && c.buddy != plan.old_buddy) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory restore: rank mirrors with buddy offset ", c.buddy,
                     ", the plan expects ", plan.old_buddy));
  }
  // The old rank the plan maps to this one: the rank-th kept one, each gone rank at or below the
  // candidate pushing it up by one.
  if (!survivor) {
    int named = plan.rank;
    for (int g : plan.gone) named += g <= named ? 1 : 0;
    if (named < old_world) {
      return absl::FailedPreconditionError(absl::StrCat(
          "memory restore: the plan names this rank as old rank ", named, ", but it holds ",
          has_state_ ? absl::StrCat("rank ", c.rank, " of ", c.layout.world) : "no state"));
    }
  }
  if (survivor && c.steps != plan.committed_steps) {
    return absl::FailedPreconditionError(absl::StrCat("memory restore: rank holds step ", c.steps,
                                                      ", the plan expects ", plan.committed_steps));
  }
  return absl::OkStatus();
}

// Parameters, piece by piece: each new rank's kept ranges ∩ each old range. An owner keeps its
// range's parameters; a buddy all of them (data parallelism) or its mirror of its owner's. A
// piece's tag is its old rank and its index in that old range's intersection: unique between two
// ranks, which is all point-to-point matching needs. So a rank visits only the pieces it sends
// (from the old ranges it holds: O(1) of them) or receives: O(W), not O(W²) under data
// parallelism, where every rank holds the whole model. Both ends list a pair's pieces by old rank.
absl::Status ElasticRank::AddParamMoves(const GenerationPlan& plan, const ShardLayout& from,
                                        std::vector<P2P>* moves) {
  RankState& c = committed_state_;
  const std::vector<Ranges>& held = staged_state_.held;
  std::vector<int> sent_from;  // the old ranks whose parameters this rank sends
  for (int o = 0; o < from.world; ++o) {
    if (SendingRank(plan, o, options_.replicate_optimizer) == plan.rank) sent_from.push_back(o);
  }
  // Every piece of new rank d's held ranges within old range o, as (lo, hi, tag).
  auto pieces = [&](int d, int o, auto&& each) -> absl::Status {
    uint32_t r = 0;
    for (const auto& [lo, hi] : Intersect(held[d], from.begin(o), from.end(o))) {
      if (r == kParamPiecesPerOldRank) {
        return absl::InternalError(absl::StrCat("memory restore: new rank ", d, " holds more than ",
                                                kParamPiecesPerOldRank, " pieces of old rank ", o));
      }
      TROUPE_RETURN_IF_ERROR(each(lo, hi, kTagParamMoveBase + o * kParamPiecesPerOldRank + r++));
    }
    return absl::OkStatus();
  };
  float* staged = staged_held_.data();
  for (int d = 0; d < static_cast<int>(held.size()); ++d) {
    for (int o : sent_from) {
      TROUPE_RETURN_IF_ERROR(pieces(d, o, [&](int64_t lo, int64_t hi, uint32_t tag) {
        float* p = NewRank(plan.gone, o) >= 0 || c.stages == 1
                       ? model_->params() + lo
                       : c.replica_p.data() + (lo - from.begin(o));
        if (d == plan.rank) return ops_->Copy(staged + PackedOffset(held[d], lo), p, hi - lo);
        moves->push_back({P2P::Kind::kSend, Buffer::F32(p, hi - lo), d, tag});
        return absl::OkStatus();
      }));
    }
  }
  for (int o = 0; o < from.world; ++o) {
    const int src = SendingRank(plan, o, options_.replicate_optimizer);
    if (src == plan.rank) continue;  // copied above
    TROUPE_RETURN_IF_ERROR(pieces(plan.rank, o, [&](int64_t lo, int64_t hi, uint32_t tag) {
      float* dst = staged + PackedOffset(held[plan.rank], lo);
      moves->push_back({P2P::Kind::kRecv, Buffer::F32(dst, hi - lo), src, tag});
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

// Moments, piece by piece: new range ∩ old range, from the old owner or its buddy's mirror.
absl::Status ElasticRank::AddMomentMoves(const GenerationPlan& plan, const ShardLayout& from,
                                         std::vector<P2P>* moves) {
  RankState& c = committed_state_;
  RankState& staged = staged_state_;
  const ShardLayout& to = staged.layout;
  for (absl::Status s :
       {ops_->Assign(&staged.m, to.per_rank, 0.0f), ops_->Assign(&staged.v, to.per_rank, 0.0f)}) {
    if (!s.ok()) return s;
  }
  uint32_t piece = 0;
  for (int d = 0; d < to.world; ++d) {
    if (to.begin(d) >= to.end(d)) continue;
    // Only the old ranges that overlap d's (the others make no piece): O(W) per rank, not O(W²).
    const int last =
        static_cast<int>(std::min<int64_t>(from.world - 1, (to.end(d) - 1) / from.per_rank));
    for (int o = static_cast<int>(to.begin(d) / from.per_rank); o <= last; ++o) {
      const int64_t lo = std::max(to.begin(d), from.begin(o));
      const int64_t hi = std::min(to.end(d), from.end(o));
      if (lo >= hi) continue;
      const bool from_owner = NewRank(plan.gone, o) >= 0;
      const int src = SendingRank(plan, o, false);
      const uint32_t tag = kTagMoveBase + 2 * piece++;
      const size_t count = static_cast<size_t>(hi - lo);
      float* dst_m = staged.m.data() + (lo - to.begin(d));
      float* dst_v = staged.v.data() + (lo - to.begin(d));
      if (src == plan.rank) {
#ifdef TROUPE_MUTATION_SKIP_BUDDY_MIRROR
        // The test-only bug (cmake -DTROUPE_MUTATION=skip-buddy-mirror) `troupe chaos run` must
        // catch: a restore skips the buddy's mirror and sends the buddy's own moments in its
        // place, so a shard restored from a mirror is wrong.
        constexpr bool kFromMirror = false;
#else
        constexpr bool kFromMirror = true;
#endif
        const bool mirror = kFromMirror && !from_owner;
        float* sm = (mirror ? c.replica_m.data() : c.m.data()) + (lo - from.begin(o));
        float* sv = (mirror ? c.replica_v.data() : c.v.data()) + (lo - from.begin(o));
        if (d == plan.rank) {
          for (absl::Status s : {ops_->Copy(dst_m, sm, count), ops_->Copy(dst_v, sv, count)}) {
            if (!s.ok()) return s;
          }
        } else {
          moves->push_back({P2P::Kind::kSend, Buffer::F32(sm, count), d, tag});
          moves->push_back({P2P::Kind::kSend, Buffer::F32(sv, count), d, tag + 1});
        }
      } else if (d == plan.rank) {
        moves->push_back({P2P::Kind::kRecv, Buffer::F32(dst_m, count), src, tag});
        moves->push_back({P2P::Kind::kRecv, Buffer::F32(dst_v, count), src, tag + 1});
      }
    }
  }
  return absl::OkStatus();
}

// The checkpoint's parameters (all of them) and the moments of this rank's new range, read on
// the host and copied in.
absl::Status ElasticRank::RestoreFromCheckpoint(const GenerationPlan& plan,
                                                CheckpointStore* store) {
  const int64_t n = model_->num_params();
  if (store == nullptr) return absl::FailedPreconditionError("checkpoint restore: no store");
  TROUPE_ASSIGN_OR_RETURN(Checkpoint ckpt, store->Load(plan.checkpoint_step));
  if (ckpt.manifest().num_params != n) {
    return absl::FailedPreconditionError(absl::StrCat(ckpt.dir(), ": num_params: expected ", n,
                                                      ", got ", ckpt.manifest().num_params));
  }
  restored_checkpoint_ = ckpt;
  RankState& staged = staged_state_;
  const ShardLayout& to = staged.layout;
  const Ranges& held = staged.my_held();
  std::vector<float> params(TotalSize(held));
  for (const auto& [lo, hi] : held) {
    TROUPE_RETURN_IF_ERROR(
        ckpt.ReadRange(lo, hi, params.data() + PackedOffset(held, lo), nullptr, nullptr));
  }
  const int64_t size = MomentsSize(to);
  std::vector<float> m(size, 0.0f), v(size, 0.0f);
  const int64_t b = options_.replicate_optimizer ? 0 : to.begin(plan.rank);
  const int64_t e = options_.replicate_optimizer ? n : to.end(plan.rank);
  if (e > b) {
    std::vector<float> scratch(e - b);
    TROUPE_RETURN_IF_ERROR(ckpt.ReadRange(b, e, scratch.data(), m.data(), v.data()));
  }
  for (absl::Status s : {ops_->Resize(&staged.m, size), ops_->Resize(&staged.v, size)}) {
    if (!s.ok()) return s;
  }
  for (absl::Status s : {ops_->CopyFromHost(staged_held_.data(), params.data(), params.size()),
                         ops_->CopyFromHost(staged.m.data(), m.data(), size),
                         ops_->CopyFromHost(staged.v.data(), v.data(), size)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::PostMirror(RankState* state, const float* p, std::vector<Work>* works) {
  const ShardLayout& layout = state->layout;
  const bool mirror_params = state->stages > 1;
  if (!mirror_params) state->replica_p = model::FloatArray();
  if (options_.replicate_optimizer) {  // every rank holds every range's moments: no mirror
    state->replica_m = model::FloatArray();
    state->replica_v = model::FloatArray();
    return absl::OkStatus();
  }
  if (layout.world == 1) {
    TROUPE_RETURN_IF_ERROR(ops_->Assign(&state->replica_m, layout.per_rank, 0.0f));
    return ops_->Assign(&state->replica_v, layout.per_rank, 0.0f);
  }
  // Written whole by the receives.
  for (model::FloatArray* a : {&state->replica_m, &state->replica_v}) {
    TROUPE_RETURN_IF_ERROR(ops_->Resize(a, layout.per_rank));
  }
  const int next = BuddyRank(state->rank, state->buddy, layout.world);
  const int prev = MirroredRank(state->rank, state->buddy, layout.world);
  std::vector<P2P> moves = {{P2P::Kind::kSend, Buf(state->m), next, kTagMirrorM},
                            {P2P::Kind::kSend, Buf(state->v), next, kTagMirrorV},
                            {P2P::Kind::kRecv, Buf(state->replica_m), prev, kTagMirrorM},
                            {P2P::Kind::kRecv, Buf(state->replica_v), prev, kTagMirrorV}};
  if (mirror_params) {
    TROUPE_RETURN_IF_ERROR(ops_->Resize(&state->replica_p, layout.per_rank));
    elastic_internal::AddRangeMirror(layout, state->rank, state->buddy, p, state->replica_p.data(),
                                     kTagMirrorP, &moves);
  }
  const std::vector<Work> posted = comm_->PostPointToPoint(moves, options_.collective);
  works->insert(works->end(), posted.begin(), posted.end());
  return absl::OkStatus();
}

void ElasticRank::Commit() {
  if (staged_ == Staged::kNone) return;
  const bool new_grid = staged_ == Staged::kConfig;
  staged_ = Staged::kNone;
  // A replicated state's step staged only its reduced gradient and scalars: its AdamW runs here,
  // on every parameter in place.
  const bool in_place = !new_grid && options_.replicate_optimizer;
  RankState& c = committed_state_;
  absl::Status s = in_place
                       ? ops_->AdamWUpdateRange(model_->tensors(), 0, model_->num_params(),
                                                model_->params(), grad_shard_.data(), c.m.data(),
                                                c.v.data(), options_.adamw, staged_scalars_,
                                                /*from=*/nullptr)
                       : CopyStagedParamsIntoModel();
  if (!s.ok()) {
    // The model's parameters are now neither the old nor the new state.
    has_state_ = false;
    commit_error_ = absl::Status(s.code(), absl::StrCat("commit: ", s.message()));
    return;
  }
  if (in_place) {
    c.steps = staged_state_.steps;
    return;
  }
  if (new_grid) DiscardUnheld();
  MoveStagedToCommitted(new_grid);
  has_state_ = true;
}

absl::Status ElasticRank::CopyStagedParamsIntoModel() {
  const Ranges& held = staged_state_.my_held();
  for (const auto& [b, e] : held) {
    TROUPE_RETURN_IF_ERROR(
        ops_->Copy(model_->params() + b, staged_held_.data() + PackedOffset(held, b), e - b));
  }
  return absl::OkStatus();
}

// A new generation's rank may keep fewer parameters: the model's parameters and gradients
// (which a stage writes only within its ranges) outside the kept ranges go back to the memory.
// A failure there only keeps the memory: nothing reads those ranges.
void ElasticRank::DiscardUnheld() {
  for (const auto& [b, e] : Complement(staged_state_.my_held(), model_->num_params())) {
    ops_->Discard(model_->params() + b, e - b).IgnoreError();
    ops_->Discard(const_cast<float*>(model_->grads()) + b, e - b).IgnoreError();
  }
}

// The move. A step's staged mirror is the committed one advanced (StageMirror), or, where the
// step advances none (a world of one, replicated moments), the committed one carried over; a
// configuration's mirror replaces the committed one. What the committed state held stays behind
// in staged_state_ as the next staging's buffers (m and v: a replicated step allocates none),
// except a replaced configuration's mirror, which is freed.
void ElasticRank::MoveStagedToCommitted(bool new_grid) {
  RankState& c = committed_state_;
  RankState& staged = staged_state_;
  if (!new_grid && !StepAdvancesMirror()) {
    staged.replica_p = std::move(c.replica_p);
    staged.replica_m = std::move(c.replica_m);
    staged.replica_v = std::move(c.replica_v);
  }
  std::swap(c, staged);
  if (options_.replicate_optimizer) {  // its steps stage no moments: the old ones are not kept
    staged.m = model::FloatArray();
    staged.v = model::FloatArray();
  }
  if (new_grid) {
    staged.replica_p = model::FloatArray();
    staged.replica_m = model::FloatArray();
    staged.replica_v = model::FloatArray();
  }
}

// Nothing reads staged_state_ while staged_ is kNone, and RunStep or Configure writes it whole
// before staging again; its buffers stay allocated for that.
void ElasticRank::Abandon() { staged_ = Staged::kNone; }

}  // namespace troupe::train
