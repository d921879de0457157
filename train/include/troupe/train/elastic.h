// troupe/train/elastic.h — one rank of the data-parallel step with a sharded optimizer, over a
// collectives::Communicator. The rank actor (training.h) drives it; unit tests drive several with
// the in-process backend.
//
// The step (docs/ARCHITECTURE.md, "The training step" and "Determinism"):
//   1. rank r computes microbatches [lo, hi) of the M — a power-of-two-aligned block, so its local
//      canonical tree sum is a whole subtree of T(0, M);
//   2. ordered reduce-scatter keyed by those intervals: rank r receives the step gradient of its
//      parameter range, combined in canonical tree order (bit-exact for any W). In deterministic
//      mode it overlaps the last microbatch's backward pass: each piece of the gradient goes to
//      its owner as soon as the model reports it final (elastic_overlap.cc, PlanGradientPieces),
//      and step 4's all-gather goes piece by piece behind AdamW;
//   3. gradient norm from fixed 4 Ki chunks: each rank's chunk sums are all-gathered and summed
//      in a fixed tree over the model's real chunks only (padding never enters);
//   4. AdamW on the range into *staged* buffers; the range's step gradient goes to the buddy
//      rank (r + k) mod W (k: the plan's buddy offset, chosen so that a buddy is in another
//      failure domain than its owner where the group allows), which runs the owner's AdamW on a
//      staged copy of its mirror of the owner's moments (the same inputs, so the same bits: one
//      gradient crosses the wire instead of the updated moments); staged parameter ranges are
//      all-gathered (a pipeline grid's: sent to the ranks whose stage reads them, below) — in
//      step 2's overlapped exchange to every rank but the buddy, which has just computed them;
//   5. Commit() swaps the staged state (its mirror too) in; Abandon() drops it, so a re-run step
//      never applies an update twice.
// A new generation is staged the same way: Configure() builds the new layout's state beside the
// committed one, and only Commit() (once the coordinator heard from every rank) switches over —
// a failure in the middle of a reconfiguration leaves every rank's committed state untouched.
//
// Ranges: the flat vector is padded to W · per_rank elements, per_rank a multiple of kNormChunk;
// rank r owns [r·per_rank, (r+1)·per_rank) ∩ [0, n) (possibly empty).
//
// Reconfiguration (a new generation, a new communicator) restores the committed state by ranges:
// each piece of an old range — the parameters a new rank keeps, the moments of its new range —
// comes from the old range's surviving owner, else from its buddy (which holds every parameter
// under data parallelism and mirrors its owner's parameters on a grid), else the whole job
// restores from a checkpoint.
//
// Pipeline stages (GenerationPlan::stages > 1, pipeline.h): rank r is replica r % dp of stage
// r / dp. Step 1 becomes the stage's schedule (1F1B or GPipe) over the replica's microbatch
// block, activations forward and their gradients back by point-to-point to the neighbouring
// stages; each stage accumulates its parameters' gradients per microbatch in canonical order,
// and step 2 sends each stage's partials to the owners of the ranges above, which combine the dp
// replicas' partials in the canonical tree (canonical_combine.h). Every later step — norm, AdamW,
// mirrors, the all-gather, recovery, checkpoints — is the data-parallel one over all W ranks, so
// a grid trains the bits of the data-parallel run and re-plans to any other grid (or none)
// through the same memory and checkpoint restore. Except the all-gather: a stage's rank keeps
// only the parameters it reads (its stage's, the tied ones on the first stage) and its own
// range's — the model's buffer elsewhere is never touched, so on the host it is never resident —
// and each owner sends its updated range's pieces to the ranks that keep them. The buddy then
// mirrors the owner's parameters too: a stage of one replica has no other copy.
//
// Devices: every buffer of the step lives in the Trainable's memory (Trainable::array_ops(): the
// host's, or a GPU's) and is touched only through its ArrayOps and the communicator — so one code
// path trains on the host and on a GPU (NCCL), with the same canonical order and bits. Only the
// gradient norm's chunk sums (a few doubles per rank) travel through a host communicator.
#ifndef TROUPE_TRAIN_ELASTIC_H_
#define TROUPE_TRAIN_ELASTIC_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/collectives/communicator.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/optimizer.h"
#include "troupe/model/tree_sum.h"
#include "troupe/train/checkpoint_store.h"
#include "troupe/train/pipeline.h"
#include "troupe/train/shard_layout.h"
#include "troupe/train/trainable.h"

