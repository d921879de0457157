// troupe/actors/elastic.h — one rank of the data-parallel step with a sharded optimizer, over a
// collectives::Communicator. The rank actor (training.h) drives it; unit tests drive several with
// the in-process backend.
//
// The step (ARCHITECTURE.md, "The training step" and "Determinism"):
//   1. rank r computes microbatches [lo, hi) of the M — a power-of-two-aligned block, so its local
//      canonical tree sum is a whole subtree of T(0, M);
//   2. ordered reduce-scatter keyed by those intervals: rank r receives the step gradient of its
//      parameter range, combined in canonical tree order (bit-exact for any W);
//   3. gradient norm from fixed 4 Ki chunks: each rank's chunk sums are all-gathered and summed
//      in a fixed tree over the model's real chunks only (padding never enters);
//   4. AdamW on the range into *staged* buffers; the range's step gradient goes to the buddy
//      rank (r + k) mod W (k: the plan's buddy offset, chosen so that a buddy is in another
//      failure domain than its owner where the group allows), which mirrors the owner's moments;
//      staged parameter ranges are all-gathered (a pipeline grid's: sent to the ranks whose stage
//      reads them, below);
//   5. Commit() swaps the staged state in, and the buddy replays the owner's AdamW on its mirror
//      (the same inputs, so the same bits: one gradient crosses the wire instead of the updated
//      moments, and no staged copy of the mirror is kept); Abandon() drops it, so a re-run step
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
#ifndef TROUPE_ACTORS_ELASTIC_H_
#define TROUPE_ACTORS_ELASTIC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/actors/checkpoint_store.h"
#include "troupe/actors/pipeline.h"
#include "troupe/actors/trainable.h"
#include "troupe/collectives/communicator.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/optimizer.h"
#include "troupe/model/tree_sum.h"

namespace troupe::actors {

struct ShardLayout {
  int world = 1;
  int64_t num_params = 0;
  int64_t per_rank = 0;  // a multiple of kernels::kNormChunk

  static ShardLayout Make(int64_t num_params, int world);
  int64_t padded() const { return per_rank * world; }
  // The real (unpadded) range of rank r; begin == end for a rank that owns only padding.
  int64_t begin(int r) const;
  int64_t end(int r) const;
};

// [lo, hi) of the M microbatches for each of `world` ranks: power-of-two-aligned subtrees of the
// canonical tree of [0, M), in order. InvalidArgument unless 1 <= world <= M.
[[nodiscard]] absl::StatusOr<std::vector<std::pair<int32_t, int32_t>>> MicrobatchBlocks(
    int32_t microbatches, int world);

// Where the committed state comes from when a generation starts.
enum class RestoreSource : int32_t { kInit = 0, kMemory = 1, kCheckpoint = 2 };

// True if every old range survives in memory: its owner or its buddy ((o + buddy) mod W) is in
// the new group. old_to_new[o] is old rank o's new rank, or -1 if it is gone.
bool MemoryRestorePossible(const std::vector<int>& old_to_new, int buddy = 1);

// The buddy offset k for a group whose rank r is in failure domain domains[r] (a zone, else a
// host): the smallest k in [1, W) that puts the fewest buddies (r + k) mod W in their owner's
// domain — none whenever some offset allows it (equal-sized domains in rank order: k = the
// domain size). 1 for a world of one.
int BuddyOffset(const std::vector<std::string>& domains);
// How many ranks r of `domains` share their domain with their buddy (r + buddy) mod W.
int BuddiesSharingADomain(const std::vector<std::string>& domains, int buddy);

struct GenerationPlan {
  int world = 1;
  int rank = 0;
  // Pipeline stages: world = dp · stages (rank r is replica r % dp of stage r / dp); 1: data
  // parallelism only. Stages need a model with Trainable::staged().
  int stages = 1;
  int buddy = 1;                // rank r's moments are mirrored on rank (r + buddy) mod world
  int64_t committed_steps = 0;  // steps done; the next step to run
  RestoreSource source = RestoreSource::kInit;
  // kMemory: the previous generation's world and where each old rank went (survivors come first,
  // so new rank 0 always holds the committed parameters).
  std::vector<int> old_to_new;
  int old_buddy = 1;             // kMemory: the previous generation's buddy offset
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
  // state), from each one's start to its end.
  double collective_seconds = 0;
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
    // Called for every (step, microbatch) as its data is served, before it is computed (on a
    // pipeline, by its first stage).
    std::function<void(int64_t step, int32_t k)> on_serve;
    // Called once the step's gradient exchange is under way (the reduce-scatter posted, not yet
    // complete): where chaos kills a rank "in the middle of the exchange".
    std::function<void(int64_t step)> on_exchange;
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
  bool has_state() const { return has_state_; }

