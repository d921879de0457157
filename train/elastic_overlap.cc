// ElasticRank's data-parallel step with its communication hidden behind compute (deterministic
// mode; docs/ARCHITECTURE.md, "The training step"):
//
//   backward of the last microbatch:  ▓▓▓ln_f▓▓▓ block L-1 ▓▓▓ … ▓▓▓ block 0 ▓▓▓ embeddings ▓▓▓
//   gradient pieces to their owners:        ▒▒▒▒▒          ▒▒▒▒▒         ▒▒▒▒▒            ▒▒▒▒▒
//   owners combine as pieces arrive:            ░░              ░░            ░░              ░░
//   combined pieces to the buddy's mirror:        ▒▒              ▒▒            ▒▒              ▒▒
//   then: norm (chunk sums were summed per piece) │ AdamW piece 0 ▓ piece 1 ▓ …
//   updated pieces to every rank but the buddy:                   ▒▒▒▒▒     ▒▒▒▒▒
//
// The flat gradient is cut into pieces: each owner's range in buckets of bucket_floats (a
// multiple of the norm's 4 Ki chunk). As the model reports ranges of its gradient final
// (Trainable::ComputeGradientReporting), this rank finishes its canonical subtree of those ranges
// (TreeAccumulator::FinishRangeWith: the bits of the serial sum; a host rank of one microbatch
// sends from the model's gradient itself, ElasticRank::subtree_) and sends each piece they
// complete to its owner at once; the owner combines the ranks' partials of a piece in the
// canonical tree (the plan every ordered reduce-scatter runs) as soon as all arrive, and sums
// its norm chunks there. The norm needs every rank's chunks, so AdamW waits for it (clipping is
// global); then each piece of the range is updated and sent to every rank while the next piece
// is being updated — every rank but the buddy, which runs the owner's AdamW on its mirror from
// the gradient the mirror brought, and so sends nothing a replicated step would not. The owner
// sends each combined piece to the buddy at once (on NCCL, whose point-to-point matches in
// posting order, the whole range once the exchange is done: PostMirror). On slow links the
// updated pieces travel as lossless deltas (Options::param_delta, param_delta.h).
//
// Replicated optimizer state (Options::replicate_optimizer): the pieces are buckets of the whole
// flat gradient, piece j combined by rank j mod W (PlanSharedGradientPieces) — the pieces the
// backward pass finishes together go to different ranks, where the owners' contiguous ranges would
// pour them all into one host's link. A combiner sends each combined piece to every rank at once
// (the reduced gradient needs no norm, so this share runs behind the backward pass, as DDP's
// all-reduce does); every rank sums the norm chunks of every piece as it arrives, so the norm needs
// no collective, and Commit runs AdamW on every parameter in place (nothing staged: an abandoned
// step never touched the state). Nothing is gathered behind AdamW and no mirror is sent. The shares
// are posted in arrival order, so this variant is for tag-matching transports (the host's), not
// NCCL's issue order; Configure refuses it on a device.
//
// Order, on NCCL: every rank posts the same groups in the same order — a piece's group when the
// model's reports complete it (the same reports on every rank), then the mirror, then the
// all-gather's rounds — so a backend whose point-to-point operations run in issue order cannot
// deadlock (a tag-matching one takes the mirror piece by piece, as pieces are combined). Bits:
// which piece travels when changes no addition, so deterministic mode is bit-identical for any
// bucket size and world size.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "elastic_internal.h"
#include "param_delta.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/canonical_combine.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/optimizer.h"
#include "troupe/train/elastic.h"

