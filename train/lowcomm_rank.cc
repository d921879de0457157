#include "troupe/train/lowcomm_rank.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "elastic_internal.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/compression.h"

namespace troupe::train {
namespace {

using collectives::Buffer;
using collectives::Work;
using P2P = collectives::Communicator::PointToPoint;

// Tags on the generation's communicator, between ranks of different groups (the outer exchange)
// or from a survivor to a rank that joins (the outer state): bits 27..30 set, which no other
// point-to-point tag of training sets together (elastic_internal.h, SubCommunicator).
// (The outer exchange's own: kOuterExchangeTag, lowcomm_rank.h.)
constexpr uint32_t kTagOuterState = 0x7c000000u;

Buffer Floats(std::vector<float>& v) { return Buffer::F32(v); }

}  // namespace

absl::StatusOr<GroupPlan> GroupPlanOf(const GenerationPlan& p) {
  if (static_cast<int>(p.groups.size()) != p.world ||
      (p.source == RestoreSource::kMemory &&
       static_cast<int>(p.old_groups.size()) != p.old_world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lowcomm: the plan names the groups of ", p.groups.size(), " of ", p.world,
                     " ranks and ", p.old_groups.size(), " of ", p.old_world, " old ones"));
  }
  GroupPlan g;
  g.group = p.groups[p.rank];
  const std::set<std::string> names(p.groups.begin(), p.groups.end());
  g.names.assign(names.begin(), names.end());
  g.index = static_cast<int>(std::distance(names.begin(), names.find(g.group)));
  for (const std::string& name : g.names) {
    g.leaders.push_back(
        static_cast<int>(std::find(p.groups.begin(), p.groups.end(), name) - p.groups.begin()));
  }
  for (int j = 0; j < p.world; ++j) {
    if (p.groups[j] == g.group) g.members.push_back(j);
  }
  g.plan = p;
  g.plan.world = static_cast<int>(g.members.size());
  g.plan.rank =
      static_cast<int>(std::find(g.members.begin(), g.members.end(), p.rank) - g.members.begin());
  g.plan.stages = 1;
  g.plan.buddy = 1;  // inside a group (one failure domain): the next rank
  g.plan.old_buddy = 1;
  g.plan.old_world = 0;
  g.plan.gone.clear();
  if (p.source != RestoreSource::kMemory) return g;
  // The group's old ranks in old order; the kept ones keep it and come first, as in the world.
  int old_members = 0, kept = 0;
  for (int o = 0; o < p.old_world; ++o) {
    if (p.old_groups[o] != g.group) continue;
    if (std::binary_search(p.gone.begin(), p.gone.end(), o)) {
      g.plan.gone.push_back(old_members);
    } else {
      ++kept;
    }
    ++old_members;
  }
  if (kept == 0) {  // none of it survived (or it never was): it starts from θ_global
    g.new_group = true;
    g.plan.source = RestoreSource::kInit;
    g.plan.gone.clear();
    return g;
  }
  g.plan.old_world = old_members;
  return g;
}

void LowCommRank::ResetFeedbackSums(Outer* o) {
  o->meant.assign(o->residual.begin(), o->residual.end());
  o->sent.assign(o->residual.size(), 0.0);
}

absl::Status LowCommRank::Configure(collectives::Communicator* world, const GenerationPlan& plan,
                                    CheckpointStore* store, collectives::Communicator* host_world) {
  // A step staged here whose commit never arrived but which the plan counts (ElasticRank::
  // Configure applies its part): its outer part with it.
  if (outer_staged_ && plan.source == RestoreSource::kMemory &&
      staged_steps_ == plan.committed_steps) {
    outer_ = std::move(staged_);
    has_outer_ = true;
  }
  outer_staged_ = false;
  // The owner has destroyed the old generation's communicator: nothing writes into a flight now.
  flights_.clear();
  staged_flights_.clear();
  retired_.clear();
  TROUPE_ASSIGN_OR_RETURN(group_, GroupPlanOf(plan));
  world_ = world;
  TROUPE_ASSIGN_OR_RETURN(group_comm_, collectives::SubCommunicator::Create(world, group_.members));
  group_host_.reset();
  if (host_world != nullptr) {
    TROUPE_ASSIGN_OR_RETURN(group_host_,
                            collectives::SubCommunicator::Create(host_world, group_.members));
  }
  TROUPE_RETURN_IF_ERROR(
      inner_->model()->SetDataStream(group_.index, static_cast<int32_t>(group_.names.size())));
  TROUPE_RETURN_IF_ERROR(
      inner_->Configure(group_comm_.get(), group_.plan, store, group_host_.get()));
  return StageOuterState(plan);
}

