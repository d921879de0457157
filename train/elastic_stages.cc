// ElasticRank on a pipeline grid (GenerationPlan::stages > 1): the stage's schedule of forwards
// and backwards (StageSchedule below), the exchange of the stages' gradient partials to the
// owners of the ranges, the share of the updated parameters to the ranks that keep them, and
// which parameters those are (HeldRanges, cached per generation in RankState::held).
//
// The schedule is a class of its own, file-local and one step long: its buffers, in-flight slots
// and pending tied gradients are the step's, so each named step of the schedule (Forward,
// Backward, DrainTied, ...) is a short method over them instead of one long function of lambdas.
// What outlives the step — the model's stage setting and the accumulators the exchange reads —
// stays in ElasticRank.
#include <algorithm>
#include <deque>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "elastic_internal.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/canonical_combine.h"
#include "troupe/train/elastic.h"

namespace troupe::train {
namespace {

using collectives::Buffer;
using collectives::Work;
using elastic_internal::Buf;
using elastic_internal::CombinePieces;
using elastic_internal::ExchangePiece;
using elastic_internal::kTagExchange;
using elastic_internal::kTagParamShare;
using elastic_internal::kTagPipelineBase;
using elastic_internal::Phase;
using elastic_internal::StepTagBits;
using elastic_internal::Stopwatch;
using elastic_internal::WaitAll;
using P2P = collectives::Communicator::PointToPoint;

// One step of one stage's schedule over its replica's microbatch block [lo, hi) (microbatch k of
// the schedule is lo + k of the step). Sends are never waited on before a receive (a 1F1B
// pipeline of blocking sends can deadlock); each send buffer is waited on before it is written
// again, and all of them before Run returns.
class StageSchedule {
 public:
  struct Context {
    Trainable* model;
    model::ArrayOps* ops;
    collectives::Communicator* comm;
    const ElasticRank::Options* options;
    std::vector<model::TreeAccumulator>* accs;  // one per gradient range, reset
  };
  struct Grid {
    GridPosition pos;
    int stages = 1;
    int world = 1;
  };
  // `block`: the replica's microbatches [lo, hi) of the step.
  StageSchedule(const Context& cx, int64_t step, std::pair<int32_t, int32_t> block, Grid grid,
                int slots, Ranges ranges, StepOutcome* out);

  // The schedule's operations, in order; then the tied gradients still pending and the sends.
  [[nodiscard]] absl::Status Run(const std::vector<PipelineOp>& ops);

 private:
  // A microbatch's tied gradient (the last stage's), waiting for the first stage's input gradient.
  struct Tied {
    int32_t k = 0;
    model::FloatArray grad, first_input_gradient;
    Work received;
  };

  [[nodiscard]] absl::Status Allocate();
  [[nodiscard]] absl::Status Forward(int32_t k);
  [[nodiscard]] absl::Status Backward(int32_t k);
  // The input gradient of microbatch k to the previous stage (the first stage's: to the last).
  [[nodiscard]] absl::Status SendInputGradient(int32_t k);
  // Keeps microbatch k's tied gradient and posts the receive of the first stage's input gradient.
  [[nodiscard]] absl::Status QueueTied(int32_t k);
  // Completes the tied gradients whose input gradient arrived (all of them with `wait`).
  [[nodiscard]] absl::Status DrainTied(bool wait);
  // The stage's gradient ranges into their accumulators: the untied ones from the model's
  // gradient (tied_grad null), else the tied ones from tied_grad (packed).
  [[nodiscard]] absl::Status AddLeaves(const float* tied_grad);
  // Times a call into the model as compute.
  template <class Call>
  auto Timed(Call&& call) {
    const Stopwatch compute;
    auto result = call();
    out_->compute_seconds += compute.Seconds();
    return result;
  }
  // Microbatch k's activation (kind 0), its gradient (1), and the first stage's input gradient
  // for the tied ranges (2); the step's low bits keep a stale message of an abandoned step from
  // matching.
  uint32_t Tag(int32_t k, uint32_t kind) const {
    return kTagPipelineBase | StepTagBits(step_) | (static_cast<uint32_t>(k) * 3 + kind);
  }
  int StageRank(int stage) const {
    return GridRank({grid_.pos.replica, stage}, grid_.world, grid_.stages);
  }