namespace troupe::train {
namespace {

using collectives::Buffer;
using collectives::Work;
using elastic_internal::ExchangePiece;
using elastic_internal::kTagExchange;
using elastic_internal::kTagParamShare;
using elastic_internal::kTagPipelineBase;
using elastic_internal::Phase;
using elastic_internal::StepTagBits;
using elastic_internal::Stopwatch;

// A combined piece's tag kind: replicated, its share to every rank; sharded, its mirror to the
// buddy (the two never meet in one step).
constexpr uint32_t kTagSharePiece = kTagExchange | kTagParamShare, kTagMirrorPiece = kTagSharePiece;

// A framed parameter piece's first `bytes` bytes (train/param_delta.h) as a message: whole floats
// (its buffers hold DeltaCapacity bytes, a multiple of 4).
Buffer WireBuffer(std::vector<uint8_t>& w, size_t bytes) {
  return Buffer::F32(reinterpret_cast<float*>(w.data()), (bytes + 3) / 4);
}
using elastic_internal::WaitAll;
using P2P = collectives::Communicator::PointToPoint;

bool AllDone(const std::vector<Work>& works) {
  return std::all_of(works.begin(), works.end(), [](const Work& w) { return w.IsDone(); });
}

constexpr int64_t kChunk = kernels::kNormChunk;
// Shared memory moves a piece in a fraction of the time a network does, so there fewer, larger
// pieces cost less per-message overhead; across hosts smaller ones start the wire sooner.
constexpr int64_t kSameHostBucketBytes = 16 << 20, kNetworkBucketBytes = 4 << 20;

}  // namespace

int64_t BucketFloats(int64_t bucket_bytes, bool same_host) {
  if (bucket_bytes <= 0) bucket_bytes = same_host ? kSameHostBucketBytes : kNetworkBucketBytes;
  const int64_t floats = bucket_bytes / static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(kChunk, floats / kChunk * kChunk);
}

std::vector<GradientPiece> PlanGradientPieces(const ShardLayout& layout, int64_t n,
                                              int64_t bucket_floats) {
  std::vector<GradientPiece> pieces;
  for (int owner = 0; owner < layout.world; ++owner) {
    const int64_t b = layout.begin(owner), e = std::min(layout.end(owner), n);
    for (int32_t j = 0; b + j * bucket_floats < e; ++j) {
      pieces.push_back({owner, j, b + j * bucket_floats, std::min(e, b + (j + 1) * bucket_floats)});
    }
  }
  return pieces;
}

std::vector<GradientPiece> PlanSharedGradientPieces(int64_t n, int world, int64_t bucket_floats) {
  const int64_t share = (n + world - 1) / world;
  const int64_t bucket =
      std::max<int64_t>(kChunk, std::min(bucket_floats, (share + kChunk - 1) / kChunk * kChunk));
  std::vector<GradientPiece> pieces;
  for (int32_t j = 0; int64_t{j} * bucket < n; ++j) {
    pieces.push_back({j % world, j, j * bucket, std::min(n, (j + 1) * bucket)});
  }
  return pieces;
}

// One overlapped step's exchange: the pieces, what has been posted and combined, the works in
// flight. Lives for one RunStep; the buffers it fills are ElasticRank's.
class ElasticRank::OverlappedStep {
 public:
  OverlappedStep(ElasticRank* r, int64_t step,
                 const std::vector<std::pair<int32_t, int32_t>>& blocks)
      : r_(*r), c_(r->committed_state_), step_(step), blocks_(blocks) {}

  absl::Status Run(int32_t lo, int32_t hi, StepOutcome* out);

 private:
  absl::Status Prepare();
  // The model reported my subtree's [begin, end) final: post every piece that completes.
  void Ready(int64_t begin, int64_t end);
  void PostPiece(size_t i);
  // Combines my pieces whose partials have all arrived (with `wait`: all of them, each as soon as
  // it is here, waiting for them in the order they were posted).
  absl::Status CombineArrived(bool wait);
  absl::Status CombinePiece(size_t i);
  absl::Status PostMirror();
  absl::StatusOr<double> Norm();
  absl::Status UpdateAndGather(double grad_norm);
  // Framed parameter pieces (ParamDelta): the received ones into staged_held_, and this rank's
  // choice for its next share from how fast this one's sends went.
  absl::Status DecodeFramed(double* seconds);
  // Notes the first time every one of my parameter sends is seen done (sends_done_).
  void NoteSendsDone();
  // replicate_optimizer: my combined piece i to every rank; the norm and the step's scalars once
  // every piece is here.
  void SharePiece(size_t i);
  absl::Status NormFromShares(StepOutcome* out);
  float* RecvSlot(int d, size_t i) {
    return r_.exchange_recv_.data() + (d < c_.rank ? d : d - 1) * stride_ + slot_[i];
  }
  // Where flat element `lo` of the step gradient is: grad_shard_ holds my range, or (replicated)
  // the whole padded vector.
  float* Grad(int64_t lo) { return r_.grad_shard_.data() + (lo - (replicated_ ? 0 : b_)); }
  uint32_t Tag(uint32_t kind, size_t i) const {
    return kTagPipelineBase | kind | StepTagBits(step_) | static_cast<uint32_t>(i);
  }
  // After a failure with operations in flight: they must not outlive the buffers they fill.
  absl::Status Fail(absl::Status s);