void LowCommRank::AddOuter(ShardView* shard) const {
  shard->outer_global = outer_.global.data() + shard->begin;
  shard->outer_momentum = outer_.momentum.data() + shard->begin;
}

// At the start or after a checkpoint (StageOuterState).
absl::Status LowCommRank::StageNewOuterState(const GenerationPlan& plan, float* params, int64_t n) {
  staged_.global.assign(params, params + n);
  staged_.momentum.assign(n, 0.0f);
  staged_.residual.assign(n, 0.0f);
  if (plan.source == RestoreSource::kCheckpoint) {
    const Checkpoint* ckpt = inner_->restored_checkpoint();
    if (ckpt == nullptr) {
      return absl::FailedPreconditionError("lowcomm: a checkpoint restore without a checkpoint");
    }
    if (ckpt->manifest().has_outer) {
      // The parameters stay the first group's (with fragments, those of a fragment not due at
      // this step are its local ones, as they were) — under stale_outer θ_global: the first
      // group's hold its own round in flight, which the checkpoint does not.
      TROUPE_RETURN_IF_ERROR(
          ckpt->ReadOuterRange(0, n, staged_.global.data(), staged_.momentum.data()));
      if (o_.lowcomm.stale_outer) std::copy(staged_.global.begin(), staged_.global.end(), params);
    }
  }
  staged_.base.assign(params, params + (o_.lowcomm.stale_outer ? n : 0));
  staged_.pending.assign(o_.lowcomm.fragments, {});
  ResetFeedbackSums(&staged_);
  outer_staged_ = true;
  return absl::OkStatus();
}