namespace troupe::train {

// ShardLayout, MicrobatchBlocks, the buddy offsets and the range arithmetic: shard_layout.h.

// One piece of the overlapped exchange: bucket `index` of `owner`'s range, flat [lo, hi).
struct GradientPiece {
  int owner = 0;
  int32_t index = 0;
  int64_t lo = 0, hi = 0;
};
// Each owner's real range [begin, end) ∩ [0, n), cut every bucket_floats from its begin: the
// pieces in owner order. Every boundary but n is a multiple of the norm's chunk.
std::vector<GradientPiece> PlanGradientPieces(const ShardLayout& layout, int64_t n,
                                              int64_t bucket_floats);
// Replicated optimizer state: the flat gradient [0, n) cut every bucket_floats (at most
// ceil(n / world) rounded up to whole norm chunks, so every rank combines some), piece j combined
// by rank j mod world — consecutive pieces, which the backward pass finishes together, go to
// different ranks, so no one host's link takes them all at once (the owners' contiguous ranges
// would). `owner` is the combining rank, `index` j.
std::vector<GradientPiece> PlanSharedGradientPieces(int64_t n, int world, int64_t bucket_floats);
// The bucket in floats for a requested size (<= 0: chosen by the link — 16 MiB when every peer
// shares this host's memory, else 4 MiB), rounded down to whole norm chunks, at least one.
int64_t BucketFloats(int64_t bucket_bytes, bool same_host);

// Where the committed state comes from when a generation starts.
enum class RestoreSource : int32_t { kInit = 0, kMemory = 1, kCheckpoint = 2 };

struct GenerationPlan {
  int world = 1;
  int rank = 0;
  // Pipeline stages: world = dp · stages (rank r is replica r % dp of stage r / dp); 1: data
  // parallelism only. Stages need a model with Trainable::staged().
  int stages = 1;
  int buddy = 1;                // rank r's moments are mirrored on rank (r + buddy) mod world
  int64_t committed_steps = 0;  // steps done; the next step to run
  RestoreSource source = RestoreSource::kInit;
  // kMemory: the previous generation's world and its ranks not in this one (sorted); the others
  // keep their order and come first (NewRank in shard_layout.h).
  int old_world = 0;
  std::vector<int> gone;
  int old_buddy = 1;  // kMemory: the previous generation's buddy offset
  // [lowcomm] (lowcomm_rank.h): each rank's group (its failure domain) in this generation, and
  // kMemory: in the previous one. Empty: one data-parallel group.
  std::vector<std::string> groups{}, old_groups{};
  int64_t checkpoint_step = -1;  // kCheckpoint: which checkpoint
  // The coordinator's lease epoch (CheckpointStore::Claim): this rank's checkpoint writes are
  // refused once a later epoch has claimed the store. 0: no lease (a store without fencing).
  uint64_t epoch = 0;
};

// A copy of a rank's committed range [begin, end) in host memory: parameters, AdamW m and v,
// end - begin floats each, one after the other in `data`.
struct HostShard {
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<float> data;
  ShardView view() const;
};

struct StepOutcome {
  // (microbatch, mean loss) computed here: every microbatch of a data-parallel rank, the
  // replica's microbatches on a pipeline's last stage, none on its other stages.
  std::vector<std::pair<int32_t, double>> losses;
  double grad_norm = 0;
  int32_t block_size = 0;  // microbatches this rank's replica computes
  int max_in_flight = 0;   // pipeline: the most microbatches this stage held at once
  // Step 1 (the microbatches' forwards and backwards: a stage's schedule on a pipeline) took
  // schedule_seconds, compute_seconds of them in the model; the rest is waiting (the bubble).
  double compute_seconds = 0;
  double schedule_seconds = 0;
  // Waiting on the step's collectives (the gradient exchange, the norm, the share of the new
  // state), from each one's start to its end — in the overlapped step, from the end of the work
  // it overlaps.
  double collective_seconds = 0;
  // The overlapped step: how long the gradient exchange and the parameters' share were in flight
  // (first piece posted to last piece done), and how much of that no compute or optimizer work
  // ran beside them. exposed / exchange is the share of communication left on the critical path.
  double exchange_seconds = 0;
  double exposed_seconds = 0;
  // The optimizer: AdamW of this rank's range and of the range it mirrors, and the parameter
  // delta's encoding and decoding (the overlapped step: with the parameters' share in flight
  // beside it; waiting for the mirror's gradient is exposed communication). Replicated: the norm
  // from the shares (AdamW runs in Commit).
  double update_seconds = 0;
  // This rank sent some of its updated parameters as a compressed lossless delta
  // (Options::param_delta).
  bool param_delta = false;
};

class ElasticRank {
 public:
  struct Options {
    int32_t microbatches = 1;  // M
    // Deterministic mode: the ordered reduce-scatter (bit-identical weights for any world size).
    // Off: the fastest reduce-scatter of the ranks' partial sums the communicator has (single
    // copy on one host, else the ring; the usual float tolerance only).
    bool deterministic = true;
    uint64_t seed = 1;  // parameter initialisation
    model::AdamWConfig adamw;
    model::LrSchedule schedule;
    PipelineSchedule pipeline = PipelineSchedule::kOneFOneB;  // GenerationPlan::stages > 1
    collectives::CollectiveOptions collective;                // timeout; algorithm is set per call
    // The overlapped exchange's piece size (BucketFloats); <= 0: chosen by the link.
    int64_t bucket_bytes = 0;
    // The sharded overlapped step's share of updated parameters (ParamDelta; host memory only:
    // a device's travel as they are).
    ParamDelta param_delta = ParamDelta::kAuto;
    // Every rank keeps the moments of every range ([optimizer] state = "replicated"): the ranks
    // combine the gradient's pieces round robin (PlanSharedGradientPieces) and send each to
    // every rank as they combine it (during the backward pass: no wait for the norm); every rank
    // sums the norm itself and runs AdamW on all the parameters —
    // no all-gather of parameters behind AdamW and no buddy mirror (the same 1.5 gradients a rank
    // on the wire per step as sharded at W = 4, all behind the backward pass). The same bits as
    // sharded. Deterministic data
    // parallelism in host memory only (Configure refuses the rest). A memory restore needs any
    // one survivor; the coordinator still plans by owner and buddy, so it is never less safe.
    bool replicate_optimizer = false;
    // Called for every (step, microbatch) as its data is served, before it is computed (on a
    // pipeline, by its first stage).
    std::function<void(int64_t step, int32_t k)> on_serve;
    // Called at each StepPoint of a step: once its gradient exchange is under way (posted, not
    // complete), and once the share of its updated parameters is — where chaos kills a rank in
    // the middle of a step (kill-worker@S:R:mid-exchange, :mid-gather).
    std::function<void(int64_t step, StepPoint point)> on_point;
  };