  ElasticRank& r_;
  const RankState& c_;
  const int64_t step_;
  const std::vector<std::pair<int32_t, int32_t>>& blocks_;
  int64_t b_ = 0, e_ = 0;  // my range
  collectives::CombinePlan plan_;
  std::vector<GradientPiece> pieces_;
  std::vector<int64_t> missing_;  // by piece: elements not yet reported final
  // The pieces in the order they were posted: the order their partials arrive (every rank's
  // backward pass finishes them in the same order, the reverse of the flat one for a GPT), so the
  // order to wait for them in — waiting by index waited for the embeddings' piece, the last one,
  // while the pieces that had arrived before it sat uncombined and unshared.
  std::vector<size_t> posted_;
  size_t combined_upto_ = 0;  // posted_[0, combined_upto_) holds none of mine left to combine
  std::vector<std::vector<Work>> in_;         // by piece: my pieces' receives / others' sends
  std::vector<std::vector<Work>> shared_in_;  // replicated: by piece, its owner's share to me
  bool replicated_ = false;
  // Seconds the update waited on peers: replicated, for the shares (NormFromShares); sharded,
  // for the buddy's gradient of the range it mirrors.
  double wait_ = 0;
  // Where the other ranks' partials of my pieces land in exchange_recv_: rank d's (d < me ? d :
  // d - 1) · stride_ + slot_[piece] (my range's offset, or the pieces' packed one when replicated).
  std::vector<int64_t> slot_;
  int64_t stride_ = 0;
  std::vector<double> all_sums_;    // replicated: every real norm chunk's, from every piece
  std::vector<char> combined_;      // by piece (mine)
  std::vector<double> chunk_sums_;  // my range's norm chunks
  std::vector<Work> sends_, mirror_, gather_;
  // The parameter share's pieces travel framed this step (ParamDelta, the same on every rank):
  // mine encoded into r_.delta_wire_ (delta or raw), the others' received there.
  bool framed_ = false;
  bool encoded_ = false;            // mine as deltas
  std::vector<Work> gather_sends_;  // of gather_: mine
  std::vector<size_t> framed_in_;   // pieces received framed
  std::vector<Work> framed_works_;  // of gather_: their receives, by framed_in_'s order
  bool compressed_ = false;         // a piece of mine went compressed
  uint64_t gather_sent_bytes_ = 0;  // what my sends carried
  double gather_first_send_ = -1;   // step_clock_ time of my first
  double gather_last_send_ = -1;    // ... and of my last posted
  double sends_done_ = -1;          // when they were first all seen done
  std::vector<Work> mirror_in_;     // of mirror_: the gradient of the range I mirror
  // Sharded, on a communicator that matches by tag: each piece of my range goes to my buddy as
  // soon as it is combined. NCCL's in-order point-to-point needs every rank's posts in one order,
  // which pieces combined as they arrive would not keep: there the range goes whole once the
  // exchange is done (PostMirror).
  bool mirror_by_piece_ = false;
  int prev_ = -1;       // with mirror_by_piece_: the rank whose range I mirror
  absl::Status error_;  // the first failure of a Ready callback
  bool posted_any_ = false;
  Stopwatch step_clock_;
  double first_post_ = -1;
};

absl::Status ElasticRank::OverlappedStep::Prepare() {
  const ShardLayout& layout = c_.layout;
  const int world = layout.world;
  b_ = layout.begin(c_.rank);
  e_ = layout.end(c_.rank);
  replicated_ = r_.options_.replicate_optimizer;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const auto& [lo, hi] : blocks_) intervals.emplace_back(lo, hi);
  TROUPE_ASSIGN_OR_RETURN(plan_, collectives::PlanCanonicalCombine(intervals));
  const int64_t n = r_.model_->num_params();
  const bool same_host = r_.comm_->PeersShareHost();
  const int64_t bucket = BucketFloats(r_.options_.bucket_bytes, same_host);
  pieces_ = replicated_ ? PlanSharedGradientPieces(n, world, bucket)
                        : PlanGradientPieces(layout, n, bucket);
  if (pieces_.size() >= (size_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("bucket_bytes: ", pieces_.size(),
                                                   " gradient pieces, expected fewer than 2^20"));
  }
  missing_.clear();
  for (const GradientPiece& p : pieces_) missing_.push_back(p.hi - p.lo);
  posted_.clear();
  combined_upto_ = 0;
  in_.assign(pieces_.size(), {});
  combined_.assign(pieces_.size(), 0);
  chunk_sums_.assign(static_cast<size_t>(layout.per_rank / kChunk), 0.0);
  model::ArrayOps* ops = r_.ops_;
  const int64_t padded = layout.padded(), per_rank = layout.per_rank;
  TROUPE_RETURN_IF_ERROR(ops->Resize(&r_.partial_, padded));
  TROUPE_RETURN_IF_ERROR(ops->Resize(&r_.grad_shard_, replicated_ ? padded : per_rank));
  slot_.assign(pieces_.size(), -1);
  stride_ = replicated_ ? 0 : per_rank;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const GradientPiece& p = pieces_[i];
    if (p.owner != c_.rank) continue;
    slot_[i] = replicated_ ? stride_ : p.lo - b_;
    if (replicated_) stride_ += p.hi - p.lo;
  }
  TROUPE_RETURN_IF_ERROR(
      ops->Resize(&r_.exchange_recv_, std::max<int64_t>(1, (world - 1) * stride_)));
  shared_in_.assign(pieces_.size(), {});
  if (replicated_) all_sums_.assign(static_cast<size_t>((n + kChunk - 1) / kChunk), 0.0);
  mirror_by_piece_ = !replicated_ && world > 1 && r_.comm_->MatchesByTag();
  if (mirror_by_piece_) {
    TROUPE_RETURN_IF_ERROR(ops->Resize(&r_.mirror_grad_, per_rank));
    prev_ = MirroredRank(c_.rank, c_.buddy, world);
  }
  // My range's padding: no piece covers it.
  return ops->Fill(Grad(e_), per_rank - (e_ - b_), 0.0f);
}