  int64_t committed_steps() const { return committed_; }
  const ShardLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  int stages() const { return stages_; }  // of the committed grid
  Trainable* model() { return model_; }
  // The committed state of this rank's range, copied to the host (what a checkpoint writer
  // writes).
  [[nodiscard]] absl::StatusOr<HostShard> CommittedShardOnHost() const;
  // What a checkpoint writer reads: the committed state of this rank's range in place where the
  // host can read the model's memory — valid until the next Commit() or Configure(), which must
  // wait for the writer — else a copy in *copy.
  [[nodiscard]] absl::StatusOr<ShardView> CommittedShard(HostShard* copy) const;
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // flat [begin, end), sorted
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
  enum class Staged { kNone, kStep, kConfig };
  // Posts the mirror to the buddy (rank + buddy) — the moments, and with `mirror_params` the
  // range's parameters `p` — and the receive of the mirror this rank keeps (from rank - buddy)
  // into *works; the caller waits.
  [[nodiscard]] absl::Status PostMirror(const ShardLayout& layout, int rank, int buddy,
                                        bool mirror_params, const float* p,
                                        const model::FloatArray& m, const model::FloatArray& v,
                                        model::FloatArray* replica_p, model::FloatArray* replica_m,
                                        model::FloatArray* replica_v,
                                        std::vector<collectives::Work>* works);
  // Copies the model's parameters of staged_held_ranges_ into staged_held_ (sized for them).
  [[nodiscard]] absl::Status StageHeldFromModel();
  [[nodiscard]] absl::Status RestoreFromMemory(const GenerationPlan& plan, const ShardLayout& to);
  // RunStep's phases, in order; each fills the buffers the next one reads.
  [[nodiscard]] absl::Status AccumulateSubtree(int64_t step, int32_t lo, int32_t hi,
                                               StepOutcome* out);
  [[nodiscard]] absl::Status ReduceScatterGradient(int64_t step, int32_t lo, int32_t hi);
  [[nodiscard]] absl::StatusOr<double> GlobalGradNorm();
  [[nodiscard]] absl::Status StageAdamW(int64_t step, double grad_norm);
  [[nodiscard]] absl::Status RestoreFromCheckpoint(const GenerationPlan& plan,
                                                   const ShardLayout& to, CheckpointStore* store);
  [[nodiscard]] absl::Status ShareStagedState(int64_t step);
  // A grid's step 4: the pieces of my staged range to the ranks that keep them, theirs to me.
  [[nodiscard]] absl::Status SendStagedParams(int64_t step);
  // Pipeline: this rank's stage of its replica's schedule, each gradient range's subtree into
  // stage_partials_; then the exchange that leaves the step gradient of my range in grad_shard_.
  [[nodiscard]] absl::Status RunStageSchedule(int64_t step, int32_t lo, int32_t hi,
                                              GridPosition pos, StepOutcome* out);
  [[nodiscard]] absl::Status ExchangeStageGradients(
      int64_t step, const std::vector<std::pair<int32_t, int32_t>>& blocks, GridPosition pos);
  // The unit ranges of the committed grid's stages.
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<int, int>>> StageUnits() const;

  Trainable* model_;
  model::ArrayOps* ops_;  // model_->array_ops()
  Options options_;
  collectives::Communicator* comm_ = nullptr;
  collectives::Communicator* host_comm_ = nullptr;
  absl::Status commit_error_;  // sticky: a commit the device failed
  ShardLayout layout_;
  int rank_ = 0;
  int buddy_ = 1;
  int stages_ = 1;
  bool has_state_ = false;
  int64_t committed_ = 0;
  // Committed: moments of my range; the buddy mirror of rank (r - buddy_) mod W's range (its
  // parameters too on a grid).
  model::FloatArray m_, v_, replica_p_, replica_m_, replica_v_;
  // Staged by RunStep: that rank's step gradient and the step's AdamW scalars, which Commit
  // replays on the mirror.
  model::FloatArray mirror_grad_;
  kernels::AdamWScalars staged_scalars_{};
  // Staged by RunStep or Configure; staged_held_ holds the parameters of staged_held_ranges_,
  // one range after the other; the staged replicas only by Configure.
  Staged staged_ = Staged::kNone;
  ShardLayout staged_layout_;
  int staged_rank_ = 0;
  int staged_buddy_ = 1;
  int staged_stages_ = 1;
  int64_t staged_committed_ = 0;
  // Pipeline: the stage the model was set to (first unit, end unit, slots), one accumulator
  // and finished partial per gradient range of the stage.
  std::tuple<int, int, int> model_stage_{-1, -1, 0};
  std::vector<model::TreeAccumulator> stage_accs_;
  std::vector<model::FloatArray> stage_partials_;
  // Reused across steps: its leaf buffers (n floats each) would otherwise be fresh pages per
  // microbatch.
  std::optional<model::TreeAccumulator> acc_;
  Ranges staged_held_ranges_;
  model::FloatArray partial_, grad_shard_, staged_params_, staged_held_, staged_m_, staged_v_,
      staged_replica_p_, staged_replica_m_, staged_replica_v_;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_ELASTIC_H_