  ElasticRank(Trainable* model, Options options);

  // Stages generation `plan` on `comm` (rank plan.rank of plan.world), which moves the model's
  // memory (NCCL for a GPU's); `host_comm` (the same group, host memory) carries the gradient
  // norm's chunk sums — null: `comm` does, for a model in host memory. A staged step whose
  // number the plan says is committed is applied first (its commit message was lost with a
  // coordinator); any other staged state is abandoned. `store` is used only for
  // kCheckpoint. Once every rank returned OK and committed, every rank holds the committed state
  // of step plan.committed_steps in the new layout, mirrored on its buddy.
  [[nodiscard]] absl::Status Configure(collectives::Communicator* comm, const GenerationPlan& plan,
                                       CheckpointStore* store,
                                       collectives::Communicator* host_comm = nullptr);
  // Runs step committed_steps() into staged state.
  [[nodiscard]] absl::StatusOr<StepOutcome> RunStep();
  // Applies what is staged (a step or a configuration); no-op when nothing is. Should the device
  // fail to copy, the rank drops its state and every later RunStep fails naming the error (the
  // coordinator then restores it like a new rank).
  void Commit();
  void Abandon();

  int64_t committed_steps() const { return committed_state_.steps; }
  // Under data parallelism with the model in host memory, all n staged parameters — what Commit
  // copies into the model — once RunStep or Configure staged them; null otherwise.
  float* StagedParams();
  // The checkpoint the last Configure restored from (verified once, there); null when it did not
  // restore from one.
  const Checkpoint* restored_checkpoint() const {
    return restored_checkpoint_ ? &*restored_checkpoint_ : nullptr;
  }
  const ShardLayout& layout() const { return committed_state_.layout; }
  int rank() const { return committed_state_.rank; }
  int stages() const { return committed_state_.stages; }  // of the committed grid
  Trainable* model() { return model_; }
  // The committed state of this rank's range, copied to the host (what a checkpoint writer
  // writes).
  [[nodiscard]] absl::StatusOr<HostShard> CommittedShardOnHost() const;
  // What a checkpoint writer reads: the committed state of this rank's range in place where the
  // host can read the model's memory — valid until the next Commit() or Configure(), which must
  // wait for the writer — else a copy in *copy.
  [[nodiscard]] absl::StatusOr<ShardView> CommittedShard(HostShard* copy) const;
  using Ranges = train::Ranges;  // flat [begin, end), sorted
  // The parameters rank `rank` of a grid of `stages` over `layout` keeps in the model's buffer:
  // all of them under data parallelism; on a grid, those its stage reads and its own range's.
  // The rest of the buffer is given back (ArrayOps::Discard) when a generation commits.
  [[nodiscard]] absl::StatusOr<Ranges> HeldRanges(const ShardLayout& layout, int rank,
                                                  int stages) const;
  // All n committed parameters, copied to the host. On a pipeline grid, where no rank keeps them
  // all, a collective: every rank of the generation calls it.
  [[nodiscard]] absl::StatusOr<std::vector<float>> ParamsOnHost();
  // model::Crc32c of the n committed parameters (what the job's final check compares), without a
  // copy of the model: on a pipeline grid a collective that runs the CRC through the owners'
  // ranges in rank order.
  [[nodiscard]] absl::StatusOr<uint32_t> ParamsCrc32c();