void ElasticRank::OverlappedStep::Ready(int64_t begin, int64_t end) {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const int64_t lo = std::max(begin, pieces_[i].lo), hi = std::min(end, pieces_[i].hi);
    if (lo >= hi) continue;
    missing_[i] -= hi - lo;
    if (missing_[i] == 0) PostPiece(i);
  }
  if (error_.ok()) error_ = CombineArrived(/*wait=*/false);
}

void ElasticRank::OverlappedStep::PostPiece(size_t i) {
  const GradientPiece& p = pieces_[i];
  const uint32_t tag = Tag(kTagExchange, i);
  std::vector<P2P> moves;
  const int world = c_.layout.world, me = c_.rank;
  if (p.owner != me) {
    moves.push_back(
        {P2P::Kind::kSend,
         Buffer::F32(const_cast<float*>(r_.subtree_) + p.lo, static_cast<size_t>(p.hi - p.lo)),
         p.owner, tag});
    // Replicated: the owner's combined piece back, posted with my partial (the owner cannot
    // share it before my partial arrived), so its deadline counts from here, not the step's start.
    if (replicated_) {
      moves.push_back({P2P::Kind::kRecv, Buffer::F32(Grad(p.lo), static_cast<size_t>(p.hi - p.lo)),
                       p.owner, Tag(kTagSharePiece, i)});
    }
    // The same for the combined piece of the range I mirror.
    if (mirror_by_piece_ && p.owner == prev_) {
      const int64_t at = p.lo - c_.layout.begin(prev_);
      moves.push_back({P2P::Kind::kRecv,
                       Buffer::F32(r_.mirror_grad_.data() + at, static_cast<size_t>(p.hi - p.lo)),
                       p.owner, Tag(kTagMirrorPiece, i)});
    }
  } else {
    for (int d = 0; d < world; ++d) {
      if (d == me) continue;
      moves.push_back({P2P::Kind::kRecv,
                       Buffer::F32(RecvSlot(d, i), static_cast<size_t>(p.hi - p.lo)), d, tag});
    }
  }
  if (first_post_ < 0) first_post_ = step_clock_.Seconds();
  posted_.push_back(i);
  std::vector<Work> works = r_.comm_->PostPointToPoint(moves, r_.options_.collective);
  if (p.owner == me) {
    in_[i] = std::move(works);
  } else {
    if (works.size() == 2) {  // [send my partial, receive the share or the mirror]
      if (replicated_) {
        shared_in_[i] = {works[1]};
      } else {
        mirror_.push_back(works[1]);
        mirror_in_.push_back(works[1]);
      }
      works.pop_back();
    }
    sends_.insert(sends_.end(), works.begin(), works.end());
  }
  if (!posted_any_) {
    posted_any_ = true;
    if (r_.options_.on_point) r_.options_.on_point(step_, StepPoint::kExchange);
  }
}

