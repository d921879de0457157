#include "troupe/train/lowcomm_rank.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "elastic_internal.h"
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
constexpr uint32_t kTagOuter = 0x78000000u, kTagOuterState = 0x7c000000u;

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

// The outer state of the generation, staged beside the inner one: a survivor's own; a joiner's
// from world rank 0 (θ_global, momentum; a survivor, as survivors come first) and its group's
// first survivor (the residual; zero in a group that is new); after a checkpoint its θ_global and
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
  if (plan.source != RestoreSource::kMemory) {
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
        // this step are its local ones, as they were).
        TROUPE_RETURN_IF_ERROR(
            ckpt->ReadOuterRange(0, n, staged_.global.data(), staged_.momentum.data()));
      }
    }
    ResetFeedbackSums(&staged_);
    outer_staged_ = true;
    return absl::OkStatus();
  }
  const int kept = plan.old_world - static_cast<int>(plan.gone.size());
  const bool joiner = plan.rank >= kept;
  if (!joiner && !has_outer_) {
    return absl::FailedPreconditionError("lowcomm: a surviving rank without the outer state");
  }
  if (joiner) {
    staged_.global.assign(n, 0.0f);
    staged_.momentum.assign(n, 0.0f);
    staged_.residual.assign(n, 0.0f);
  } else {
    staged_ = outer_;
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
      moves.push_back(
          {kind, Floats(staged_.residual), j == plan.rank ? donor : j, kTagOuterState + 2});
    }
  }
  TROUPE_RETURN_IF_ERROR(elastic_internal::WaitAll(world_->PostPointToPoint(moves, o_.collective)));
  if (group_.new_group) std::copy(staged_.global.begin(), staged_.global.end(), params);
  if (joiner) ResetFeedbackSums(&staged_);
  outer_staged_ = true;
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> LowCommRank::RunStep(OuterSync* sync) {
  *sync = OuterSync{};
  outer_staged_ = false;
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

// Fragment f: this group's Δ (encoded with its residual) to the other groups through their first
// ranks, everyone's to every rank of the group, the outer step, θ_global into the staged params.
absl::Status LowCommRank::SyncFragment(int64_t step, int32_t f, float* params, OuterSync* sync) {
  const LowCommOptions& o = o_.lowcomm;
  const auto [lo, hi] = FragmentRange(inner_->model()->num_params(), o.fragments, f);
  const size_t count = static_cast<size_t>(hi - lo);
  const size_t bytes = collectives::CompressedBytes(o.compression, o.topk_fraction, count);
  const size_t words = bytes / sizeof(float);  // every encoding is whole floats
  const int groups = static_cast<int>(group_.names.size());
  const int me = group_.index;
  std::vector<float> all(words * groups);
  auto slot = [&](int g) { return reinterpret_cast<uint8_t*>(all.data() + g * words); };
  EncodePseudoGradient(o, staged_.global.data() + lo, params + lo, count,
                       staged_.residual.data() + lo, slot(me));
  if (o.verify_feedback) TROUPE_RETURN_IF_ERROR(VerifyFeedback(lo, hi, params, slot(me), sync));
  if (f == 0 && o_.corrupt && o_.corrupt(step, group_.plan.rank == 0)) {
    std::vector<float> bad(count), none(count, 0.0f);
    for (size_t i = 0; i < count; ++i) bad[i] = 1000.0f * (staged_.global[lo + i] - params[lo + i]);
    collectives::EncodeWithFeedback(o.compression, o.topk_fraction, bad.data(), count, none.data(),
                                    slot(me));
  }
  if (group_.plan.rank == 0) {
    std::vector<P2P> moves;
    for (int g = 0; g < groups; ++g) {
      if (g == me) continue;
      const int leader = group_.leaders[g];
      moves.push_back({P2P::Kind::kSend, Buffer::F32(all.data() + me * words, words), leader,
                       kTagOuter | static_cast<uint32_t>(f)});
      moves.push_back({P2P::Kind::kRecv, Buffer::F32(all.data() + g * words, words), leader,
                       kTagOuter | static_cast<uint32_t>(f)});
      sync->bytes_sent += bytes;
    }
    TROUPE_RETURN_IF_ERROR(
        elastic_internal::WaitAll(world_->PostPointToPoint(moves, o_.collective)));
  }
  TROUPE_RETURN_IF_ERROR(group_comm_->Broadcast(Floats(all), 0, o_.collective).Wait());
  std::vector<GroupUpdate> updates;
  for (int g = 0; g < groups; ++g) updates.push_back({g, slot(g)});
  TROUPE_ASSIGN_OR_RETURN(OuterOutcome out, OuterStep(o, updates, count, staged_.global.data() + lo,
                                                      staged_.momentum.data() + lo));
  std::copy(staged_.global.begin() + lo, staged_.global.begin() + hi, params + lo);
  // The step's report: a group clipped or left out in any fragment is named once.
  auto add = [&](const std::vector<int32_t>& ids, std::vector<std::string>* to) {
    for (int32_t id : ids) {
      if (std::find(to->begin(), to->end(), group_.names[id]) == to->end()) {
        to->push_back(group_.names[id]);
      }
    }
  };
  add(out.clipped, &sync->clipped);
  add(out.rejected, &sync->rejected);
  sync->applied.clear();
  for (const std::string& name : group_.names) {
    if (std::find(sync->rejected.begin(), sync->rejected.end(), name) == sync->rejected.end()) {
      sync->applied.push_back(name);
    }
  }
  return absl::OkStatus();
}

absl::Status LowCommRank::VerifyFeedback(int64_t lo, int64_t hi, const float* params,
                                         const uint8_t* mine, OuterSync* sync) {
  const LowCommOptions& o = o_.lowcomm;
  const size_t count = static_cast<size_t>(hi - lo);
  std::vector<float> decoded(count, 0.0f);
  collectives::DecodeAdd(o.compression, o.topk_fraction, mine, count, decoded.data());
  double worst = 0, scale = 0;
  int64_t at = lo;
  for (int64_t i = lo; i < hi; ++i) {
    staged_.meant[i] += staged_.global[i] - params[i];  // Δ as the encoding saw it
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
  inner_->Commit();
}

void LowCommRank::Abandon() {
  outer_staged_ = false;
  inner_->Abandon();
}

}  // namespace troupe::train