  const Context cx_;
  StagedTrainable* const st_;
  const int64_t step_;
  const int32_t lo_, hi_;
  const Grid grid_;
  const bool first_, last_;
  const int slots_;
  const Ranges ranges_;
  std::vector<bool> is_tied_;
  int64_t tied_size_ = 0;
  bool send_tied_ = false;
  const int64_t boundary_;
  const collectives::CollectiveOptions& copts_;
  StepOutcome* const out_;
  // Buffers, each with the send that reads it (waited on before it is written again).
  std::vector<model::FloatArray> act_in_;
  std::vector<Work> act_sent_;
  model::FloatArray grad_in_;
  model::FloatArray grad_out_[2];
  Work grad_sent_[2];
  std::deque<Tied> tied_;  // in microbatch order
  std::vector<int> free_slots_;
  std::vector<int> slot_of_;
  int in_flight_ = 0;
};

StageSchedule::StageSchedule(const Context& cx, int64_t step, std::pair<int32_t, int32_t> block,
                             Grid grid, int slots, Ranges ranges, StepOutcome* out)
    : cx_(cx),
      st_(cx.model->staged()),
      step_(step),
      lo_(block.first),
      hi_(block.second),
      grid_(grid),
      first_(grid.pos.stage == 0),
      last_(grid.pos.stage == grid.stages - 1),
      slots_(slots),
      ranges_(std::move(ranges)),
      is_tied_(ranges_.size(), false),
      boundary_(st_->boundary_size()),
      copts_(cx.options->collective),
      out_(out) {
  // The last stage's tied ranges (the GPT's wte) wait for the first stage's input gradient.
  const Ranges tied_ranges = st_->TiedRanges();
  for (size_t g = 0; g < ranges_.size() && last_; ++g) {
    is_tied_[g] =
        std::find(tied_ranges.begin(), tied_ranges.end(), ranges_[g]) != tied_ranges.end();
    if (is_tied_[g]) tied_size_ += ranges_[g].second - ranges_[g].first;
  }
  send_tied_ = first_ && !tied_ranges.empty();
}

absl::Status StageSchedule::Allocate() {
  act_in_.resize(first_ ? 0 : slots_);
  act_sent_.resize(slots_);
  for (model::FloatArray& a : act_in_) {
    TROUPE_RETURN_IF_ERROR(cx_.ops->Resize(&a, boundary_));
  }
  if (!last_) {
    TROUPE_RETURN_IF_ERROR(cx_.ops->Resize(&grad_in_, boundary_));
  }
  for (model::FloatArray& a : grad_out_) {
    TROUPE_RETURN_IF_ERROR(cx_.ops->Resize(&a, boundary_));
  }
  return absl::OkStatus();
}

absl::Status StageSchedule::Run(const std::vector<PipelineOp>& ops) {
  TROUPE_RETURN_IF_ERROR(Allocate());
  const Stopwatch schedule;
  for (int i = slots_ - 1; i >= 0; --i) free_slots_.push_back(i);
  slot_of_.assign(hi_ - lo_, -1);
  for (const PipelineOp& op : ops) {
    absl::Status e =
        op.kind == PipelineOp::Kind::kForward ? Forward(op.microbatch) : Backward(op.microbatch);
    if (e.ok()) e = DrainTied(false);
    if (!e.ok()) return e;
  }
  TROUPE_RETURN_IF_ERROR(DrainTied(true));
  std::vector<Work> sends(act_sent_.begin(), act_sent_.end());
  sends.insert(sends.end(), std::begin(grad_sent_), std::end(grad_sent_));
  if (absl::Status e = WaitAll(sends); !e.ok()) return Phase("pipeline: send", e);
  out_->schedule_seconds = schedule.Seconds();
  return absl::OkStatus();
}

absl::Status StageSchedule::Forward(int32_t k) {
  if (free_slots_.empty()) {
    return absl::InternalError(absl::StrCat("pipeline: stage ", grid_.pos.stage,
                                            " has no free slot for microbatch ", lo_ + k, " (",
                                            slots_, " in flight)"));
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  slot_of_[k] = slot;
  out_->max_in_flight = std::max(out_->max_in_flight, ++in_flight_);
  if (absl::Status e = act_sent_[slot].Wait(); !e.ok()) {
    return Phase("pipeline: activation send", e);
  }
  const float* input = nullptr;
  if (!first_) {
    if (absl::Status e =
            cx_.comm->Recv(Buf(act_in_[slot]), StageRank(grid_.pos.stage - 1), Tag(k, 0), copts_)
                .Wait();
        !e.ok()) {
      return Phase("pipeline: activation receive", e);
    }
    input = act_in_[slot].data();
  }
  if (first_ && cx_.options->on_serve) cx_.options->on_serve(step_, lo_ + k);
  absl::StatusOr<double> loss =
      Timed([&] { return st_->StageForward(step_, lo_ + k, slot, input); });
  if (!loss.ok()) return loss.status();
  if (last_) {
    out_->losses.emplace_back(lo_ + k, *loss);
  } else {
    act_sent_[slot] = cx_.comm->Send(
        Buffer::F32(const_cast<float*>(st_->StageOutput(slot)), static_cast<size_t>(boundary_)),
        StageRank(grid_.pos.stage + 1), Tag(k, 0), copts_);
  }
  return absl::OkStatus();
}

absl::Status StageSchedule::Backward(int32_t k) {
  const int slot = slot_of_[k];
  if (!last_) {
    if (absl::Status e =
            cx_.comm->Recv(Buf(grad_in_), StageRank(grid_.pos.stage + 1), Tag(k, 1), copts_).Wait();
        !e.ok()) {
      return Phase("pipeline: gradient receive", e);
    }
  }
  if (absl::Status e =
          Timed([&] { return st_->StageBackward(slot, last_ ? nullptr : grad_in_.data()); });
      !e.ok()) {
    return e;
  }
  free_slots_.push_back(slot);
  --in_flight_;
  if (!first_ || send_tied_) {
    TROUPE_RETURN_IF_ERROR(SendInputGradient(k));
  }
  TROUPE_RETURN_IF_ERROR(AddLeaves(nullptr));
  if (tied_size_ > 0) return QueueTied(k);
  return absl::OkStatus();
}

absl::Status StageSchedule::SendInputGradient(int32_t k) {
  model::FloatArray& buf = grad_out_[k % 2];
  if (absl::Status e = grad_sent_[k % 2].Wait(); !e.ok()) {
    return Phase("pipeline: gradient send", e);
  }
  TROUPE_RETURN_IF_ERROR(cx_.ops->Copy(buf.data(), st_->InputGradient(), boundary_));
  grad_sent_[k % 2] =
      first_ ? cx_.comm->Send(Buf(buf), StageRank(grid_.stages - 1), Tag(k, 2), copts_)
             : cx_.comm->Send(Buf(buf), StageRank(grid_.pos.stage - 1), Tag(k, 1), copts_);
  return absl::OkStatus();
}

absl::Status StageSchedule::QueueTied(int32_t k) {
  Tied t;
  t.k = k;
  for (absl::Status e : {cx_.ops->Resize(&t.grad, tied_size_),
                         cx_.ops->Resize(&t.first_input_gradient, boundary_)}) {
    if (!e.ok()) return e;
  }
  int64_t offset = 0;
  for (size_t g = 0; g < ranges_.size(); ++g) {
    if (!is_tied_[g]) continue;
    const int64_t len = ranges_[g].second - ranges_[g].first;
    TROUPE_RETURN_IF_ERROR(
        cx_.ops->Copy(t.grad.data() + offset, cx_.model->grads() + ranges_[g].first, len));
    offset += len;
  }
  t.received = cx_.comm->Recv(Buf(t.first_input_gradient), StageRank(0), Tag(k, 2), copts_);
  tied_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status StageSchedule::DrainTied(bool wait) {
  while (!tied_.empty() && (wait || tied_.front().received.IsDone())) {
    Tied& t = tied_.front();
    if (absl::Status e = t.received.Wait(); !e.ok()) {
      return Phase("pipeline: tied input gradient", e);
    }
    if (absl::Status e = Timed([&] {
          return st_->AddTiedGradient(step_, lo_ + t.k, t.first_input_gradient.data(),
                                      t.grad.data());
        });
        !e.ok()) {
      return e;
    }
    TROUPE_RETURN_IF_ERROR(AddLeaves(t.grad.data()));
    tied_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status StageSchedule::AddLeaves(const float* tied_grad) {
  int64_t offset = 0;
  for (size_t g = 0; g < ranges_.size(); ++g) {
    const float* leaf = cx_.model->grads() + ranges_[g].first;  // pointer arithmetic only
    if (is_tied_[g]) {
      if (tied_grad == nullptr) continue;
      leaf = tied_grad + offset;
      offset += ranges_[g].second - ranges_[g].first;
    } else if (tied_grad != nullptr) {
      continue;
    }
    TROUPE_RETURN_IF_ERROR((*cx_.accs)[g].Add(leaf));
  }
  return absl::OkStatus();
}

// A piece of the gradient exchange this rank combines: range [lo, hi) of its shard, and each
// replica's partial of it.
}  // namespace

namespace elastic_internal {

absl::Status CombinePieces(model::ArrayOps* ops, const collectives::CombinePlan& plan,
                           const std::vector<ExchangePiece>& pieces, float* shard,
                           int64_t shard_begin, std::vector<model::FloatArray>* inner) {
  using Kind = collectives::CombineOperand::Kind;
  if (inner->size() < static_cast<size_t>(plan.inner)) inner->resize(plan.inner);
  for (const ExchangePiece& piece : pieces) {
    const int64_t len = piece.hi - piece.lo;
    for (int t = 0; t < plan.inner; ++t) {
      model::FloatArray& a = (*inner)[t];
      if (a.size() < len) TROUPE_RETURN_IF_ERROR(ops->Resize(&a, len));
    }
    float* output = shard + (piece.lo - shard_begin);
    auto at = [&](const collectives::CombineOperand& o) -> float* {
      switch (o.kind) {
        case Kind::kPartial:
          return const_cast<float*>(piece.partial[o.index]);
        case Kind::kInner:
          return (*inner)[o.index].data();
        case Kind::kOutput:
          return output;
        case Kind::kNone:
          break;
      }
      return nullptr;
    };
    for (const collectives::CombineStep& c : plan.steps) {
      // dst is never a partial: x + y in one pass, or x copied where there is no y.
      if (c.y.kind != Kind::kNone) {
        TROUPE_RETURN_IF_ERROR(ops->Add(at(c.dst), at(c.x), at(c.y), len));
      } else if (at(c.dst) != at(c.x)) {
        TROUPE_RETURN_IF_ERROR(ops->Copy(at(c.dst), at(c.x), len));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace elastic_internal

// The exchange's point-to-point moves, the pieces they fill and the buffers they receive into.
struct ElasticRank::StageExchange {
  std::vector<P2P> moves;
  std::vector<ExchangePiece> pieces;
  std::vector<model::FloatArray> received;
};

absl::StatusOr<ElasticRank::Ranges> ElasticRank::HeldRanges(const ShardLayout& layout, int rank,
                                                            int stages) const {
  if (stages == 1) return Ranges{{0, model_->num_params()}};
  StagedTrainable* st = model_->staged();
  TROUPE_ASSIGN_OR_RETURN(auto units, PartitionUnits(st->costs(), stages));
  const GridPosition pos = GridPositionOf(rank, layout.world, stages);
  Ranges r = st->GradientRanges(units[pos.stage].first, units[pos.stage].second);
  if (pos.stage == 0) {
    for (const auto& t : st->TiedRanges()) r.push_back(t);
  }
  if (layout.end(rank) > layout.begin(rank)) r.emplace_back(layout.begin(rank), layout.end(rank));
  return Merged(std::move(r));
}

absl::StatusOr<std::vector<Ranges>> ElasticRank::HeldRangesByRank(const ShardLayout& layout,
                                                                  int stages) const {
  std::vector<Ranges> held;
  for (int d = 0; d < layout.world; ++d) {
    absl::StatusOr<Ranges> r = HeldRanges(layout, d, stages);
    if (!r.ok()) return r.status();
    held.push_back(*std::move(r));
  }
  return held;
}

absl::Status ElasticRank::SetModelStage(int stage, int slots, const Ranges& ranges) {
  const auto [first_unit, end_unit] = committed_state_.units[stage];
  const std::tuple<int, int, int> want{first_unit, end_unit, slots};
  if (model_stage_ == want) return absl::OkStatus();
  TROUPE_RETURN_IF_ERROR(model_->staged()->SetStage(first_unit, end_unit, slots));
  model_stage_ = want;
  stage_accs_.clear();
  for (const auto& [b, e] : ranges) stage_accs_.emplace_back(e - b, *ops_);
  stage_partials_.resize(ranges.size());
  return absl::OkStatus();
}

absl::Status ElasticRank::RunStageSchedule(int64_t step, int32_t lo, int32_t hi, GridPosition pos,
                                           StepOutcome* out) {
  const RankState& c = committed_state_;
  const std::vector<PipelineOp> ops = StageOps(options_.pipeline, c.stages, pos.stage, hi - lo);
  const int slots = std::max(1, MaxInFlight(ops));
  const auto [first_unit, end_unit] = c.units[pos.stage];
  const Ranges ranges = model_->staged()->GradientRanges(first_unit, end_unit);
  TROUPE_RETURN_IF_ERROR(SetModelStage(pos.stage, slots, ranges));
  for (model::TreeAccumulator& acc : stage_accs_) acc.Reset();
  StageSchedule schedule({model_, ops_, comm_, &options_, &stage_accs_}, step, {lo, hi},
                         {pos, c.stages, c.layout.world}, slots, ranges, out);
  TROUPE_RETURN_IF_ERROR(schedule.Run(ops));
  for (size_t g = 0; g < ranges.size(); ++g) {
    const int64_t len = ranges[g].second - ranges[g].first;
    TROUPE_RETURN_IF_ERROR(ops_->Resize(&stage_partials_[g], len));
    TROUPE_RETURN_IF_ERROR(stage_accs_[g].Finish(stage_partials_[g].data()));
  }
  return absl::OkStatus();
}

// Each stage's partials go to the owners of the ranges they cover; an owner combines the dp
// replicas' partials of each piece in the canonical tree over their microbatch blocks.
absl::Status ElasticRank::ExchangeStageGradients(
    int64_t step, const std::vector<std::pair<int32_t, int32_t>>& blocks, GridPosition pos) {
  const ShardLayout& layout = committed_state_.layout;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const auto& [lo, hi] : blocks) intervals.emplace_back(lo, hi);
  TROUPE_ASSIGN_OR_RETURN(collectives::CombinePlan plan,
                          collectives::PlanCanonicalCombine(intervals));
  const int64_t b = layout.begin(committed_state_.rank), e = layout.end(committed_state_.rank);
  TROUPE_RETURN_IF_ERROR(ops_->Resize(&grad_shard_, layout.per_rank));
  TROUPE_RETURN_IF_ERROR(ops_->Fill(grad_shard_.data() + (e - b), layout.per_rank - (e - b), 0.0f));
  StageExchange exchange;
  TROUPE_RETURN_IF_ERROR(PlanStageExchange(step, pos, &exchange));
  const std::vector<Work> posted = comm_->PostPointToPoint(exchange.moves, options_.collective);
  if (options_.on_point) options_.on_point(step, StepPoint::kExchange);
  if (absl::Status s = WaitAll(posted); !s.ok()) return Phase("pipeline gradient exchange", s);
  return CombinePieces(ops_, plan, exchange.pieces, grad_shard_.data(), b, &combine_inner_);
}

absl::Status ElasticRank::PlanStageExchange(int64_t step, GridPosition pos,
                                            StageExchange* exchange) {
  const RankState& c = committed_state_;
  const int p = c.stages, world = c.layout.world, dp = world / p;
  const int64_t b = c.layout.begin(c.rank), e = c.layout.end(c.rank);
  exchange->received.reserve(static_cast<size_t>(p) * 2 * dp);
  const uint32_t tag_base = kTagPipelineBase | kTagExchange | StepTagBits(step);
  for (int s = 0; s < p; ++s) {
    const Ranges ranges = model_->staged()->GradientRanges(c.units[s].first, c.units[s].second);
    for (size_t g = 0; g < ranges.size(); ++g) {
      const auto [rb, re] = ranges[g];
      const uint32_t tag = tag_base + static_cast<uint32_t>(g);
      // Sends: my partial of this range to every owner it overlaps.
      for (int owner = 0; owner < world && s == pos.stage; ++owner) {
        const int64_t lo = std::max(rb, c.layout.begin(owner)),
                      hi = std::min(re, c.layout.end(owner));
        if (lo >= hi || owner == c.rank) continue;
        exchange->moves.push_back({P2P::Kind::kSend,
                                   Buffer::F32(stage_partials_[g].data() + (lo - rb), hi - lo),
                                   owner, tag});
      }
      // Receives: every replica's partial of this range ∩ my shard.
      const int64_t lo = std::max(rb, b), hi = std::min(re, e);
      if (lo >= hi) continue;
      ExchangePiece piece{lo, hi, std::vector<const float*>(dp, nullptr)};
      for (int d = 0; d < dp; ++d) {
        const int src = GridRank({d, s}, world, p);
        if (src == c.rank) {
          piece.partial[d] = stage_partials_[g].data() + (lo - rb);
          continue;
        }
        model::FloatArray& buffer = exchange->received.emplace_back();
        TROUPE_RETURN_IF_ERROR(ops_->Resize(&buffer, hi - lo));
        piece.partial[d] = buffer.data();
        exchange->moves.push_back({P2P::Kind::kRecv, Buf(buffer), src, tag});
      }
      exchange->pieces.push_back(std::move(piece));
    }
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::SendStagedParams(int64_t step) {
  const RankState& c = committed_state_;
  const Ranges& held = c.my_held();  // StageAdamW staged my range there
  const int64_t b = c.layout.begin(c.rank), e = c.layout.end(c.rank);
  const uint32_t tag_base = kTagPipelineBase | kTagParamShare | StepTagBits(step);
  std::vector<P2P> moves;
  // Pieces between a pair are numbered in flat order on both sides.
  for (int d = 0; d < c.layout.world; ++d) {
    if (d == c.rank) continue;
    uint32_t piece = 0;
    for (const auto& [lo, hi] : Intersect(c.held[d], b, e)) {
      moves.push_back({P2P::Kind::kSend,
                       Buffer::F32(staged_held_.data() + PackedOffset(held, lo), hi - lo), d,
                       tag_base + piece++});
    }
  }
  for (int o = 0; o < c.layout.world; ++o) {
    if (o == c.rank) continue;
    uint32_t piece = 0;
    for (const auto& [lo, hi] : Intersect(held, c.layout.begin(o), c.layout.end(o))) {
      moves.push_back({P2P::Kind::kRecv,
                       Buffer::F32(staged_held_.data() + PackedOffset(held, lo), hi - lo), o,
                       tag_base + piece++});
    }
  }
  return WaitAll(comm_->PostPointToPoint(moves, options_.collective));
}

}  // namespace troupe::train
