#include "troupe/actors/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "troupe/collectives/canonical_combine.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/crc32c.h"
#include "troupe/model/tree_sum.h"

namespace troupe::actors {
namespace {

using collectives::Buffer;
using collectives::Work;

constexpr int64_t kChunk = kernels::kNormChunk;
// Point-to-point tags: mirror to buddy, then state moves (two per piece: m, v; parameters from
// kTagParamMoveBase, one per piece).
constexpr uint32_t kTagMirrorM = 1, kTagMirrorV = 2, kTagMirrorP = 3, kTagCrc = 4,
                   kTagMirrorGrad = 5, kTagMoveBase = 16, kTagParamMoveBase = 1u << 24;
// Pipeline tags (user tags have 31 bits): bit 30; bit 29 for the gradient exchange, bit 28 for
// the parameters' share (else the schedule's moves); the step's low 8 bits in bits 20–27.
constexpr uint32_t kTagPipelineBase = 1u << 30, kTagExchange = 1u << 29, kTagParamShare = 1u << 28;

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// r ∩ [lo, hi), in order.
Ranges Intersect(const Ranges& r, int64_t lo, int64_t hi) {
  Ranges out;
  for (const auto& [b, e] : r) {
    if (std::max(b, lo) < std::min(e, hi)) out.emplace_back(std::max(b, lo), std::min(e, hi));
  }
  return out;
}

int64_t TotalSize(const Ranges& r) {
  int64_t n = 0;
  for (const auto& [b, e] : r) n += e - b;
  return n;
}

// Where flat element `at` (inside one of r's ranges) is when r's ranges lie one after the other.
int64_t PackedOffset(const Ranges& r, int64_t at) {
  int64_t offset = 0;
  for (const auto& [b, e] : r) {
    if (at >= b && at < e) return offset + (at - b);
    offset += e - b;
  }
  return offset;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The rank whose range `rank` mirrors: (rank - buddy) mod world.
int MirroredRank(int rank, int buddy, int world) { return (rank + world - buddy % world) % world; }

// A mirror of the real elements of each range (ranges of padding move nothing): `mine` (my
// range's) to my buddy, the range of the rank I mirror into `theirs`.
void AddRangeMirror(const ShardLayout& layout, int rank, int buddy, const float* mine,
                    float* theirs, uint32_t tag,
                    std::vector<collectives::Communicator::PointToPoint>* moves) {
  using P2P = collectives::Communicator::PointToPoint;
  const int prev = MirroredRank(rank, buddy, layout.world);
  const int64_t send = layout.end(rank) - layout.begin(rank);
  const int64_t receive = layout.end(prev) - layout.begin(prev);
  if (send > 0) {
    moves->push_back({P2P::Kind::kSend, Buffer::F32(const_cast<float*>(mine), send),
                      (rank + buddy) % layout.world, tag});
  }
  if (receive > 0) moves->push_back({P2P::Kind::kRecv, Buffer::F32(theirs, receive), prev, tag});
}

// Largest power of two strictly below n (n >= 2): the canonical tree's split.
int32_t SplitSize(int32_t n) {
  int32_t p = 1;
  while (p * 2 < n) p *= 2;
  return p;
}

// The same status (code and payloads: a blamed peer), its message prefixed with the step phase
// it failed in.
absl::Status Phase(const char* phase, const absl::Status& s) {
  absl::Status out(s.code(), absl::StrCat(phase, ": ", s.message()));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// Wall time since construction.
class Stopwatch {
 public:
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

bool ValidBuddy(int buddy, int world) { return buddy >= 1 && buddy < std::max(2, world); }

Buffer Buf(model::FloatArray& a) { return Buffer::F32(a.data(), static_cast<size_t>(a.size())); }
Buffer Buf(const model::FloatArray& a) {
  return Buffer::F32(const_cast<float*>(a.data()), static_cast<size_t>(a.size()));
}

absl::Status WaitAll(const std::vector<Work>& works) {
  absl::Status first;
  for (const Work& w : works) {
    absl::Status s = w.Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace

ShardLayout ShardLayout::Make(int64_t num_params, int world) {
  ShardLayout l;
  l.world = std::max(1, world);
  l.num_params = num_params;
  l.per_rank = std::max<int64_t>(1, CeilDiv(CeilDiv(num_params, l.world), kChunk)) * kChunk;
  return l;
}

int64_t ShardLayout::begin(int r) const { return std::min(num_params, r * per_rank); }
int64_t ShardLayout::end(int r) const { return std::min(num_params, (r + 1) * per_rank); }

absl::StatusOr<std::vector<std::pair<int32_t, int32_t>>> MicrobatchBlocks(int32_t microbatches,
                                                                          int world) {
  if (world < 1 || world > microbatches) {
    return absl::InvalidArgumentError(absl::StrCat("world size: expected 1 to ", microbatches,
                                                   " (the microbatches per step), got ", world));
  }
  std::vector<std::pair<int32_t, int32_t>> blocks = {{0, microbatches}};
  while (static_cast<int>(blocks.size()) < world) {
    // Split the first of the largest blocks at its canonical midpoint.
    size_t best = 0;
    for (size_t i = 1; i < blocks.size(); ++i) {
      if (blocks[i].second - blocks[i].first > blocks[best].second - blocks[best].first) best = i;
    }
    const auto [lo, hi] = blocks[best];
    const int32_t mid = lo + SplitSize(hi - lo);
    blocks[best] = {lo, mid};
    blocks.insert(blocks.begin() + best + 1, {mid, hi});
  }
  return blocks;
}

bool MemoryRestorePossible(const std::vector<int>& old_to_new, int buddy) {
  const int w = static_cast<int>(old_to_new.size());
  if (w == 0) return false;
  for (int o = 0; o < w; ++o) {
    if (old_to_new[o] >= 0) continue;
    if (w == 1 || old_to_new[(o + buddy) % w] < 0) return false;
  }
  return true;
}

int BuddiesSharingADomain(const std::vector<std::string>& domains, int buddy) {
  const int w = static_cast<int>(domains.size());
  int shared = 0;
  for (int r = 0; r < w && w > 1; ++r) shared += domains[r] == domains[(r + buddy) % w];
  return shared;
}

int BuddyOffset(const std::vector<std::string>& domains) {
  int best = 1;
  for (int k = 2; k < static_cast<int>(domains.size()); ++k) {
    if (BuddiesSharingADomain(domains, k) < BuddiesSharingADomain(domains, best)) best = k;
  }
  return best;
}

ElasticRank::ElasticRank(Trainable* model, Options options)
    : model_(model), ops_(&model->array_ops()), options_(std::move(options)) {}

ShardView HostShard::view() const {
  const int64_t count = end - begin;
  return {begin, end, data.data(), data.data() + count, data.data() + 2 * count};
}

absl::StatusOr<HostShard> ElasticRank::CommittedShardOnHost() const {
  HostShard out;
  out.begin = layout_.begin(rank_);
  out.end = layout_.end(rank_);
  const int64_t count = out.end - out.begin;
  out.data.resize(3 * count);
  if (count == 0) return out;
  const float* p = model_->params() + out.begin;  // pointer arithmetic only: device memory
  for (const auto& [src, dst] :
       {std::pair{p, 0}, std::pair{m_.data(), 1}, std::pair{v_.data(), 2}}) {
    if (absl::Status s = ops_->CopyToHost(out.data.data() + dst * count, src, count); !s.ok()) {
      return s;
    }
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
  const int64_t b = layout_.begin(rank_), e = layout_.end(rank_);
  return ShardView{b, e, model_->params() + b, m_.data(), v_.data()};
}

absl::StatusOr<std::vector<float>> ElasticRank::ParamsOnHost() {
  const int64_t n = model_->num_params();
  std::vector<float> out(n);
  if (stages_ == 1) {
    if (absl::Status s = ops_->CopyToHost(out.data(), model_->params(), n); !s.ok()) return s;
    return out;
  }
  // A grid: each owner's committed range, gathered — straight from the model's buffer and into
  // `out` where the memory allows (no copy of the model beside the one returned).
  const int64_t b = layout_.begin(rank_), e = layout_.end(rank_);
  Buffer send = Buffer::F32(model_->params() + b, static_cast<size_t>(layout_.per_rank));
  model::FloatArray padded, all;
  if (e - b < layout_.per_rank) {  // the last ranges: padding
    for (absl::Status s : {ops_->Assign(&padded, layout_.per_rank, 0.0f),
                           ops_->Copy(padded.data(), model_->params() + b, e - b)}) {
      if (!s.ok()) return s;
    }
    send = Buf(padded);
  }
  const bool direct = ops_->host_accessible();
  out.resize(layout_.padded());
  if (!direct) {
    if (absl::Status s = ops_->Resize(&all, layout_.padded()); !s.ok()) return s;
  }
  const Buffer receive = direct ? Buffer::F32(out.data(), out.size()) : Buf(all);
  if (absl::Status s = comm_->AllGather(send, receive, options_.collective).Wait(); !s.ok()) {
    return Phase("parameter gather", s);
  }
  if (!direct) {
    if (absl::Status s = ops_->CopyToHost(out.data(), all.data(), n); !s.ok()) return s;
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
      if (absl::Status s = ops_->CopyToHost(chunk.data(), model_->params() + at, len); !s.ok()) {
        return s;
      }
      crc = model::Crc32cExtend(crc, chunk.data(), len * sizeof(float));
    }
    return crc;
  };
  if (stages_ == 1) return extend(0, 0, model_->num_params());
  // The CRC's 32 bits travel as one float's (the transports copy bytes).
  uint32_t crc = 0;
  const Buffer word = Buffer::F32(reinterpret_cast<float*>(&crc), 1);
  const collectives::CollectiveOptions& o = options_.collective;
  if (rank_ > 0) {
    if (absl::Status s = host_comm_->Recv(word, rank_ - 1, kTagCrc, o).Wait(); !s.ok()) {
      return Phase("parameter CRC", s);
    }
  }
  absl::StatusOr<uint32_t> mine = extend(crc, layout_.begin(rank_), layout_.end(rank_));
  if (!mine.ok()) return mine.status();
  crc = *mine;
  if (rank_ + 1 < layout_.world) {
    if (absl::Status s = host_comm_->Send(word, rank_ + 1, kTagCrc, o).Wait(); !s.ok()) {
      return Phase("parameter CRC", s);
    }
  }
  if (absl::Status s = host_comm_->Broadcast(word, layout_.world - 1, o).Wait(); !s.ok()) {
    return Phase("parameter CRC", s);
  }
  return crc;
}

absl::StatusOr<ElasticRank::Ranges> ElasticRank::HeldRanges(const ShardLayout& layout, int rank,
                                                            int stages) const {
  if (stages == 1) return Ranges{{0, model_->num_params()}};
  StagedTrainable* st = model_->staged();
  absl::StatusOr<std::vector<std::pair<int, int>>> units = PartitionUnits(st->costs(), stages);
  if (!units.ok()) return units.status();
  const GridPosition pos = GridPositionOf(rank, layout.world, stages);
  Ranges r = st->GradientRanges((*units)[pos.stage].first, (*units)[pos.stage].second);
  if (pos.stage == 0) {
    for (const auto& t : st->TiedRanges()) r.push_back(t);
  }
  if (layout.end(rank) > layout.begin(rank)) r.emplace_back(layout.begin(rank), layout.end(rank));
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& [b, e] : r) {
    if (!merged.empty() && b <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, e);
    } else {
      merged.emplace_back(b, e);
    }
  }
  return merged;
}

absl::Status ElasticRank::StageHeldFromModel() {
  const Ranges& held = staged_held_ranges_;
  for (const auto& [b, e] : held) {
    if (absl::Status s =
            ops_->Copy(staged_held_.data() + PackedOffset(held, b), model_->params() + b, e - b);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::PostMirror(const ShardLayout& layout, int rank, int buddy,
                                     bool mirror_params, const float* p, const model::FloatArray& m,
                                     const model::FloatArray& v, model::FloatArray* replica_p,
                                     model::FloatArray* replica_m, model::FloatArray* replica_v,
                                     std::vector<Work>* works) {
  if (!mirror_params) *replica_p = model::FloatArray();
  if (layout.world == 1) {
    if (absl::Status s = ops_->Assign(replica_m, layout.per_rank, 0.0f); !s.ok()) return s;
    return ops_->Assign(replica_v, layout.per_rank, 0.0f);
  }
  // Written whole by the receives.
  for (model::FloatArray* a : {replica_m, replica_v}) {
    if (absl::Status s = ops_->Resize(a, layout.per_rank); !s.ok()) return s;
  }
  const int next = (rank + buddy) % layout.world;
  const int prev = MirroredRank(rank, buddy, layout.world);
  using P2P = collectives::Communicator::PointToPoint;
  std::vector<P2P> moves = {{P2P::Kind::kSend, Buf(m), next, kTagMirrorM},
                            {P2P::Kind::kSend, Buf(v), next, kTagMirrorV},
                            {P2P::Kind::kRecv, Buf(*replica_m), prev, kTagMirrorM},
                            {P2P::Kind::kRecv, Buf(*replica_v), prev, kTagMirrorV}};
  if (mirror_params) {
    if (absl::Status s = ops_->Resize(replica_p, layout.per_rank); !s.ok()) return s;
    AddRangeMirror(layout, rank, buddy, p, replica_p->data(), kTagMirrorP, &moves);
  }
  const std::vector<Work> posted = comm_->PostPointToPoint(moves, options_.collective);
  works->insert(works->end(), posted.begin(), posted.end());
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> ElasticRank::RunStep() {
  if (!commit_error_.ok()) return commit_error_;
  if (!has_state_) return absl::FailedPreconditionError("RunStep before a configuration committed");
  Abandon();
  const int64_t step = committed_;
  absl::StatusOr<std::vector<std::pair<int32_t, int32_t>>> blocks =
      MicrobatchBlocks(options_.microbatches, layout_.world / stages_);
  if (!blocks.ok()) return blocks.status();
  StepOutcome out;
  Stopwatch collective;  // restarted before each collective phase
  auto collected = [&] { out.collective_seconds += collective.Seconds(); };
  if (stages_ == 1) {
    const auto [lo, hi] = (*blocks)[rank_];
    out.block_size = hi - lo;
    if (absl::Status s = AccumulateSubtree(step, lo, hi, &out); !s.ok()) return s;
    collective = Stopwatch();
    if (absl::Status s = ReduceScatterGradient(step, lo, hi); !s.ok()) return s;
    collected();
  } else {
    const GridPosition pos = GridPositionOf(rank_, layout_.world, stages_);
    const auto [lo, hi] = (*blocks)[pos.replica];
    out.block_size = hi - lo;
    if (absl::Status s = RunStageSchedule(step, lo, hi, pos, &out); !s.ok()) return s;
    collective = Stopwatch();
    if (absl::Status s = ExchangeStageGradients(step, *blocks, pos); !s.ok()) return s;
    collected();
  }
  collective = Stopwatch();
  absl::StatusOr<double> grad_norm = GlobalGradNorm();
  if (!grad_norm.ok()) return grad_norm.status();
  collected();
  out.grad_norm = *grad_norm;
  if (absl::Status s = StageAdamW(step, out.grad_norm); !s.ok()) return s;
  collective = Stopwatch();
  if (absl::Status s = ShareStagedState(step); !s.ok()) return s;
  collected();
  staged_ = Staged::kStep;
  staged_layout_ = layout_;
  staged_rank_ = rank_;
  staged_buddy_ = buddy_;
  staged_stages_ = stages_;
  staged_committed_ = step + 1;
  return out;
}

// This rank's subtree of the canonical gradient sum, into partial_.
absl::Status ElasticRank::AccumulateSubtree(int64_t step, int32_t lo, int32_t hi,
                                            StepOutcome* out) {
  const int64_t n = model_->num_params();
  if (!acc_) acc_.emplace(n, *ops_);
  acc_->Reset();  // a failed step may have left leaves
  const Stopwatch schedule;
  for (int32_t k = lo; k < hi; ++k) {
    if (options_.on_serve) options_.on_serve(step, k);
    const Stopwatch compute;
    absl::StatusOr<double> loss = model_->ComputeGradient(step, k);
    out->compute_seconds += compute.Seconds();
    out->schedule_seconds = schedule.Seconds();
    if (!loss.ok()) return loss.status();
    out->losses.emplace_back(k, *loss);
    if (absl::Status s = acc_->Add(model_->grads()); !s.ok()) return s;
  }
  if (absl::Status s = ops_->Resize(&partial_, layout_.padded()); !s.ok()) return s;
  if (absl::Status s = acc_->Finish(partial_.data()); !s.ok()) return s;
  return ops_->Fill(partial_.data() + n, layout_.padded() - n, 0.0f);
}

// Ordered reduce-scatter: the step gradient of my range, in canonical order, into grad_shard_.
absl::Status ElasticRank::ReduceScatterGradient(int64_t step, int32_t lo, int32_t hi) {
  collectives::CollectiveOptions ordered = options_.collective;
  if (options_.deterministic) {
    ordered.algorithm = collectives::Algorithm::kOrdered;
    ordered.interval_lo = static_cast<uint64_t>(lo);
    ordered.interval_hi = static_cast<uint64_t>(hi);
  } else {
    ordered.algorithm = collectives::Algorithm::kAuto;
  }
  // Written whole by the reduce-scatter.
  if (absl::Status s = ops_->Resize(&grad_shard_, layout_.per_rank); !s.ok()) return s;
  Work exchange =
      comm_->ReduceScatter(Buf(partial_), Buf(grad_shard_), collectives::ReduceOp::kSum, ordered);
  if (options_.on_exchange) options_.on_exchange(step);
  if (absl::Status s = exchange.Wait(); !s.ok()) return Phase("gradient reduce-scatter", s);
  return absl::OkStatus();
}

// Global gradient norm over the real chunks, in a fixed tree.
absl::StatusOr<double> ElasticRank::GlobalGradNorm() {
  const int64_t n = model_->num_params();
  const int64_t b = layout_.begin(rank_), e = layout_.end(rank_);
  const int64_t chunks_per_rank = layout_.per_rank / kChunk;
  std::vector<double> mine(chunks_per_rank, 0.0), all(chunks_per_rank * layout_.world, 0.0);
  if (e > b) {
    absl::StatusOr<std::vector<double>> sums =
        ops_->RangeChunkSquareSums(grad_shard_.data(), b, e, n);
    if (!sums.ok()) return sums.status();
    std::copy(sums->begin(), sums->end(), mine.begin());
  }
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
  all.resize(CeilDiv(n, kChunk));
  return model::GradNormFromChunks(all);
}

// AdamW on my range into staged_params_ and staged moments; committed state is untouched.
// On a grid the range's parameters are staged in place in staged_held_ (the range is one of the
// kept ones), which the share then fills around them; under data parallelism in staged_params_,
// the all-gather's input.
absl::Status ElasticRank::StageAdamW(int64_t step, double grad_norm) {
  staged_scalars_ = model::StepScalars(options_.adamw, options_.schedule, step, grad_norm);
  const int64_t b = layout_.begin(rank_), e = layout_.end(rank_);
  const int64_t per_rank = layout_.per_rank;
  float* params = nullptr;
  if (stages_ > 1) {
    absl::StatusOr<Ranges> held = HeldRanges(layout_, rank_, stages_);
    if (!held.ok()) return held.status();
    staged_held_ranges_ = *held;
    staged_params_ = model::FloatArray();
    if (absl::Status s = ops_->Resize(&staged_held_, TotalSize(*held)); !s.ok()) return s;
    params = staged_held_.data() + PackedOffset(*held, b);
  } else {
    for (absl::Status s : {ops_->Resize(&staged_params_, per_rank),
                           ops_->Fill(staged_params_.data() + (e - b), per_rank - (e - b), 0.0f)}) {
      if (!s.ok()) return s;
    }
    params = staged_params_.data();
  }
  for (absl::Status s : {ops_->Resize(&staged_m_, per_rank), ops_->Resize(&staged_v_, per_rank)}) {
    if (!s.ok()) return s;
  }
  for (absl::Status s : {ops_->Copy(params, model_->params() + b, e - b),
                         ops_->Copy(staged_m_.data(), m_.data(), per_rank),
                         ops_->Copy(staged_v_.data(), v_.data(), per_rank)}) {
    if (!s.ok()) return s;
  }
  if (e == b) return absl::OkStatus();
  return ops_->AdamWUpdateRange(model_->tensors(), b, e, params, grad_shard_.data(),
                                staged_m_.data(), staged_v_.data(), options_.adamw,
                                staged_scalars_);
}

absl::StatusOr<std::vector<std::pair<int, int>>> ElasticRank::StageUnits() const {
  return PartitionUnits(model_->staged()->costs(), stages_);
}

// The stage's schedule over microbatches [lo, hi) of the step. Sends are never waited on before
// a receive (a 1F1B pipeline of blocking sends can deadlock); each send buffer is waited on
// before it is written again, and all of them before the schedule returns.
absl::Status ElasticRank::RunStageSchedule(int64_t step, int32_t lo, int32_t hi, GridPosition pos,
                                           StepOutcome* out) {
  using Kind = PipelineOp::Kind;
  StagedTrainable* st = model_->staged();
  const int p = stages_, s = pos.stage, world = layout_.world;
  const bool first = s == 0, last = s == p - 1;
  absl::StatusOr<std::vector<std::pair<int, int>>> units = StageUnits();
  if (!units.ok()) return units.status();
  const std::vector<PipelineOp> ops = StageOps(options_.pipeline, p, s, hi - lo);
  const int slots = std::max(1, MaxInFlight(ops));
  const std::tuple<int, int, int> want{(*units)[s].first, (*units)[s].second, slots};
  const std::vector<std::pair<int64_t, int64_t>> ranges =
      st->GradientRanges((*units)[s].first, (*units)[s].second);
  if (model_stage_ != want) {
    if (absl::Status e = st->SetStage((*units)[s].first, (*units)[s].second, slots); !e.ok()) {
      return e;
    }
    model_stage_ = want;
    stage_accs_.clear();
    for (const auto& [b, e] : ranges) stage_accs_.emplace_back(e - b, *ops_);
    stage_partials_.resize(ranges.size());
  }
  for (model::TreeAccumulator& acc : stage_accs_) acc.Reset();
  // The last stage's tied ranges (the GPT's wte) wait for the first stage's input gradient.
  const std::vector<std::pair<int64_t, int64_t>> tied_ranges = st->TiedRanges();
  std::vector<bool> is_tied(ranges.size(), false);
  int64_t tied_size = 0;
  for (size_t g = 0; g < ranges.size() && last; ++g) {
    is_tied[g] = std::find(tied_ranges.begin(), tied_ranges.end(), ranges[g]) != tied_ranges.end();
    if (is_tied[g]) tied_size += ranges[g].second - ranges[g].first;
  }
  const bool send_tied = first && !tied_ranges.empty();
  const int prev = first ? -1 : GridRank({pos.replica, s - 1}, world, p);
  const int next = last ? -1 : GridRank({pos.replica, s + 1}, world, p);
  const int64_t boundary = st->boundary_size();
  // Tags: microbatch k's activation, its gradient, and the first stage's input gradient for the
  // tied ranges; the step's low bits keep a stale message of an abandoned step from matching.
  auto tag = [step](int32_t k, uint32_t kind) {
    return kTagPipelineBase | ((static_cast<uint32_t>(step) & 0xff) << 20) |
           (static_cast<uint32_t>(k) * 3 + kind);
  };
  // Buffers, each with the send that reads it (waited on before it is written again).
  std::vector<model::FloatArray> act_in(first ? 0 : slots);
  std::vector<Work> act_sent(slots);
  model::FloatArray grad_in;
  model::FloatArray grad_out[2];
  Work grad_sent[2];
  for (model::FloatArray& a : act_in) {
    if (absl::Status e = ops_->Resize(&a, boundary); !e.ok()) return e;
  }
  if (!last) {
    if (absl::Status e = ops_->Resize(&grad_in, boundary); !e.ok()) return e;
  }
  for (model::FloatArray& a : grad_out) {
    if (absl::Status e = ops_->Resize(&a, boundary); !e.ok()) return e;
  }
  struct Tied {
    int32_t k = 0;
    model::FloatArray grad, first_input_gradient;
    Work received;
  };
  std::deque<Tied> tied;  // in microbatch order
  const Stopwatch schedule;
  // Times a call into the model as compute.
  auto timed = [out](auto&& call) {
    const Stopwatch compute;
    auto result = call();
    out->compute_seconds += compute.Seconds();
    return result;
  };
  auto add_leaves = [&](const float* tied_grad) -> absl::Status {
    int64_t offset = 0;
    for (size_t g = 0; g < ranges.size(); ++g) {
      const float* leaf = model_->grads() + ranges[g].first;  // pointer arithmetic only
      if (is_tied[g]) {
        if (tied_grad == nullptr) continue;
        leaf = tied_grad + offset;
        offset += ranges[g].second - ranges[g].first;
      } else if (tied_grad != nullptr) {
        continue;
      }
      if (absl::Status e = stage_accs_[g].Add(leaf); !e.ok()) return e;
    }
    return absl::OkStatus();
  };
  // Completes the tied gradients whose input gradient arrived (all of them with `wait`).
  auto drain_tied = [&](bool wait) -> absl::Status {
    while (!tied.empty() && (wait || tied.front().received.IsDone())) {
      Tied& t = tied.front();
      if (absl::Status e = t.received.Wait(); !e.ok()) {
        return Phase("pipeline: tied input gradient", e);
      }
      if (absl::Status e = timed([&] {
            return st->AddTiedGradient(step, lo + t.k, t.first_input_gradient.data(),
                                       t.grad.data());
          });
          !e.ok()) {
        return e;
      }
      if (absl::Status e = add_leaves(t.grad.data()); !e.ok()) return e;
      tied.pop_front();
    }
    return absl::OkStatus();
  };
  std::vector<int> free_slots;
  for (int i = slots - 1; i >= 0; --i) free_slots.push_back(i);
  std::vector<int> slot_of(hi - lo, -1);
  int in_flight = 0;
  const collectives::CollectiveOptions& copts = options_.collective;
  for (const PipelineOp& op : ops) {
    const int32_t k = op.microbatch;
    if (op.kind == Kind::kForward) {
      if (free_slots.empty()) {
        return absl::InternalError(absl::StrCat("pipeline: stage ", s,
                                                " has no free slot for "
                                                "microbatch ",
                                                lo + k, " (", slots, " in flight)"));
      }
      const int slot = free_slots.back();
      free_slots.pop_back();
      slot_of[k] = slot;
      out->max_in_flight = std::max(out->max_in_flight, ++in_flight);
      if (absl::Status e = act_sent[slot].Wait(); !e.ok()) {
        return Phase("pipeline: activation send", e);
      }
      const float* input = nullptr;
      if (!first) {
        if (absl::Status e = comm_->Recv(Buf(act_in[slot]), prev, tag(k, 0), copts).Wait();
            !e.ok()) {
          return Phase("pipeline: activation receive", e);
        }
        input = act_in[slot].data();
      }
      if (first && options_.on_serve) options_.on_serve(step, lo + k);
      absl::StatusOr<double> loss =
          timed([&] { return st->StageForward(step, lo + k, slot, input); });
      if (!loss.ok()) return loss.status();
      if (last) out->losses.emplace_back(lo + k, *loss);
      if (!last) {
        act_sent[slot] = comm_->Send(
            Buffer::F32(const_cast<float*>(st->StageOutput(slot)), static_cast<size_t>(boundary)),
            next, tag(k, 0), copts);
      }
    } else {
      const int slot = slot_of[k];
      if (!last) {
        if (absl::Status e = comm_->Recv(Buf(grad_in), next, tag(k, 1), copts).Wait(); !e.ok()) {
          return Phase("pipeline: gradient receive", e);
        }
      }
      if (absl::Status e =
              timed([&] { return st->StageBackward(slot, last ? nullptr : grad_in.data()); });
          !e.ok()) {
        return e;
      }
      free_slots.push_back(slot);
      --in_flight;
      if (!first || send_tied) {
        model::FloatArray& buf = grad_out[k % 2];
        if (absl::Status e = grad_sent[k % 2].Wait(); !e.ok()) {
          return Phase("pipeline: gradient send", e);
        }
        if (absl::Status e = ops_->Copy(buf.data(), st->InputGradient(), boundary); !e.ok()) {
          return e;
        }
        grad_sent[k % 2] = first ? comm_->Send(Buf(buf), GridRank({pos.replica, p - 1}, world, p),
                                               tag(k, 2), copts)
                                 : comm_->Send(Buf(buf), prev, tag(k, 1), copts);
      }
      if (absl::Status e = add_leaves(nullptr); !e.ok()) return e;
      if (tied_size > 0) {
        Tied t;
        t.k = k;
        for (absl::Status e :
             {ops_->Resize(&t.grad, tied_size), ops_->Resize(&t.first_input_gradient, boundary)}) {
          if (!e.ok()) return e;
        }
        int64_t offset = 0;
        for (size_t g = 0; g < ranges.size(); ++g) {
          if (!is_tied[g]) continue;
          const int64_t len = ranges[g].second - ranges[g].first;
          if (absl::Status e =
                  ops_->Copy(t.grad.data() + offset, model_->grads() + ranges[g].first, len);
              !e.ok()) {
            return e;
          }
          offset += len;
        }
        t.received = comm_->Recv(Buf(t.first_input_gradient), GridRank({pos.replica, 0}, world, p),
                                 tag(k, 2), copts);
        tied.push_back(std::move(t));
      }
    }
    if (absl::Status e = drain_tied(false); !e.ok()) return e;
  }
  if (absl::Status e = drain_tied(true); !e.ok()) return e;
  std::vector<Work> sends(act_sent.begin(), act_sent.end());
  sends.insert(sends.end(), std::begin(grad_sent), std::end(grad_sent));
  if (absl::Status e = WaitAll(sends); !e.ok()) return Phase("pipeline: send", e);
  out->schedule_seconds = schedule.Seconds();
  for (size_t g = 0; g < ranges.size(); ++g) {
    const int64_t len = ranges[g].second - ranges[g].first;
    if (absl::Status e = ops_->Resize(&stage_partials_[g], len); !e.ok()) return e;
    if (absl::Status e = stage_accs_[g].Finish(stage_partials_[g].data()); !e.ok()) return e;
  }
  return absl::OkStatus();
}

// Each stage's partials go to the owners of the ranges they cover; an owner combines the dp
// replicas' partials of each piece in the canonical tree over their microbatch blocks.
absl::Status ElasticRank::ExchangeStageGradients(
    int64_t step, const std::vector<std::pair<int32_t, int32_t>>& blocks, GridPosition pos) {
  StagedTrainable* st = model_->staged();
  const int p = stages_, world = layout_.world, dp = world / p;
  absl::StatusOr<std::vector<std::pair<int, int>>> units = StageUnits();
  if (!units.ok()) return units.status();
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const auto& [lo, hi] : blocks) intervals.emplace_back(lo, hi);
  absl::StatusOr<collectives::CombinePlan> plan = collectives::PlanCanonicalCombine(intervals);
  if (!plan.ok()) return plan.status();
  const int64_t b = layout_.begin(rank_), e = layout_.end(rank_);
  if (absl::Status s = ops_->Resize(&grad_shard_, layout_.per_rank); !s.ok()) return s;
  if (absl::Status s = ops_->Fill(grad_shard_.data() + (e - b), layout_.per_rank - (e - b), 0.0f);
      !s.ok()) {
    return s;
  }
  using P2P = collectives::Communicator::PointToPoint;
  std::vector<P2P> moves;
  // A piece this rank combines: range [lo, hi) of the shard, and each replica's partial of it.
  struct Piece {
    int64_t lo = 0, hi = 0;
    std::vector<const float*> partial;  // by replica
  };
  std::vector<Piece> pieces;
  std::vector<model::FloatArray> received;
  received.reserve(static_cast<size_t>(p) * 2 * dp);
  const uint32_t tag_base =
      kTagPipelineBase | kTagExchange | ((static_cast<uint32_t>(step) & 0xff) << 20);
  for (int s = 0; s < p; ++s) {
    const std::vector<std::pair<int64_t, int64_t>> ranges =
        st->GradientRanges((*units)[s].first, (*units)[s].second);
    for (size_t g = 0; g < ranges.size(); ++g) {
      const auto [rb, re] = ranges[g];
      // Sends: my partial of this range to every owner it overlaps.
      for (int owner = 0; owner < world && s == pos.stage; ++owner) {
        const int64_t lo = std::max(rb, layout_.begin(owner)),
                      hi = std::min(re, layout_.end(owner));
        if (lo >= hi || owner == rank_) continue;
        moves.push_back({P2P::Kind::kSend,
                         Buffer::F32(stage_partials_[g].data() + (lo - rb), hi - lo), owner,
                         tag_base + static_cast<uint32_t>(g)});
      }
      // Receives: every replica's partial of this range ∩ my shard.
      const int64_t lo = std::max(rb, b), hi = std::min(re, e);
      if (lo >= hi) continue;
      Piece piece{lo, hi, std::vector<const float*>(dp, nullptr)};
      for (int d = 0; d < dp; ++d) {
        const int src = GridRank({d, s}, world, p);
        if (src == rank_) {
          piece.partial[d] = stage_partials_[g].data() + (lo - rb);
          continue;
        }
        received.emplace_back();
        if (absl::Status st2 = ops_->Resize(&received.back(), hi - lo); !st2.ok()) return st2;
        piece.partial[d] = received.back().data();
        moves.push_back(
            {P2P::Kind::kRecv, Buf(received.back()), src, tag_base + static_cast<uint32_t>(g)});
      }
      pieces.push_back(std::move(piece));
    }
  }
  const std::vector<Work> posted = comm_->PostPointToPoint(moves, options_.collective);
  if (options_.on_exchange) options_.on_exchange(step);
  if (absl::Status s = WaitAll(posted); !s.ok()) return Phase("pipeline gradient exchange", s);
  using Kind = collectives::CombineOperand::Kind;
  std::vector<model::FloatArray> inner(plan->inner);
  for (const Piece& piece : pieces) {
    const int64_t len = piece.hi - piece.lo;
    for (model::FloatArray& t : inner) {
      if (absl::Status s = ops_->Resize(&t, len); !s.ok()) return s;
    }
    float* output = grad_shard_.data() + (piece.lo - b);
    auto at = [&](const collectives::CombineOperand& o) -> float* {
      switch (o.kind) {
        case Kind::kPartial:
          return const_cast<float*>(piece.partial[o.index]);
        case Kind::kInner:
          return inner[o.index].data();
        case Kind::kOutput:
          return output;
        case Kind::kNone:
          break;
      }
      return nullptr;
    };
    for (const collectives::CombineStep& c : plan->steps) {
      // dst is never a partial: x is copied, then y added (x + y, in that order).
      if (at(c.dst) != at(c.x)) {
        if (absl::Status s = ops_->Copy(at(c.dst), at(c.x), len); !s.ok()) return s;
      }
      if (c.y.kind == Kind::kNone) continue;
      if (absl::Status s = ops_->AddInto(at(c.dst), at(c.y), len); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// The step's gradient of my range to the buddy (which replays my AdamW on its mirror when the
// step commits) and the staged parameters to the ranks that keep them (data parallelism: an
// all-gather into staged_held_), both in flight at once.
absl::Status ElasticRank::ShareStagedState(int64_t step) {
  std::vector<Work> mirror;
  if (layout_.world > 1) {
    if (absl::Status s = ops_->Resize(&mirror_grad_, layout_.per_rank); !s.ok()) return s;
    std::vector<collectives::Communicator::PointToPoint> moves;
    AddRangeMirror(layout_, rank_, buddy_, grad_shard_.data(), mirror_grad_.data(), kTagMirrorGrad,
                   &moves);
    mirror = comm_->PostPointToPoint(moves, options_.collective);
  }
  absl::Status shared;
  if (stages_ > 1) {
    shared = SendStagedParams(step);
  } else {
    staged_held_ranges_ = {{0, model_->num_params()}};
    // Written whole by the all-gather.
    shared = ops_->Resize(&staged_held_, layout_.padded());
    if (shared.ok()) {
      shared = comm_->AllGather(Buf(staged_params_), Buf(staged_held_), options_.collective).Wait();
    }
  }
  const absl::Status mirrored = WaitAll(mirror);
  if (!shared.ok()) return Phase("parameter all-gather", shared);
  if (!mirrored.ok()) return Phase("buddy mirror", mirrored);
  return absl::OkStatus();
}

absl::Status ElasticRank::SendStagedParams(int64_t step) {
  const int world = layout_.world;
  const Ranges& held = staged_held_ranges_;  // StageAdamW set them and staged my range there
  const int64_t b = layout_.begin(rank_), e = layout_.end(rank_);
  const uint32_t tag_base =
      kTagPipelineBase | kTagParamShare | ((static_cast<uint32_t>(step) & 0xff) << 20);
  using P2P = collectives::Communicator::PointToPoint;
  std::vector<P2P> moves;
  // Pieces between a pair are numbered in flat order on both sides.
  for (int d = 0; d < world; ++d) {
    if (d == rank_) continue;
    absl::StatusOr<Ranges> theirs = HeldRanges(layout_, d, stages_);
    if (!theirs.ok()) return theirs.status();
    uint32_t piece = 0;
    for (const auto& [lo, hi] : Intersect(*theirs, b, e)) {
      moves.push_back({P2P::Kind::kSend,
                       Buffer::F32(staged_held_.data() + PackedOffset(held, lo), hi - lo), d,
                       tag_base + piece++});
    }
  }
  for (int o = 0; o < world; ++o) {
    if (o == rank_) continue;
    uint32_t piece = 0;
    for (const auto& [lo, hi] : Intersect(held, layout_.begin(o), layout_.end(o))) {
      moves.push_back({P2P::Kind::kRecv,
                       Buffer::F32(staged_held_.data() + PackedOffset(held, lo), hi - lo), o,
                       tag_base + piece++});
    }
  }
  return WaitAll(comm_->PostPointToPoint(moves, options_.collective));
}

absl::Status ElasticRank::RestoreFromMemory(const GenerationPlan& plan, const ShardLayout& to) {
  const int64_t n = model_->num_params();
  const Ranges& held = staged_held_ranges_;
  const int old_world = static_cast<int>(plan.old_to_new.size());
  if (!MemoryRestorePossible(plan.old_to_new, plan.old_buddy)) {
    return absl::FailedPreconditionError(
        "memory restore: an old range has neither owner nor buddy");
  }
  // Survivors must hold exactly the committed step (and mirror) the coordinator recorded.
  const bool survivor = has_state_ && layout_.world == old_world && rank_ < old_world &&
                        plan.old_to_new[rank_] == plan.rank;
  if (survivor && buddy_ != plan.old_buddy) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory restore: rank mirrors with buddy offset ", buddy_,
                     ", the plan expects ", plan.old_buddy));
  }
  for (int o = 0; o < old_world && !survivor; ++o) {
    if (plan.old_to_new[o] == plan.rank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "memory restore: the plan names this rank as old rank ", o, ", but it holds ",
          has_state_ ? absl::StrCat("rank ", rank_, " of ", layout_.world) : "no state"));
    }
  }
  if (survivor && committed_ != plan.committed_steps) {
    return absl::FailedPreconditionError(absl::StrCat("memory restore: rank holds step ",
                                                      committed_, ", the plan expects ",
                                                      plan.committed_steps));
  }
  const ShardLayout from = ShardLayout::Make(n, old_world);
  // The rank that sends old range o's pieces: its owner, else its buddy.
  auto source = [&](int o) {
    return plan.old_to_new[o] >= 0 ? plan.old_to_new[o]
                                   : plan.old_to_new[(o + plan.old_buddy) % old_world];
  };
  using P2P = collectives::Communicator::PointToPoint;
  std::vector<P2P> moves;
  // Parameters, piece by piece: each new rank's kept ranges ∩ each old range. An owner keeps its
  // range's parameters; a buddy all of them (data parallelism) or its mirror of its owner's.
  uint32_t param_piece = 0;
  for (int d = 0; d < to.world; ++d) {
    absl::StatusOr<Ranges> theirs = d == plan.rank ? held : HeldRanges(to, d, plan.stages);
    if (!theirs.ok()) return theirs.status();
    for (int o = 0; o < old_world; ++o) {
      const int src = source(o);
      for (const auto& [lo, hi] : Intersect(*theirs, from.begin(o), from.end(o))) {
        const uint32_t tag = kTagParamMoveBase + param_piece++;
        float* dst = staged_held_.data() + PackedOffset(held, lo);
        if (src == plan.rank) {
          float* p = plan.old_to_new[o] >= 0 || stages_ == 1
                         ? model_->params() + lo
                         : replica_p_.data() + (lo - from.begin(o));
          if (d == plan.rank) {
            if (absl::Status s = ops_->Copy(dst, p, hi - lo); !s.ok()) return s;
          } else {
            moves.push_back({P2P::Kind::kSend, Buffer::F32(p, hi - lo), d, tag});
          }
        } else if (d == plan.rank) {
          moves.push_back({P2P::Kind::kRecv, Buffer::F32(dst, hi - lo), src, tag});
        }
      }
    }
  }
  // Moments, piece by piece: new range ∩ old range, from the old owner or its buddy's mirror.
  for (absl::Status s :
       {ops_->Assign(&staged_m_, to.per_rank, 0.0f), ops_->Assign(&staged_v_, to.per_rank, 0.0f)}) {
    if (!s.ok()) return s;
  }
  uint32_t piece = 0;
  for (int d = 0; d < to.world; ++d) {
    for (int o = 0; o < old_world; ++o) {
      const int64_t lo = std::max(to.begin(d), from.begin(o));
      const int64_t hi = std::min(to.end(d), from.end(o));
      if (lo >= hi) continue;
      const bool from_owner = plan.old_to_new[o] >= 0;
      const int src = source(o);
      const uint32_t tag = kTagMoveBase + 2 * piece++;
      const size_t count = static_cast<size_t>(hi - lo);
      float* dst_m = staged_m_.data() + (lo - to.begin(d));
      float* dst_v = staged_v_.data() + (lo - to.begin(d));
      if (src == plan.rank) {
        float* sm = (from_owner ? m_.data() : replica_m_.data()) + (lo - from.begin(o));
        float* sv = (from_owner ? v_.data() : replica_v_.data()) + (lo - from.begin(o));
        if (d == plan.rank) {
          for (absl::Status s : {ops_->Copy(dst_m, sm, count), ops_->Copy(dst_v, sv, count)}) {
            if (!s.ok()) return s;
          }
        } else {
          moves.push_back({P2P::Kind::kSend, Buffer::F32(sm, count), d, tag});
          moves.push_back({P2P::Kind::kSend, Buffer::F32(sv, count), d, tag + 1});
        }
      } else if (d == plan.rank) {
        moves.push_back({P2P::Kind::kRecv, Buffer::F32(dst_m, count), src, tag});
        moves.push_back({P2P::Kind::kRecv, Buffer::F32(dst_v, count), src, tag + 1});
      }
    }
  }
  return WaitAll(comm_->PostPointToPoint(moves, options_.collective));
}

// The checkpoint's parameters (all of them) and the moments of this rank's new range, read on
// the host and copied in.
absl::Status ElasticRank::RestoreFromCheckpoint(const GenerationPlan& plan, const ShardLayout& to,
                                                CheckpointStore* store) {
  const int64_t n = model_->num_params();
  if (store == nullptr) return absl::FailedPreconditionError("checkpoint restore: no store");
  absl::StatusOr<Checkpoint> ckpt = store->Load(plan.checkpoint_step);
  if (!ckpt.ok()) return ckpt.status();
  if (ckpt->manifest().num_params != n) {
    return absl::FailedPreconditionError(absl::StrCat(ckpt->dir(), ": num_params: expected ", n,
                                                      ", got ", ckpt->manifest().num_params));
  }
  const Ranges& held = staged_held_ranges_;
  std::vector<float> params(TotalSize(held));
  for (const auto& [lo, hi] : held) {
    if (absl::Status s =
            ckpt->ReadRange(lo, hi, params.data() + PackedOffset(held, lo), nullptr, nullptr);
        !s.ok()) {
      return s;
    }
  }
  std::vector<float> m(to.per_rank, 0.0f), v(to.per_rank, 0.0f);
  const int64_t b = to.begin(plan.rank), e = to.end(plan.rank);
  if (e > b) {
    std::vector<float> scratch(e - b);
    if (absl::Status s = ckpt->ReadRange(b, e, scratch.data(), m.data(), v.data()); !s.ok()) {
      return s;
    }
  }
  for (absl::Status s :
       {ops_->Resize(&staged_m_, to.per_rank), ops_->Resize(&staged_v_, to.per_rank)}) {
    if (!s.ok()) return s;
  }
  for (absl::Status s : {ops_->CopyFromHost(staged_held_.data(), params.data(), params.size()),
                         ops_->CopyFromHost(staged_m_.data(), m.data(), to.per_rank),
                         ops_->CopyFromHost(staged_v_.data(), v.data(), to.per_rank)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::Configure(collectives::Communicator* comm, const GenerationPlan& plan,
                                    CheckpointStore* store, collectives::Communicator* host_comm) {
  // A step this rank staged and the coordinator recorded as committed, but whose commit message
  // never arrived (the coordinator died in between): apply it now. Anything else staged is
  // abandoned.
  if (staged_ == Staged::kStep && plan.source == RestoreSource::kMemory &&
      staged_committed_ == plan.committed_steps) {
    Commit();
  }
  Abandon();
  commit_error_ = absl::OkStatus();  // the state is rebuilt from the plan's source
  comm_ = comm;
  host_comm_ = host_comm != nullptr ? host_comm : comm;
  const int64_t n = model_->num_params();
  const ShardLayout to = ShardLayout::Make(n, plan.world);
  if (plan.rank < 0 || plan.rank >= plan.world || comm->size() != plan.world ||
      comm->rank() != plan.rank || host_comm_->size() != plan.world ||
      host_comm_->rank() != plan.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("configure: plan rank ", plan.rank, " of ", plan.world, ", communicator rank ",
                     comm->rank(), " of ", comm->size(), ", host communicator rank ",
                     host_comm_->rank(), " of ", host_comm_->size()));
  }
  const int old_world = static_cast<int>(plan.old_to_new.size());
  if (!ValidBuddy(plan.buddy, plan.world) ||
      (plan.source == RestoreSource::kMemory && !ValidBuddy(plan.old_buddy, old_world))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "configure: buddy offsets: expected 1 <= buddy < world (1 for a world of one), got ",
        plan.buddy, " of ", plan.world, " (previous generation: ", plan.old_buddy, " of ",
        old_world, ")"));
  }
  if (plan.stages < 1 || plan.world % plan.stages != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("configure: pipeline stages: expected a divisor of the world size ",
                     plan.world, ", got ", plan.stages));
  }
  if (plan.stages > 1) {
    if (model_->staged() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("configure: ", plan.stages, " pipeline stages, but this model (on ",
                       model_->device().ToString(), ") cannot be cut into stages"));
    }
    if (absl::Status s = PartitionUnits(model_->staged()->costs(), plan.stages).status(); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<Ranges> held = HeldRanges(to, plan.rank, plan.stages);
  if (!held.ok()) return held.status();
  staged_held_ranges_ = *held;
  if (absl::Status s = ops_->Resize(&staged_held_, TotalSize(*held)); !s.ok()) return s;
  switch (plan.source) {
    case RestoreSource::kInit: {
      // Initialising writes the model's buffer: whatever this rank held is gone from here on.
      has_state_ = false;
      if (plan.stages == 1) {
        model_->InitParams(options_.seed);
      } else {
        for (const auto& [b, e] : *held) model_->staged()->InitParamRange(options_.seed, b, e);
      }
      for (absl::Status s : {StageHeldFromModel(), ops_->Assign(&staged_m_, to.per_rank, 0.0f),
                             ops_->Assign(&staged_v_, to.per_rank, 0.0f)}) {
        if (!s.ok()) return s;
      }
      break;
    }
    case RestoreSource::kCheckpoint:
      if (absl::Status s = RestoreFromCheckpoint(plan, to, store); !s.ok()) return s;
      break;
    case RestoreSource::kMemory:
      if (absl::Status s = RestoreFromMemory(plan, to); !s.ok()) return s;
      break;
  }
  std::vector<Work> mirror;
  const float* range_params = to.end(plan.rank) > to.begin(plan.rank)
                                  ? staged_held_.data() + PackedOffset(*held, to.begin(plan.rank))
                                  : nullptr;
  if (absl::Status s =
          PostMirror(to, plan.rank, plan.buddy, plan.stages > 1, range_params, staged_m_, staged_v_,
                     &staged_replica_p_, &staged_replica_m_, &staged_replica_v_, &mirror);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WaitAll(mirror); !s.ok()) return s;
  staged_ = Staged::kConfig;
  staged_layout_ = to;
  staged_rank_ = plan.rank;
  staged_buddy_ = plan.buddy;
  staged_stages_ = plan.stages;
  staged_committed_ = plan.committed_steps;
  return absl::OkStatus();
}

void ElasticRank::Commit() {
  if (staged_ == Staged::kNone) return;
  const bool new_grid = staged_ == Staged::kConfig;
  staged_ = Staged::kNone;
  // A step: the buddy's replay of its owner's AdamW on the mirror, from the owner's inputs (its
  // committed parameters: the model's own under data parallelism, which the copy below then
  // overwrites with the same bits; the mirror of them on a grid), so with the owner's bits.
  const int world = staged_layout_.world;
  const int prev = MirroredRank(staged_rank_, staged_buddy_, world);
  const int64_t pb = staged_layout_.begin(prev), pe = staged_layout_.end(prev);
  if (!new_grid && world > 1 && pe > pb) {
    float* p = staged_stages_ > 1 ? replica_p_.data() : model_->params() + pb;
    if (absl::Status s = ops_->AdamWUpdateRange(model_->tensors(), pb, pe, p, mirror_grad_.data(),
                                                replica_m_.data(), replica_v_.data(),
                                                options_.adamw, staged_scalars_);
        !s.ok()) {
      has_state_ = false;
      commit_error_ = absl::Status(s.code(), absl::StrCat("commit: ", s.message()));
      return;
    }
  }
  for (const auto& [b, e] : staged_held_ranges_) {
    if (absl::Status s =
            ops_->Copy(model_->params() + b,
                       staged_held_.data() + PackedOffset(staged_held_ranges_, b), e - b);
        !s.ok()) {
      // The model's parameters are now neither the old nor the new state.
      has_state_ = false;
      commit_error_ = absl::Status(s.code(), absl::StrCat("commit: ", s.message()));
      return;
    }
  }
  // A new generation's rank may keep fewer parameters: the model's parameters and gradients
  // (which a stage writes only within its ranges) outside the kept ranges go back to the memory.
  // A failure there only keeps the memory: nothing reads those ranges.
  if (new_grid) {
    Ranges gaps;
    int64_t at = 0;
    for (const auto& [b, e] : staged_held_ranges_) {
      if (b > at) gaps.emplace_back(at, b);
      at = e;
    }
    if (at < model_->num_params()) gaps.emplace_back(at, model_->num_params());
    for (const auto& [b, e] : gaps) {
      ops_->Discard(model_->params() + b, e - b).IgnoreError();
      ops_->Discard(const_cast<float*>(model_->grads()) + b, e - b).IgnoreError();
    }
    // The configuration's mirror replaces the old one.
    replica_p_ = std::move(staged_replica_p_);
    replica_m_ = std::move(staged_replica_m_);
    replica_v_ = std::move(staged_replica_v_);
  }
  m_.swap(staged_m_);
  v_.swap(staged_v_);
  layout_ = staged_layout_;
  rank_ = staged_rank_;
  buddy_ = staged_buddy_;
  stages_ = staged_stages_;
  committed_ = staged_committed_;
  has_state_ = true;
}

void ElasticRank::Abandon() { staged_ = Staged::kNone; }

}  // namespace troupe::actors