 private:
  // A rank's state in one generation: where it sits in the group, and the buffers that hold its
  // share of the training state (ShardLayout: its range of the parameters). ElasticRank holds two:
  // the committed state, which recovery and checkpoints read, and the staged one, which RunStep or
  // Configure builds beside it without touching it:
  //
  //                RunStep                        Commit: the staged parameters into the model's
  //   kNone ────────────────────▶ kStep ──────┐     buffer; then staged → committed (moments,
  //     ▲  ────────────────────▶ kConfig ─────┤     mirror), a move
  //     │          Configure                  │
  //     └─────────────────────────────────────┘ Abandon (and every RunStep/Configure first):
  //                                               the staged state is dropped, never applied
  //
  // The committed parameters are the model's own buffer (over held[rank]); the staged ones are
  // staged_held_, packed. Touched by the rank actor's one thread.
  struct RankState {
    ShardLayout layout;
    int rank = 0;
    int buddy = 1;      // rank's moments are mirrored on rank (rank + buddy) mod world
    int stages = 1;     // of the grid: 1 under data parallelism
    int64_t steps = 0;  // the steps this state holds the result of: the next step to run
    // Cached per generation: a grid's stage units (PartitionUnits; empty under data
    // parallelism) and the parameters every rank of the generation keeps (HeldRanges), by rank.
    std::vector<std::pair<int, int>> units;
    std::vector<Ranges> held;
    // The moments of rank's range; the buddy mirror of rank (rank - buddy) mod world's range:
    // moments, and its parameters on a grid. A staged step stages the mirror it advanced
    // (StageMirror, StageBuddyAdamW) beside the committed one.
    model::FloatArray m, v, replica_p, replica_m, replica_v;

    const Ranges& my_held() const { return held[rank]; }
    // Everything but the buffers.
    void CopyPlacementFrom(const RankState& other);
  };
  // The floats of a rank's m and v, and where its range starts in them: its range's, or every
  // range's under replicate_optimizer.
  int64_t MomentsSize(const ShardLayout& layout) const {
    return options_.replicate_optimizer ? layout.padded() : layout.per_rank;
  }
  int64_t MomentsOffset(const RankState& s) const {
    return options_.replicate_optimizer ? s.layout.begin(s.rank) : 0;
  }
  enum class Staged { kNone, kStep, kConfig };
  struct StageExchange;  // elastic_stages.cc
  class OverlappedStep;  // elastic_overlap.cc

