// ElasticRank's data-parallel step (RunStep and its phases) and the readers of its committed
// state. The pipeline grid's schedule and exchange are in elastic_stages.cc, reconfiguration and
// Commit in elastic_configure.cc.
#include "troupe/train/elastic.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "elastic_internal.h"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/crc32c.h"
#include "troupe/model/tree_sum.h"

namespace troupe::train {

namespace elastic_internal {

absl::Status Phase(const char* phase, const absl::Status& s) {
  absl::Status out(s.code(), absl::StrCat(phase, ": ", s.message()));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::Status WaitAll(const std::vector<collectives::Work>& works) {
  absl::Status first;
  for (const collectives::Work& w : works) {
    absl::Status s = w.Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

void AddRangeMirror(const ShardLayout& layout, int rank, int buddy, const float* mine,
                    float* theirs, uint32_t tag,
                    std::vector<collectives::Communicator::PointToPoint>* moves) {
  using P2P = collectives::Communicator::PointToPoint;
  const int prev = MirroredRank(rank, buddy, layout.world);
  const int64_t send = layout.end(rank) - layout.begin(rank);
  const int64_t receive = layout.end(prev) - layout.begin(prev);
  if (send > 0) {
    moves->push_back({P2P::Kind::kSend, collectives::Buffer::F32(const_cast<float*>(mine), send),
                      BuddyRank(rank, buddy, layout.world), tag});
  }
  if (receive > 0) {
    moves->push_back({P2P::Kind::kRecv, collectives::Buffer::F32(theirs, receive), prev, tag});
  }
}

}  // namespace elastic_internal

namespace {

using collectives::Buffer;
using collectives::Work;
using elastic_internal::Buf;
using elastic_internal::kTagCrc;
using elastic_internal::kTagMirrorGrad;
using elastic_internal::Phase;
using elastic_internal::Stopwatch;

constexpr int64_t kChunk = kernels::kNormChunk;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

ElasticRank::ElasticRank(Trainable* model, Options options)
    : model_(model), ops_(&model->array_ops()), options_(std::move(options)) {}

ShardView HostShard::view() const {
  const int64_t count = end - begin;
  return {begin, end, data.data(), data.data() + count, data.data() + 2 * count};
}

absl::StatusOr<HostShard> ElasticRank::CommittedShardOnHost() const {
  const RankState& c = committed_state_;
  HostShard out;
  out.begin = c.layout.begin(c.rank);
  out.end = c.layout.end(c.rank);
  const int64_t count = out.end - out.begin;
  out.data.resize(3 * count);
  if (count == 0) return out;
  const float* p = model_->params() + out.begin;  // pointer arithmetic only: device memory
  const int64_t at = MomentsOffset(c);
  for (const auto& [src, dst] :
       {std::pair{p, 0}, std::pair{c.m.data() + at, 1}, std::pair{c.v.data() + at, 2}}) {
    TROUPE_RETURN_IF_ERROR(ops_->CopyToHost(out.data.data() + dst * count, src, count));
  }
  return out;
}

absl::StatusOr<ShardView> ElasticRank::CommittedShard(HostShard* copy) const {
  if (!ops_->host_accessible()) {
    absl::StatusOr<HostShard> copied = CommittedShardOnHost();
    if (!copied.ok()) return copied.status();
    *copy = *std::move(copied);
    return copy->view();
  }
  const RankState& c = committed_state_;
  const int64_t b = c.layout.begin(c.rank), e = c.layout.end(c.rank);
  const int64_t at = MomentsOffset(c);
  return ShardView{b, e, model_->params() + b, c.m.data() + at, c.v.data() + at};
}

absl::StatusOr<std::vector<float>> ElasticRank::ParamsOnHost() {
  const int64_t n = model_->num_params();
  std::vector<float> out(n);
  if (committed_state_.stages == 1) {
    TROUPE_RETURN_IF_ERROR(ops_->CopyToHost(out.data(), model_->params(), n));
    return out;
  }
  // A grid: each owner's committed range, gathered — straight from the model's buffer and into
  // `out` where the memory allows (no copy of the model beside the one returned).
  const ShardLayout& layout = committed_state_.layout;
  const int64_t b = layout.begin(committed_state_.rank), e = layout.end(committed_state_.rank);
  Buffer send = Buffer::F32(model_->params() + b, static_cast<size_t>(layout.per_rank));
  model::FloatArray padded, all;
  if (e - b < layout.per_rank) {  // the last ranges: padding
    for (absl::Status s : {ops_->Assign(&padded, layout.per_rank, 0.0f),
                           ops_->Copy(padded.data(), model_->params() + b, e - b)}) {
      if (!s.ok()) return s;
    }
    send = Buf(padded);
  }
  const bool direct = ops_->host_accessible();
  out.resize(layout.padded());
  if (!direct) {
    TROUPE_RETURN_IF_ERROR(ops_->Resize(&all, layout.padded()));
  }
  const Buffer receive = direct ? Buffer::F32(out.data(), out.size()) : Buf(all);
  if (absl::Status s = comm_->AllGather(send, receive, options_.collective).Wait(); !s.ok()) {
    return Phase("parameter gather", s);
  }
  if (!direct) {
    TROUPE_RETURN_IF_ERROR(ops_->CopyToHost(out.data(), all.data(), n));
  }
  out.resize(n);
  return out;
}

absl::StatusOr<uint32_t> ElasticRank::ParamsCrc32c() {
  // Extends crc over committed parameters [lo, hi): in place on the host, else through a bounded
  // host buffer.
  auto extend = [this](uint32_t crc, int64_t lo, int64_t hi) -> absl::StatusOr<uint32_t> {
    if (ops_->host_accessible()) {
      return model::Crc32cExtend(crc, model_->params() + lo, (hi - lo) * sizeof(float));
    }
    std::vector<float> chunk(std::min<int64_t>(hi - lo, int64_t{1} << 20));
    for (int64_t at = lo; at < hi; at += static_cast<int64_t>(chunk.size())) {
      const int64_t len = std::min<int64_t>(static_cast<int64_t>(chunk.size()), hi - at);
      TROUPE_RETURN_IF_ERROR(ops_->CopyToHost(chunk.data(), model_->params() + at, len));
      crc = model::Crc32cExtend(crc, chunk.data(), len * sizeof(float));
    }
    return crc;
  };
  const RankState& c = committed_state_;
  if (c.stages == 1) return extend(0, 0, model_->num_params());
  // The CRC's 32 bits travel as one float's (the transports copy bytes).
  uint32_t crc = 0;
  const Buffer word = Buffer::F32(reinterpret_cast<float*>(&crc), 1);
  const collectives::CollectiveOptions& o = options_.collective;
  if (c.rank > 0) {
    if (absl::Status s = host_comm_->Recv(word, c.rank - 1, kTagCrc, o).Wait(); !s.ok()) {
      return Phase("parameter CRC", s);
    }
  }
  TROUPE_ASSIGN_OR_RETURN(uint32_t mine, extend(crc, c.layout.begin(c.rank), c.layout.end(c.rank)));
  crc = mine;
  if (c.rank + 1 < c.layout.world) {
    if (absl::Status s = host_comm_->Send(word, c.rank + 1, kTagCrc, o).Wait(); !s.ok()) {
      return Phase("parameter CRC", s);
    }
  }
  if (absl::Status s = host_comm_->Broadcast(word, c.layout.world - 1, o).Wait(); !s.ok()) {
    return Phase("parameter CRC", s);
  }
  return crc;
}

float* ElasticRank::StagedParams() {
  const RankState& s = staged_state_;
  // A replicated state's step stages no parameters: Commit updates them in place.
  if (staged_ == Staged::kNone || s.stages != 1 || model_->device().is_cuda() ||
      (staged_ == Staged::kStep && options_.replicate_optimizer) ||
      staged_held_.size() < model_->num_params()) {
    return nullptr;
  }
  return staged_held_.data();
}

absl::StatusOr<StepOutcome> ElasticRank::RunStep() {
  if (!commit_error_.ok()) return commit_error_;
  if (!has_state_) return absl::FailedPreconditionError("RunStep before a configuration committed");
  Abandon();
  const RankState& c = committed_state_;
  const int64_t step = c.steps;
  TROUPE_ASSIGN_OR_RETURN(auto blocks,
                          MicrobatchBlocks(options_.microbatches, c.layout.world / c.stages));
  StepOutcome out;
  Stopwatch collective;  // restarted before each collective phase
  auto collected = [&] { out.collective_seconds += collective.Seconds(); };
  if (c.stages == 1 && options_.deterministic) {
    out.block_size = blocks[c.rank].second - blocks[c.rank].first;
    TROUPE_RETURN_IF_ERROR(RunOverlappedStep(step, blocks, &out));
    staged_ = Staged::kStep;
    staged_state_.CopyPlacementFrom(c);
    staged_state_.steps = step + 1;
    return out;
  }
  if (c.stages == 1) {
    const auto [lo, hi] = blocks[c.rank];
    out.block_size = hi - lo;
    TROUPE_RETURN_IF_ERROR(AccumulateSubtree(step, lo, hi, &out, nullptr));
    collective = Stopwatch();
    TROUPE_RETURN_IF_ERROR(ReduceScatterGradient(step));
    collected();
  } else {
    const GridPosition pos = GridPositionOf(c.rank, c.layout.world, c.stages);
    const auto [lo, hi] = blocks[pos.replica];
    out.block_size = hi - lo;
    TROUPE_RETURN_IF_ERROR(RunStageSchedule(step, lo, hi, pos, &out));
    collective = Stopwatch();
    TROUPE_RETURN_IF_ERROR(ExchangeStageGradients(step, blocks, pos));
    collected();
  }
  collective = Stopwatch();
  TROUPE_ASSIGN_OR_RETURN(double grad_norm, GlobalGradNorm());
  collected();
  out.grad_norm = grad_norm;
  const Stopwatch update;
  TROUPE_RETURN_IF_ERROR(StageAdamW(step, out.grad_norm));
  out.update_seconds += update.Seconds();
  collective = Stopwatch();
  TROUPE_RETURN_IF_ERROR(ShareStagedState(step));
  collected();
  staged_ = Staged::kStep;
  staged_state_.CopyPlacementFrom(c);
  staged_state_.steps = step + 1;
  return out;
}

// This rank's subtree of the canonical gradient sum, at subtree_ (into partial_): with `ready`,
// the last microbatch's gradient is finished range by range as the model reports its ranges final
// (each passed on to `ready`), the rest when ComputeGradientReporting returns — the same additions
// as adding it and finishing the tree. With `ready` and one microbatch (DDP's usual step, no
// accumulation) on the host the subtree is that microbatch's gradient, bit for bit: subtree_
// points at the model's gradient and nothing is copied (the copy took 1.5 % of a 20M rank's CPU
// in a perf profile of bench/compare-multihost's 10 ms cell; partial_ stays allocated).
absl::Status ElasticRank::AccumulateSubtree(
    int64_t step, int32_t lo, int32_t hi, StepOutcome* out,
    const std::function<void(int64_t begin, int64_t end)>& ready) {
  const int64_t n = model_->num_params();
  const int64_t padded = committed_state_.layout.padded();
  if (!acc_) acc_.emplace(n, *ops_);
  acc_->Reset();  // a failed step may have left leaves
  TROUPE_RETURN_IF_ERROR(ops_->Resize(&partial_, padded));
  // (On a device the copy is what orders the range's exchange after the model's stream: the
  // trainer's first use of a range waits for it, gpt_device_trainable.h.)
  const bool in_place = ready && hi - lo == 1 && ops_->host_accessible();
  subtree_ = partial_.data();
  Ranges finished;
  absl::Status finish;
  auto finish_range = [&](int64_t b, int64_t e) {
    if (!finish.ok()) return;
    const bool overlaps = std::any_of(finished.begin(), finished.end(),
                                      [&](const auto& r) { return b < r.second && r.first < e; });
    if (b == e) return;  // nothing reported
    if (b < 0 || e > n || b > e || overlaps) {
      finish =
          absl::InvalidArgumentError(absl::StrCat("the model reported gradient range [", b, ", ", e,
                                                  ") final: expected a non-empty range "
                                                  "inside [0, ",
                                                  n, ") not reported before"));
      return;
    }
    if (in_place) {
      subtree_ = model_->grads();
    } else {
      finish = acc_->FinishRangeWith(model_->grads(), b, e, partial_.data());
      if (!finish.ok()) return;
    }
    finished.emplace_back(b, e);
    if (ready) ready(b, e);
  };
  const Stopwatch schedule;
  for (int32_t k = lo; k < hi; ++k) {
    if (options_.on_serve) options_.on_serve(step, k);
    const bool last = k + 1 == hi;
    const Stopwatch compute;
    absl::StatusOr<double> loss = model_->ComputeGradientReporting(
        step, k,
        // Reported ranges pay off only where the caller sends them on (the overlapped exchange);
        // on a device each finish waits for the model's stream.
        last && ready ? Trainable::GradientReady(finish_range) : Trainable::GradientReady());
    out->compute_seconds += compute.Seconds();
    out->schedule_seconds = schedule.Seconds();
    if (!loss.ok()) return loss.status();
    TROUPE_RETURN_IF_ERROR(finish);
    out->losses.emplace_back(k, *loss);
    if (!last) TROUPE_RETURN_IF_ERROR(acc_->Add(model_->grads()));
  }
  // What the model did not report, in flat order.
  Ranges reported = finished;
  std::sort(reported.begin(), reported.end());
  int64_t at = 0;
  for (const auto& [b, e] : reported) {
    if (at < b) finish_range(at, b);
    at = e;
  }
  if (at < n) finish_range(at, n);
  acc_->Reset();
  TROUPE_RETURN_IF_ERROR(finish);
  return ops_->Fill(partial_.data() + n, padded - n, 0.0f);
}

// The communicator's fastest reduce-scatter of the partials (single copy on one host, else the
// ring): the step gradient of my range into grad_shard_, to float tolerance.
absl::Status ElasticRank::ReduceScatterGradient(int64_t step) {
  collectives::CollectiveOptions fast = options_.collective;
  fast.algorithm = collectives::Algorithm::kAuto;
  // Written whole by the reduce-scatter.
  TROUPE_RETURN_IF_ERROR(ops_->Resize(&grad_shard_, committed_state_.layout.per_rank));
  Work exchange =
      comm_->ReduceScatter(Buf(partial_), Buf(grad_shard_), collectives::ReduceOp::kSum, fast);
  if (options_.on_point) options_.on_point(step, StepPoint::kExchange);
  if (absl::Status s = exchange.Wait(); !s.ok()) return Phase("gradient reduce-scatter", s);
  return absl::OkStatus();
}

// Global gradient norm over the real chunks, in a fixed tree.
absl::StatusOr<double> ElasticRank::GlobalGradNorm() {
  const int64_t n = model_->num_params();
  const ShardLayout& layout = committed_state_.layout;
  const int64_t b = layout.begin(committed_state_.rank), e = layout.end(committed_state_.rank);
  const int64_t chunks_per_rank = layout.per_rank / kChunk;
  std::vector<double> mine(chunks_per_rank, 0.0);
  if (e > b) {
    TROUPE_ASSIGN_OR_RETURN(std::vector<double> sums,
                            ops_->RangeChunkSquareSums(grad_shard_.data(), b, e, n));
    std::copy(sums.begin(), sums.end(), mine.begin());
  }
  return GradNormFromChunkSums(mine);
}

absl::StatusOr<double> ElasticRank::GradNormFromChunkSums(std::vector<double>& mine) {
  std::vector<double> all(mine.size() * committed_state_.layout.world, 0.0);
  // Doubles travel as pairs of f32 words: an all-gather only copies bytes.
  if (absl::Status s =
          host_comm_
              ->AllGather(Buffer::F32(reinterpret_cast<float*>(mine.data()), mine.size() * 2),
                          Buffer::F32(reinterpret_cast<float*>(all.data()), all.size() * 2),
                          options_.collective)
              .Wait();
      !s.ok()) {
    return Phase("gradient-norm all-gather", s);
  }
  all.resize(CeilDiv(model_->num_params(), kChunk));
  return model::GradNormFromChunks(all);
}

// AdamW on my range into staged_params_ and the staged moments, out of place from the model's
// parameters and the committed moments, which stay untouched (StageCarriedPadding: the moments'
// padding past my range is carried over). On a grid the range's parameters are staged at their own
// place in staged_held_ (the range is one of the kept ones), which the share then fills around
// them; under data parallelism in staged_params_, the all-gather's input.
absl::Status ElasticRank::StageAdamW(int64_t step, double grad_norm) {
  staged_scalars_ = model::StepScalars(options_.adamw, options_.schedule, step, grad_norm);
  const RankState& c = committed_state_;
  RankState& staged = staged_state_;
  const int64_t b = c.layout.begin(c.rank), e = c.layout.end(c.rank);
  const int64_t per_rank = c.layout.per_rank;
  float* params = nullptr;
  if (c.stages > 1) {
    const Ranges& held = c.my_held();
    staged_params_ = model::FloatArray();
    TROUPE_RETURN_IF_ERROR(ops_->Resize(&staged_held_, TotalSize(held)));
    params = staged_held_.data() + PackedOffset(held, b);
  } else {
    for (absl::Status s : {ops_->Resize(&staged_params_, per_rank),
                           ops_->Fill(staged_params_.data() + (e - b), per_rank - (e - b), 0.0f)}) {
      if (!s.ok()) return s;
    }
    params = staged_params_.data();
  }
  TROUPE_RETURN_IF_ERROR(StageCarriedPadding({{&staged.m, &c.m}, {&staged.v, &c.v}}, e - b));
  if (e == b) return absl::OkStatus();
  const kernels::AdamWSources from{model_->params() + b, c.m.data(), c.v.data()};
  return ops_->AdamWUpdateRange(model_->tensors(), b, e, params, grad_shard_.data(),
                                staged.m.data(), staged.v.data(), options_.adamw, staged_scalars_,
                                &from);
}

absl::Status ElasticRank::StageCarriedPadding(
    std::initializer_list<std::pair<model::FloatArray*, const model::FloatArray*>> staged_from,
    int64_t real) {
  for (const auto& [to, from] : staged_from) {
    const model::FloatArray& c = *from;
    TROUPE_RETURN_IF_ERROR(ops_->Resize(to, c.size()));
    if (c.size() > real) {
      TROUPE_RETURN_IF_ERROR(ops_->Copy(to->data() + real, c.data() + real, c.size() - real));
    }
  }
  return absl::OkStatus();
}

// The step's gradient of my range to the buddy and the staged parameters to the ranks that keep
// them (data parallelism: an all-gather into staged_held_), both in flight at once; then my AdamW
// of the range I mirror (StageBuddyAdamW; under data parallelism its parameters, which the
// all-gather brought, are written again with the same bits: this mode's collective all-gather
// cannot leave the buddy out).
absl::Status ElasticRank::ShareStagedState(int64_t step) {
  const RankState& c = committed_state_;
  const bool mirrors = StepAdvancesMirror();
  if (mirrors) TROUPE_RETURN_IF_ERROR(StageMirror());
  std::vector<Work> mirror;
  if (c.layout.world > 1) {
    TROUPE_RETURN_IF_ERROR(ops_->Resize(&mirror_grad_, c.layout.per_rank));
    std::vector<collectives::Communicator::PointToPoint> moves;
    elastic_internal::AddRangeMirror(c.layout, c.rank, c.buddy, grad_shard_.data(),
                                     mirror_grad_.data(), kTagMirrorGrad, &moves);
    mirror = comm_->PostPointToPoint(moves, options_.collective);
  }
  absl::Status shared;
  if (c.stages > 1) {
    // The mirror is on the wire; SendStagedParams posts the parameters and waits.
    if (options_.on_point) options_.on_point(step, StepPoint::kGather);
    shared = SendStagedParams(step);
  } else {
    // Written whole by the all-gather.
    shared = ops_->Resize(&staged_held_, c.layout.padded());
    if (shared.ok()) {
      Work gather = comm_->AllGather(Buf(staged_params_), Buf(staged_held_), options_.collective);
      if (options_.on_point) options_.on_point(step, StepPoint::kGather);
      shared = gather.Wait();
    }
  }
  const absl::Status mirrored = elastic_internal::WaitAll(mirror);
  if (!shared.ok()) return Phase("parameter all-gather", shared);
  if (!mirrored.ok()) return Phase("buddy mirror", mirrored);
  if (!mirrors) return absl::OkStatus();
  const int prev = MirroredRank(c.rank, c.buddy, c.layout.world);
  return StageBuddyAdamW(c.layout.begin(prev), c.layout.end(prev));
}

absl::Status ElasticRank::StageMirror() {
  const RankState& c = committed_state_;
  RankState& staged = staged_state_;
  const int prev = MirroredRank(c.rank, c.buddy, c.layout.world);
  const int64_t real = c.layout.end(prev) - c.layout.begin(prev);
  // replica_p: a grid's only (empty, and so left empty, otherwise).
  return StageCarriedPadding({{&staged.replica_m, &c.replica_m},
                              {&staged.replica_v, &c.replica_v},
                              {&staged.replica_p, &c.replica_p}},
                             real);
}

absl::Status ElasticRank::StageBuddyAdamW(int64_t lo, int64_t hi) {
  const RankState& c = committed_state_;
  RankState& staged = staged_state_;
  const int prev = MirroredRank(c.rank, c.buddy, c.layout.world);
  const int64_t at = lo - c.layout.begin(prev);
  if (hi <= lo) return absl::OkStatus();
  // Out of place: from the committed mirror (and, under data parallelism, where every parameter is
  // held, the model's parameters) into the staged one.
  const bool grid = c.stages > 1;
  float* params = grid ? staged.replica_p.data() + at : staged_held_.data() + lo;
  const kernels::AdamWSources from{grid ? c.replica_p.data() + at : model_->params() + lo,
                                   c.replica_m.data() + at, c.replica_v.data() + at};
  return ops_->AdamWUpdateRange(model_->tensors(), lo, hi, params, mirror_grad_.data() + at,
                                staged.replica_m.data() + at, staged.replica_v.data() + at,
                                options_.adamw, staged_scalars_, &from);
}

}  // namespace troupe::train