// The outer state of the generation, staged beside the inner one: a survivor's own; a joiner's
// from world rank 0 (θ_global, momentum; a survivor, as survivors come first) and its group's
// first survivor (the residual, and under stale_outer the round's start and the Δ in flight; a
// group that is new starts from θ_global with none); after a checkpoint its θ_global and
// momentum (a checkpoint without them: θ_global = the parameters, momentum zero) and residuals of
// zero; at the start θ_global = the initial parameters, the rest zero.
absl::Status LowCommRank::StageOuterState(const GenerationPlan& plan) {
  float* params = inner_->StagedParams();
  const int64_t n = inner_->model()->num_params();
  if (params == nullptr) {
    return absl::FailedPreconditionError("lowcomm: the staged parameters are not on the host");
  }
  // Staged (for Commit) only once whole; a staged configuration is never applied by a later
  // Configure (only a staged step whose commit was lost is).
  staged_steps_ = -1;
  if (plan.source != RestoreSource::kMemory) return StageNewOuterState(plan, params, n);
  const int kept = plan.old_world - static_cast<int>(plan.gone.size());
  const bool joiner = plan.rank >= kept;
  if (!joiner && !has_outer_) {
    return absl::FailedPreconditionError("lowcomm: a surviving rank without the outer state");
  }
  const bool stale = o_.lowcomm.stale_outer;
  if (joiner) {
    staged_.global.assign(n, 0.0f);
    staged_.momentum.assign(n, 0.0f);
    staged_.residual.assign(n, 0.0f);
    staged_.base.assign(stale ? n : 0, 0.0f);
    staged_.pending.assign(o_.lowcomm.fragments, {});
  } else {
    staged_ = outer_;
  }
  // The slots in flight travel whole (a presence flag of 0: none).
  std::vector<std::vector<float>> slots(stale ? o_.lowcomm.fragments : 0);
  for (size_t f = 0; f < slots.size(); ++f) {
    slots[f] = staged_.pending[f];
    slots[f].resize(SlotWords(static_cast<int32_t>(f)), 0.0f);
  }
  std::vector<P2P> moves;
  for (int j = kept; j < plan.world; ++j) {
    const int donor = [&] {  // j's group's first survivor, if any
      for (int r = 0; r < kept; ++r) {
        if (plan.groups[r] == plan.groups[j]) return r;
      }
      return -1;
    }();
    const P2P::Kind kind = j == plan.rank ? P2P::Kind::kRecv : P2P::Kind::kSend;
    if (plan.rank == 0 || j == plan.rank) {
      const int peer = j == plan.rank ? 0 : j;
      moves.push_back({kind, Floats(staged_.global), peer, kTagOuterState});
      moves.push_back({kind, Floats(staged_.momentum), peer, kTagOuterState + 1});
    }
    if (donor >= 0 && (plan.rank == donor || j == plan.rank)) {
      const int peer = j == plan.rank ? donor : j;
      moves.push_back({kind, Floats(staged_.residual), peer, kTagOuterState + 2});
      if (stale) moves.push_back({kind, Floats(staged_.base), peer, kTagOuterState + 3});
      for (size_t f = 0; f < slots.size(); ++f) {
        moves.push_back(
            {kind, Floats(slots[f]), peer, kTagOuterState + 4 + static_cast<uint32_t>(f)});
      }
    }
  }
  TROUPE_RETURN_IF_ERROR(elastic_internal::WaitAll(world_->PostPointToPoint(moves, o_.collective)));
  if (group_.new_group) {
    std::copy(staged_.global.begin(), staged_.global.end(), params);
    if (stale) staged_.base = staged_.global;
  } else if (joiner) {
    for (size_t f = 0; f < slots.size(); ++f) {
      if (slots[f][0] != 0.0f) staged_.pending[f] = std::move(slots[f]);
    }
  }
  if (joiner) ResetFeedbackSums(&staged_);
  outer_staged_ = true;
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> LowCommRank::RunStep(OuterSync* sync) {
  *sync = OuterSync{};
  outer_staged_ = false;
  for (auto& [f, flight] : staged_flights_) retired_.push_back(std::move(flight));  // a re-run's
  staged_flights_.clear();
  if (!has_outer_) return absl::FailedPreconditionError("lowcomm: RunStep before a configuration");
  const int64_t step = inner_->committed_steps();
  TROUPE_ASSIGN_OR_RETURN(StepOutcome out, inner_->RunStep());
  const std::vector<int32_t> due = FragmentsDueAfter(o_.lowcomm, step + 1, o_.total_steps);
  if (due.empty()) return out;
  float* params = inner_->StagedParams();
  if (params == nullptr) {
    return absl::FailedPreconditionError("lowcomm: the staged parameters are not on the host");
  }
  staged_ = outer_;
  for (int32_t f : due) TROUPE_RETURN_IF_ERROR(SyncFragment(step, f, params, sync));
  sync->fragments = due;
  outer_staged_ = true;
  staged_steps_ = step + 1;
  return out;
}

size_t LowCommRank::SlotWords(int32_t f) const {
  const auto [lo, hi] = FragmentRange(inner_->model()->num_params(), o_.lowcomm.fragments, f);
  // Every encoding is whole floats.
  return 1 + collectives::CompressedBytes(o_.lowcomm.compression, o_.lowcomm.topk_fraction,
                                          static_cast<size_t>(hi - lo)) /
                 sizeof(float);
}

// Fragment f: this group's Δ, encoded with its residual, into its slot; without stale_outer
// exchanged and applied at once, θ_global into the staged parameters. With it, the round in
// flight (posted where the last round ended; posted again when this generation's communicator is
// not the one it was posted on) is applied, this round's is posted, and the group goes on from
// θ_global − its own Δ — except after the job's last step, where this round's is applied too.
absl::Status LowCommRank::SyncFragment(int64_t step, int32_t f, float* params, OuterSync* sync) {
  const LowCommOptions& o = o_.lowcomm;
  const auto [lo, hi] = FragmentRange(inner_->model()->num_params(), o.fragments, f);
  const size_t count = static_cast<size_t>(hi - lo);
  const float* from = (o.stale_outer ? staged_.base.data() : staged_.global.data());
  std::vector<float> slot(SlotWords(f), 0.0f);
  slot[0] = 1.0f;  // present
  uint8_t* mine = reinterpret_cast<uint8_t*>(slot.data() + 1);
  EncodePseudoGradient(o, from + lo, params + lo, count, staged_.residual.data() + lo, mine);
  if (o.verify_feedback) {
    TROUPE_RETURN_IF_ERROR(VerifyFeedback(lo, hi, from, params, mine, sync));
  }
  if (f == 0 && o_.corrupt && o_.corrupt(step, group_.plan.rank == 0)) {
    std::vector<float> bad(count), none(count, 0.0f);
    for (size_t i = 0; i < count; ++i) bad[i] = 1000.0f * (from[lo + i] - params[lo + i]);
    collectives::EncodeWithFeedback(o.compression, o.topk_fraction, bad.data(), count, none.data(),
                                    mine);
  }
  if (o.stale_outer) {
    std::shared_ptr<Flight> last_round;
    if (auto it = flights_.find(f); it != flights_.end()) {
      last_round = it->second;
    } else {
      TROUPE_ASSIGN_OR_RETURN(last_round, PostAgain(f, sync));
    }
    TROUPE_RETURN_IF_ERROR(Finish(last_round, sync));
    TROUPE_RETURN_IF_ERROR(Apply(f, last_round->all, sync));
    if (step + 1 != o_.total_steps) {
      staged_flights_[f] = Post(f, slot, sync);
      staged_.pending[f] = std::move(slot);
      for (int64_t i = lo; i < hi; ++i) {
        params[i] = staged_.global[i] - (staged_.base[i] - params[i]);
        staged_.base[i] = params[i];
      }
      return absl::OkStatus();
    }
    staged_.pending[f].clear();
  }
  const std::shared_ptr<Flight> now = Post(f, slot, sync);
  TROUPE_RETURN_IF_ERROR(Finish(now, sync));
  TROUPE_RETURN_IF_ERROR(Apply(f, now->all, sync));
  std::copy(staged_.global.begin() + lo, staged_.global.begin() + hi, params + lo);
  if (o.stale_outer) std::copy(params + lo, params + hi, staged_.base.begin() + lo);
  return absl::OkStatus();
}

std::shared_ptr<LowCommRank::Flight> LowCommRank::Post(int32_t f, const std::vector<float>& slot,
                                                       OuterSync* sync,
                                                       const std::vector<float>* held) {
  auto flight = std::make_shared<Flight>();
  const size_t words = slot.size();
  const int groups = static_cast<int>(group_.names.size());
  const int me = group_.index;
  flight->all.assign(words * groups, 0.0f);
  std::copy(slot.begin(), slot.end(), flight->all.begin() + me * words);
  if (group_.plan.rank != 0) return flight;
  auto holds = [&](int g) { return held == nullptr || (*held)[g] != 0.0f; };
  std::vector<P2P> moves;
  const uint32_t tag = kOuterExchangeTag | static_cast<uint32_t>(f);
  for (int g = 0; g < groups; ++g) {
    if (g == me) continue;
    const int leader = group_.leaders[g];
    if (holds(me)) {
      moves.push_back(
          {P2P::Kind::kSend, Buffer::F32(flight->all.data() + me * words, words), leader, tag});
      sync->bytes_sent += words * sizeof(float);
    }
    if (holds(g)) {
      moves.push_back(
          {P2P::Kind::kRecv, Buffer::F32(flight->all.data() + g * words, words), leader, tag});
    }
  }
  Launch(flight.get(), moves);
  return flight;
}

// The leaders first tell each other whether they hold a Δ (one float each way: nothing more
// crosses when none does, as where the first round ends), then exchange the ones held.
absl::StatusOr<std::shared_ptr<LowCommRank::Flight>> LowCommRank::PostAgain(int32_t f,
                                                                            OuterSync* sync) {
  std::vector<float> slot = staged_.pending[f];
  slot.resize(SlotWords(f), 0.0f);  // none held: a flag of 0
  const int groups = static_cast<int>(group_.names.size());
  const int me = group_.index;
  std::vector<float> held(groups, 0.0f);
  held[me] = slot[0];
  if (group_.plan.rank == 0) {
    std::vector<P2P> moves;
    const uint32_t tag = kOuterExchangeTag | kOuterHeldTag | static_cast<uint32_t>(f);
    for (int g = 0; g < groups; ++g) {
      if (g == me) continue;
      moves.push_back({P2P::Kind::kSend, Buffer::F32(&held[me], 1), group_.leaders[g], tag});
      moves.push_back({P2P::Kind::kRecv, Buffer::F32(&held[g], 1), group_.leaders[g], tag});
    }
    const absl::Time start = base::MonotonicNow();
    TROUPE_RETURN_IF_ERROR(
        elastic_internal::WaitAll(world_->PostPointToPoint(moves, o_.collective)));
    sync->wait_seconds += absl::ToDoubleSeconds(base::MonotonicNow() - start);
  }
  return Post(f, slot, sync, &held);
}

// Without a deadline of their own: a flight may run for a whole round (Finish times the wait).
void LowCommRank::Launch(Flight* flight, const std::vector<P2P>& moves) {
  collectives::CollectiveOptions o = o_.collective;
  o.timeout = absl::InfiniteDuration();
  flight->works = world_->PostPointToPoint(moves, o);
  for (const P2P& m : moves) flight->peers.push_back(m.peer);
}

// The collective timeout counts from here, not from the post: a leader whose exchange is not done
// by then blames the peer it waits for and fails the generation's communicator (as a deadline
// inside it does).
absl::Status LowCommRank::Finish(const std::shared_ptr<Flight>& flight, OuterSync* sync) {
  const absl::Time start = base::MonotonicNow(), deadline = start + o_.collective.timeout;
  absl::Status s;
  for (size_t i = 0; i < flight->works.size() && s.ok(); ++i) {
    while (!flight->works[i].IsDone() && s.ok()) {
      if (base::MonotonicNow() > deadline) {
        s = collectives::BlamePeer(
            absl::DeadlineExceededError(
                absl::StrCat("lowcomm: the exchange with the group led by rank ", flight->peers[i],
                             " did not complete within ",
                             absl::FormatDuration(o_.collective.timeout), " of its wait")),
            flight->peers[i]);
        world_->Abort(s);
      } else {
        absl::SleepFor(absl::Microseconds(200));
      }
    }
  }
  if (s.ok()) s = elastic_internal::WaitAll(flight->works);
  if (s.ok()) s = group_comm_->Broadcast(Floats(flight->all), 0, o_.collective).Wait();
  sync->wait_seconds += absl::ToDoubleSeconds(base::MonotonicNow() - start);
  // A failed exchange's buffers live on until the communicator that may still write into them is
  // gone (the next Configure).
  if (!s.ok()) retired_.push_back(flight);
  return s;
}

absl::Status LowCommRank::Apply(int32_t f, const std::vector<float>& all, OuterSync* sync) {
  const auto [lo, hi] = FragmentRange(inner_->model()->num_params(), o_.lowcomm.fragments, f);
  const size_t words = SlotWords(f);
  std::vector<GroupUpdate> updates;
  for (size_t g = 0; g < group_.names.size(); ++g) {
    const float* slot = all.data() + g * words;
    if (slot[0] != 0.0f) {
      updates.push_back({static_cast<int32_t>(g), reinterpret_cast<const uint8_t*>(slot + 1)});
    }
  }
  TROUPE_ASSIGN_OR_RETURN(OuterOutcome out,
                          OuterStep(o_.lowcomm, updates, static_cast<size_t>(hi - lo),
                                    staged_.global.data() + lo, staged_.momentum.data() + lo));
  // The step's report: a group applied, clipped or left out in any fragment is named once; one
  // left out of any is not named applied.
  auto add = [&](const std::vector<int32_t>& ids, std::vector<std::string>* to) {
    for (int32_t id : ids) {
      if (std::find(to->begin(), to->end(), group_.names[id]) == to->end()) {
        to->push_back(group_.names[id]);
      }
    }
  };
  add(out.applied, &sync->applied);
  add(out.clipped, &sync->clipped);
  add(out.rejected, &sync->rejected);
  sync->applied.erase(std::remove_if(sync->applied.begin(), sync->applied.end(),
                                     [&](const std::string& name) {
                                       return std::find(sync->rejected.begin(),
                                                        sync->rejected.end(),
                                                        name) != sync->rejected.end();
                                     }),
                      sync->applied.end());
  std::sort(sync->applied.begin(), sync->applied.end());
  return absl::OkStatus();
}

absl::Status LowCommRank::VerifyFeedback(int64_t lo, int64_t hi, const float* from,
                                         const float* params, const uint8_t* mine,
                                         OuterSync* sync) {
  const LowCommOptions& o = o_.lowcomm;
  const size_t count = static_cast<size_t>(hi - lo);
  std::vector<float> decoded(count, 0.0f);
  collectives::DecodeAdd(o.compression, o.topk_fraction, mine, count, decoded.data());
  double worst = 0, scale = 0;
  int64_t at = lo;
  for (int64_t i = lo; i < hi; ++i) {
    staged_.meant[i] += from[i] - params[i];  // Δ as the encoding saw it
    staged_.sent[i] += decoded[i - lo];
    scale = std::max(scale, std::abs(staged_.meant[i]));
    const double off = std::abs(staged_.sent[i] + staged_.residual[i] - staged_.meant[i]);
    if (off > worst) worst = off, at = i;
  }
  const double error = scale > 0 ? worst / scale : 0;
  sync->feedback_error = std::max(sync->feedback_error, error);
  if (error <= 1e-5) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("lowcomm: error feedback lost ", worst, " at parameter ",
                                          at, " (", error, " of the largest sum): sent ",
                                          staged_.sent[at], " + residual ", staged_.residual[at],
                                          " != meant ", staged_.meant[at]));
}

void LowCommRank::Commit() {
  if (outer_staged_) {
    outer_ = std::move(staged_);
    has_outer_ = true;
    outer_staged_ = false;
  }
  for (auto& [f, flight] : staged_flights_) flights_[f] = std::move(flight);
  staged_flights_.clear();
  inner_->Commit();
}

void LowCommRank::Abandon() {
  outer_staged_ = false;
  for (auto& [f, flight] : staged_flights_) retired_.push_back(std::move(flight));
  staged_flights_.clear();
  inner_->Abandon();
}

}  // namespace troupe::train