  // ---- The data-parallel step (elastic.cc): RunStep's phases, in order; each fills the buffers
  // the next one reads. AccumulateSubtree calls `ready` (if set) for each range of the subtree
  // (subtree_) as it becomes final: during the last microbatch's backward pass where the model
  // reports progress.
  [[nodiscard]] absl::Status AccumulateSubtree(
      int64_t step, int32_t lo, int32_t hi, StepOutcome* out,
      const std::function<void(int64_t begin, int64_t end)>& ready);
  // Deterministic mode: steps 1–4 overlapped (elastic_overlap.cc).
  [[nodiscard]] absl::Status RunOverlappedStep(
      int64_t step, const std::vector<std::pair<int32_t, int32_t>>& blocks, StepOutcome* out);
  // Fast (non-deterministic) mode: the communicator's fastest reduce-scatter.
  [[nodiscard]] absl::Status ReduceScatterGradient(int64_t step);
  [[nodiscard]] absl::StatusOr<double> GlobalGradNorm();
  // The norm from every rank's chunk sums of its range (`mine`: this rank's, per_rank / 4 Ki of
  // them), gathered over the host communicator and summed in the fixed tree.
  [[nodiscard]] absl::StatusOr<double> GradNormFromChunkSums(std::vector<double>& mine);
  [[nodiscard]] absl::Status StageAdamW(int64_t step, double grad_norm);
  [[nodiscard]] absl::Status ShareStagedState(int64_t step);
  // The buddy's half of a sharded step, where a step advances a mirror (StepAdvancesMirror: not
  // in a world of one, nor with replicated moments). StageMirror: the staged mirror sized as the
  // committed one, with its padding past the mirrored range carried over (StageBuddyAdamW writes
  // the rest). StageBuddyAdamW: the owner's AdamW on [lo, hi) of the range this
  // rank mirrors, from the owner's inputs (its gradient, in mirror_grad_ once received; its
  // committed parameters: the model's own under data parallelism, the mirror of them on a grid), so
  // with the owner's bits — into the staged mirror and, under data parallelism, into staged_held_:
  // the owner sends its updated range to every rank but its buddy.
  bool StepAdvancesMirror() const {
    return !options_.replicate_optimizer && committed_state_.layout.world > 1;
  }
  [[nodiscard]] absl::Status StageMirror();
  [[nodiscard]] absl::Status StageBuddyAdamW(int64_t lo, int64_t hi);
  // Each staged array sized as its committed one, with the elements from `real` on (the padding
  // past a range's real elements, which no AdamW writes) copied from it: an out-of-place AdamW of
  // the real elements then leaves the staged arrays what an in-place one on a copy would.
  [[nodiscard]] absl::Status StageCarriedPadding(
      std::initializer_list<std::pair<model::FloatArray*, const model::FloatArray*>> staged_from,
      int64_t real);

  // ---- The pipeline grid (elastic_stages.cc).
  // This rank's stage of its replica's schedule, each gradient range's subtree into
  // stage_partials_; then the exchange that leaves the step gradient of my range in grad_shard_.
  [[nodiscard]] absl::Status RunStageSchedule(int64_t step, int32_t lo, int32_t hi,
                                              GridPosition pos, StepOutcome* out);
  // Makes the model the committed grid's stage `stage` with `slots` microbatches in flight (once
  // per change), with one accumulator per gradient range of the stage.
  [[nodiscard]] absl::Status SetModelStage(int stage, int slots, const Ranges& ranges);
  [[nodiscard]] absl::Status ExchangeStageGradients(
      int64_t step, const std::vector<std::pair<int32_t, int32_t>>& blocks, GridPosition pos);
  [[nodiscard]] absl::Status PlanStageExchange(int64_t step, GridPosition pos,
                                               StageExchange* exchange);
  // A grid's step 4: the pieces of my staged range to the ranks that keep them, theirs to me.
  [[nodiscard]] absl::Status SendStagedParams(int64_t step);
  // HeldRanges of every rank of a generation.
  [[nodiscard]] absl::StatusOr<std::vector<Ranges>> HeldRangesByRank(const ShardLayout& layout,
                                                                     int stages) const;