absl::Status ElasticRank::OverlappedStep::CombineArrived(bool wait) {
  for (;;) {
    const size_t none = pieces_.size();
    auto done = [this](size_t i) { return pieces_[i].owner != c_.rank || combined_[i]; };
    while (combined_upto_ < posted_.size() && done(posted_[combined_upto_])) ++combined_upto_;
    size_t next = none;  // the first of mine still on the wire, in the order they should arrive
    for (size_t k = combined_upto_; k < posted_.size(); ++k) {
      const size_t i = posted_[k];
      if (done(i)) continue;
      if (!AllDone(in_[i])) {
        if (next == none) next = i;
        continue;
      }
      if (absl::Status s = WaitAll(in_[i]); !s.ok()) return Phase("gradient exchange", s);
      TROUPE_RETURN_IF_ERROR(CombinePiece(i));
    }
    if (!wait || next == none) return absl::OkStatus();
    if (absl::Status s = WaitAll(in_[next]); !s.ok()) return Phase("gradient exchange", s);
  }
}

absl::Status ElasticRank::OverlappedStep::CombinePiece(size_t i) {
  const GradientPiece& p = pieces_[i];
  const int world = c_.layout.world, me = c_.rank;
  ExchangePiece piece{p.lo, p.hi, std::vector<const float*>(world, nullptr)};
  for (int d = 0; d < world; ++d) {
    piece.partial[d] = d == me ? r_.subtree_ + p.lo : RecvSlot(d, i);
  }
  TROUPE_RETURN_IF_ERROR(
      elastic_internal::CombinePieces(r_.ops_, plan_, {piece}, Grad(b_), b_, &r_.combine_inner_));
  TROUPE_ASSIGN_OR_RETURN(
      std::vector<double> sums,
      r_.ops_->RangeChunkSquareSums(Grad(p.lo), p.lo, p.hi, r_.model_->num_params()));
  std::copy(
      sums.begin(), sums.end(),
      replicated_ ? all_sums_.begin() + p.lo / kChunk : chunk_sums_.begin() + (p.lo - b_) / kChunk);
  combined_[i] = 1;
  if (replicated_) SharePiece(i);
  if (mirror_by_piece_) {
    const std::vector<P2P> mirror{{P2P::Kind::kSend,
                                   Buffer::F32(Grad(p.lo), static_cast<size_t>(p.hi - p.lo)),
                                   BuddyRank(me, c_.buddy, world), Tag(kTagMirrorPiece, i)}};
    std::vector<Work> works = r_.comm_->PostPointToPoint(mirror, r_.options_.collective);
    mirror_.insert(mirror_.end(), works.begin(), works.end());
  }
  return absl::OkStatus();
}

void ElasticRank::OverlappedStep::SharePiece(size_t i) {
  const GradientPiece& p = pieces_[i];
  const Buffer buf = Buffer::F32(Grad(p.lo), static_cast<size_t>(p.hi - p.lo));
  std::vector<P2P> moves;
  for (int d = 0; d < c_.layout.world; ++d) {
    if (d != c_.rank) moves.push_back({P2P::Kind::kSend, buf, d, Tag(kTagSharePiece, i)});
  }
  const bool first = gather_.empty();
  std::vector<Work> works = r_.comm_->PostPointToPoint(moves, r_.options_.collective);
  gather_.insert(gather_.end(), works.begin(), works.end());
  if (first && !works.empty() && r_.options_.on_point)
    r_.options_.on_point(step_, StepPoint::kGather);
}

// Every other rank's pieces as their shares arrive, each one's norm chunks summed on arrival
// (mine were in CombinePiece): the norm from all of them, here, in the fixed tree — no
// collective — and the step's AdamW scalars. Commit runs AdamW on every parameter in place.
absl::Status ElasticRank::OverlappedStep::NormFromShares(StepOutcome* out) {
  model::ArrayOps* ops = r_.ops_;
  const int64_t n = r_.model_->num_params();
  auto here = [this](size_t i) { return AllDone(shared_in_[i]); };
  std::vector<size_t> pending;  // in the order the shares should arrive in
  for (size_t i : posted_) {
    if (pieces_[i].owner != c_.rank) pending.push_back(i);
  }
  while (!pending.empty()) {
    if (std::none_of(pending.begin(), pending.end(), here)) {  // wait for the first
      const Stopwatch waited;
      const absl::Status s = WaitAll(shared_in_[pending.front()]);
      wait_ += waited.Seconds();
      if (!s.ok()) return Phase("gradient share", s);
    }
    std::vector<size_t> later;
    for (size_t i : pending) {
      if (!here(i)) {
        later.push_back(i);
        continue;
      }
      if (absl::Status s = WaitAll(shared_in_[i]); !s.ok()) return Phase("gradient share", s);
      const GradientPiece& p = pieces_[i];
      TROUPE_ASSIGN_OR_RETURN(std::vector<double> sums,
                              ops->RangeChunkSquareSums(Grad(p.lo), p.lo, p.hi, n));
      std::copy(sums.begin(), sums.end(), all_sums_.begin() + p.lo / kChunk);
    }
    pending = std::move(later);
  }
  out->grad_norm = model::GradNormFromChunks(all_sums_);
  r_.staged_scalars_ =
      model::StepScalars(r_.options_.adamw, r_.options_.schedule, step_, out->grad_norm);
  return absl::OkStatus();
}