  // ---- Reconfiguration (elastic_configure.cc).
  [[nodiscard]] absl::Status CheckPlan(const collectives::Communicator& comm,
                                       const GenerationPlan& plan) const;
  // Fills staged_state_'s placement for `plan` and stages its parameters and moments from the
  // plan's source.
  [[nodiscard]] absl::Status StageGeneration(const GenerationPlan& plan, CheckpointStore* store);
  [[nodiscard]] absl::Status StageFromInit();
  [[nodiscard]] absl::Status RestoreFromMemory(const GenerationPlan& plan);
  [[nodiscard]] absl::Status CheckSurvivor(const GenerationPlan& plan) const;
  [[nodiscard]] absl::Status AddParamMoves(
      const GenerationPlan& plan, const ShardLayout& from,
      std::vector<collectives::Communicator::PointToPoint>* moves);
  [[nodiscard]] absl::Status AddMomentMoves(
      const GenerationPlan& plan, const ShardLayout& from,
      std::vector<collectives::Communicator::PointToPoint>* moves);
  // replicate_optimizer: every survivor keeps its moments (all of them); the first survivor
  // sends them whole to each joiner.
  [[nodiscard]] absl::Status AddReplicatedMomentMoves(
      const GenerationPlan& plan, std::vector<collectives::Communicator::PointToPoint>* moves);
  [[nodiscard]] absl::Status RestoreFromCheckpoint(const GenerationPlan& plan,
                                                   CheckpointStore* store);
  // Copies the model's parameters of staged_state_'s held ranges into staged_held_.
  [[nodiscard]] absl::Status StageHeldFromModel();
  // Posts the staged state's mirror to its buddy — the moments, and on a grid the range's
  // parameters `p` — and the receive of the mirror it keeps into *works; the caller waits.
  [[nodiscard]] absl::Status PostMirror(RankState* state, const float* p,
                                        std::vector<collectives::Work>* works);
  // Commit's parts: the staged parameters into the model's buffer; the staged state becoming the
  // committed one.
  [[nodiscard]] absl::Status CopyStagedParamsIntoModel();
  void DiscardUnheld();
  void MoveStagedToCommitted(bool new_grid);

  Trainable* model_;
  model::ArrayOps* ops_;  // model_->array_ops()
  Options options_;
  collectives::Communicator* comm_ = nullptr;
  collectives::Communicator* host_comm_ = nullptr;
  absl::Status commit_error_;  // sticky: a commit the device failed
  bool has_state_ = false;     // committed_state_ holds a committed generation
  RankState committed_state_;
  Staged staged_ = Staged::kNone;
  RankState staged_state_;  // what staged_ says, else stale buffers kept for reuse
  std::optional<Checkpoint> restored_checkpoint_;
  // The staged parameters of staged_state_.my_held(), one range after the other.
  model::FloatArray staged_held_;
  // Staged by RunStep: the mirrored rank's step gradient (StageBuddyAdamW's input) and the step's
  // AdamW scalars.
  model::FloatArray mirror_grad_;
  kernels::AdamWScalars staged_scalars_{};
  // The step's scratch: this rank's subtree of the gradient (data parallelism), the step gradient
  // of its range, and its updated range (data parallelism: the all-gather's input).
  model::FloatArray partial_, grad_shard_, staged_params_;
  // Where AccumulateSubtree left this rank's subtree: partial_, or the model's gradient itself.
  const float* subtree_ = nullptr;
  // The parameter share's framed pieces (Options::param_delta), by piece: mine as sent, the
  // others' as received; the codec's scratch; whether my next share is delta-encoded (kAuto: set
  // by how fast this one crossed the link).
  std::vector<std::vector<uint8_t>> delta_wire_;
  std::vector<uint8_t> delta_scratch_;
  bool delta_next_ = false;
  // The overlapped exchange's receives: every other rank's partial of my range, by rank.
  model::FloatArray exchange_recv_;
  // The gradient combine's temporaries (CombinePieces), reused across steps: fresh ones were
  // fresh pages every step, zeroed by the kernel as the combine first wrote them.
  std::vector<model::FloatArray> combine_inner_;
  // Reused across steps: its leaf buffers (n floats each) would otherwise be fresh pages per
  // microbatch.
  std::optional<model::TreeAccumulator> acc_;
  // Pipeline: the stage the model was set to (first unit, end unit, slots), one accumulator
  // and finished partial per gradient range of the stage.
  std::tuple<int, int, int> model_stage_{-1, -1, 0};
  std::vector<model::TreeAccumulator> stage_accs_;
  std::vector<model::FloatArray> stage_partials_;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_ELASTIC_H_