absl::Status ElasticRank::OverlappedStep::PostMirror() {
  if (c_.layout.world == 1 || mirror_by_piece_) return absl::OkStatus();
  TROUPE_RETURN_IF_ERROR(r_.ops_->Resize(&r_.mirror_grad_, c_.layout.per_rank));
  std::vector<P2P> moves;
  elastic_internal::AddRangeMirror(c_.layout, c_.rank, c_.buddy, r_.grad_shard_.data(),
                                   r_.mirror_grad_.data(), elastic_internal::kTagMirrorGrad,
                                   &moves);
  mirror_ = r_.comm_->PostPointToPoint(moves, r_.options_.collective);
  for (size_t i = 0; i < moves.size(); ++i) {
    if (moves[i].kind == P2P::Kind::kRecv) mirror_in_.push_back(mirror_[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ElasticRank::OverlappedStep::Norm() {
  return r_.GradNormFromChunkSums(chunk_sums_);
}

// AdamW piece by piece into staged_held_ (the whole model's staged parameters), each piece sent to
// every rank but my buddy as soon as it is updated; round j carries piece j of every owner's
// range. Then the range I mirror: its owner's AdamW here, on the staged mirror (StageBuddyAdamW),
// instead of its updated parameters over the wire — the buddy mirror costs no bytes beyond the
// gradient it sends, so a sharded step sends what a replicated one does.
absl::Status ElasticRank::OverlappedStep::UpdateAndGather(double grad_norm) {
  model::ArrayOps* ops = r_.ops_;
  RankState& staged = r_.staged_state_;
  r_.staged_scalars_ =
      model::StepScalars(r_.options_.adamw, r_.options_.schedule, step_, grad_norm);
  r_.staged_params_ = model::FloatArray();
  // AdamW runs out of place: from the model's parameters and the committed moments (untouched)
  // into staged_held_ and the staged moments.
  TROUPE_RETURN_IF_ERROR(r_.StageCarriedPadding({{&staged.m, &c_.m}, {&staged.v, &c_.v}}, e_ - b_));
  TROUPE_RETURN_IF_ERROR(ops->Resize(&r_.staged_held_, c_.layout.padded()));
  const int world = c_.layout.world, me = c_.rank;
  const bool mirrors = r_.StepAdvancesMirror();
  const int buddy = mirrors ? BuddyRank(me, c_.buddy, world) : -1;
  const int prev = mirrors ? MirroredRank(me, c_.buddy, world) : -1;
  int32_t rounds = 0;
  for (const GradientPiece& p : pieces_) rounds = std::max(rounds, p.index + 1);
  const ParamDelta mode = r_.options_.param_delta;
  framed_ = ops->host_accessible() &&
            (mode == ParamDelta::kOn || (mode == ParamDelta::kAuto && !r_.comm_->PeersShareHost()));
  encoded_ = framed_ && (mode == ParamDelta::kOn || r_.delta_next_);
  if (framed_) r_.delta_wire_.resize(pieces_.size());
  const float* base = r_.model_->params();  // the committed step's: every rank's bits
  for (int32_t j = 0; j < rounds; ++j) {
    std::vector<P2P> moves;
    const uint64_t sent_before = gather_sent_bytes_;
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const GradientPiece& p = pieces_[i];
      if (p.index != j) continue;
      const uint32_t tag = Tag(kTagParamShare, i);
      float* params = r_.staged_held_.data() + p.lo;
      const Buffer buf = Buffer::F32(params, static_cast<size_t>(p.hi - p.lo));
      const size_t count = static_cast<size_t>(p.hi - p.lo);
      if (p.owner != me) {
        if (p.owner == prev) continue;
        if (!framed_) {
          moves.push_back({P2P::Kind::kRecv, buf, p.owner, tag});
          continue;
        }
        // Framed: received whole (header + raw floats at most) into the piece's wire buffer.
        std::vector<uint8_t>& w = r_.delta_wire_[i];
        w.resize(DeltaCapacity(count));
        framed_in_.push_back(i);
        moves.push_back({P2P::Kind::kRecv, WireBuffer(w, w.size()), p.owner, tag});
        continue;
      }
      const int64_t at = p.lo - b_;
      const kernels::AdamWSources from{r_.model_->params() + p.lo, c_.m.data() + at,
                                       c_.v.data() + at};
      TROUPE_RETURN_IF_ERROR(ops->AdamWUpdateRange(r_.model_->tensors(), p.lo, p.hi, params,
                                                   r_.grad_shard_.data() + at, staged.m.data() + at,
                                                   staged.v.data() + at, r_.options_.adamw,
                                                   r_.staged_scalars_, &from));
      Buffer out = buf;
      if (framed_ && world > (buddy >= 0 ? 2 : 1)) {
        std::vector<uint8_t>& w = r_.delta_wire_[i];
        w.resize(DeltaCapacity(count));
        const size_t bytes =
            encoded_ ? EncodeDelta(params, base + p.lo, count, w.data(), &r_.delta_scratch_)
                     : EncodeRaw(params, count, w.data());
        out = WireBuffer(w, bytes);
        compressed_ = compressed_ || DeltaCompressed(w.data(), bytes);
      }
      for (int d = 0; d < world; ++d) {
        if (d != me && d != buddy) {
          moves.push_back({P2P::Kind::kSend, out, d, tag});
          gather_sent_bytes_ += out.count * sizeof(float);
        }
      }
    }
    if (gather_sent_bytes_ > sent_before) {
      gather_last_send_ = step_clock_.Seconds();
      if (gather_first_send_ < 0) gather_first_send_ = gather_last_send_;
    }
    std::vector<Work> works = r_.comm_->PostPointToPoint(moves, r_.options_.collective);
    for (size_t k = 0; k < moves.size(); ++k) {
      if (moves[k].kind == P2P::Kind::kSend) {
        gather_sends_.push_back(works[k]);
        sends_done_ = -1;  // not all done until seen again
      } else if (framed_) {
        framed_works_.push_back(works[k]);
      }
    }
    gather_.insert(gather_.end(), works.begin(), works.end());
    if (j == 0 && r_.options_.on_point) r_.options_.on_point(step_, StepPoint::kGather);
    NoteSendsDone();
  }
  if (!mirrors) return absl::OkStatus();
  TROUPE_RETURN_IF_ERROR(r_.StageMirror());  // while my updated pieces are on the wire
  NoteSendsDone();
  const Stopwatch mirror_wait;
  if (absl::Status s = WaitAll(mirror_in_); !s.ok()) return Phase("buddy mirror", s);
  wait_ += mirror_wait.Seconds();
  NoteSendsDone();
  for (const GradientPiece& p : pieces_) {
    if (p.owner != prev) continue;
    TROUPE_RETURN_IF_ERROR(r_.StageBuddyAdamW(p.lo, p.hi));
    NoteSendsDone();  // by piece: the buddy's AdamW is not my sends' time
  }
  return absl::OkStatus();
}

void ElasticRank::OverlappedStep::NoteSendsDone() {
  if (sends_done_ >= 0 || gather_sends_.empty()) return;
  for (const Work& w : gather_sends_) {
    if (!w.IsDone()) return;
  }
  sends_done_ = step_clock_.Seconds();
}

// Each framed piece decoded into staged_held_ as soon as it is here, while the later ones are
// still on the wire; adds the decoding's time to *seconds. Then this rank's choice for its next
// share (EncodeNextShare): from the bytes its sends carried to every receiver, the time from the
// first posted to the last (its AdamW and encoding of the later pieces) and to all seen done.
absl::Status ElasticRank::OverlappedStep::DecodeFramed(double* seconds) {
  const float* base = r_.model_->params();
  for (size_t k = 0; k < framed_in_.size(); ++k) {
    NoteSendsDone();  // while waiting on peers: not this rank's sends' time
    if (absl::Status s = WaitAll({framed_works_[k]}); !s.ok()) return s;
    const Stopwatch decoding;
    const GradientPiece& p = pieces_[framed_in_[k]];
    const std::vector<uint8_t>& w = r_.delta_wire_[framed_in_[k]];
    const absl::Status d =
        DecodeDelta(w.data(), w.size(), base + p.lo, static_cast<size_t>(p.hi - p.lo),
                    r_.staged_held_.data() + p.lo, &r_.delta_scratch_);
    *seconds += decoding.Seconds();
    if (!d.ok()) {
      return absl::Status(d.code(), absl::StrCat("piece ", framed_in_[k], " from rank ", p.owner,
                                                 ": ", d.message()));
    }
  }
  if (gather_sent_bytes_ > 0) {
    TROUPE_RETURN_IF_ERROR(WaitAll(gather_sends_));
    NoteSendsDone();
    r_.delta_next_ =
        EncodeNextShare(r_.delta_next_, gather_sent_bytes_, gather_last_send_ - gather_first_send_,
                        sends_done_ - gather_first_send_);
  }
  return absl::OkStatus();
}

absl::Status ElasticRank::OverlappedStep::Fail(absl::Status s) {
  std::vector<Work> all = sends_;
  for (const auto& v : {mirror_, gather_}) all.insert(all.end(), v.begin(), v.end());
  for (const auto& v : in_) all.insert(all.end(), v.begin(), v.end());
  for (const auto& v : shared_in_) all.insert(all.end(), v.begin(), v.end());
  if (!AllDone(all)) {
    // This step is over on this rank: the communicator's generation cannot finish it either.
    r_.comm_->Abort(s);
    (void)WaitAll(all);
  }
  return s;
}

absl::Status ElasticRank::OverlappedStep::Run(int32_t lo, int32_t hi, StepOutcome* out) {
  TROUPE_RETURN_IF_ERROR(Prepare());
  absl::Status s =
      r_.AccumulateSubtree(step_, lo, hi, out, [this](int64_t b, int64_t e) { Ready(b, e); });
  if (s.ok()) s = error_;
  if (!s.ok()) return Fail(s);
  // Everything not reported is final now (ComputeGradientReporting returned).
  const double compute_end = step_clock_.Seconds();
  if (absl::Status c = CombineArrived(/*wait=*/true); !c.ok()) return Fail(c);
  if (absl::Status w = WaitAll(sends_); !w.ok()) return Fail(Phase("gradient exchange", w));
  const double exchanged = step_clock_.Seconds();
  if (first_post_ >= 0) {
    out->exchange_seconds += exchanged - first_post_;
    out->exposed_seconds += exchanged - compute_end;
  }
  double norm_seconds = 0, update_start = 0;
  if (replicated_) {  // the norm is summed here from the shares: no collective
    update_start = step_clock_.Seconds();
    if (absl::Status u = NormFromShares(out); !u.ok()) return Fail(u);
  } else {
    if (absl::Status m = PostMirror(); !m.ok()) return Fail(m);
    const Stopwatch norm_clock;
    absl::StatusOr<double> norm = Norm();
    if (!norm.ok()) return Fail(norm.status());
    out->grad_norm = *norm;
    norm_seconds = norm_clock.Seconds();
    update_start = step_clock_.Seconds();
    if (absl::Status u = UpdateAndGather(*norm); !u.ok()) return Fail(u);
  }
  const double updated = step_clock_.Seconds() - wait_;  // the update's own time ends here
  double decoding = 0;  // framed pieces: the optimizer's output decoded (update_seconds)
  absl::Status gathered = framed_ ? DecodeFramed(&decoding) : absl::OkStatus();
  // All of it, whatever the decoding found: a piece that does not decode fails this step on this
  // rank alone (Fail aborts the communicator only with operations still in flight).
  const absl::Status all = WaitAll(gather_);
  if (gathered.ok()) gathered = all;
  const absl::Status mirrored = WaitAll(mirror_);
  const double shared = step_clock_.Seconds() - decoding;
  out->update_seconds += updated - update_start + decoding;
  out->exchange_seconds += shared - update_start;
  out->exposed_seconds += shared - updated;
  out->collective_seconds += (exchanged - compute_end) + norm_seconds + (shared - updated);
  if (!gathered.ok()) {
    return Fail(Phase(replicated_ ? "gradient share" : "parameter all-gather", gathered));
  }
  if (!mirrored.ok()) return Fail(Phase("buddy mirror", mirrored));
  out->param_delta = compressed_;
  return absl::OkStatus();
}

absl::Status ElasticRank::RunOverlappedStep(int64_t step,
                                            const std::vector<std::pair<int32_t, int32_t>>& blocks,
                                            StepOutcome* out) {
  const auto [lo, hi] = blocks[committed_state_.rank];
  OverlappedStep overlapped(this, step, blocks);
  return overlapped.Run(lo, hi, out);
}

}  // namespace troupe::train
