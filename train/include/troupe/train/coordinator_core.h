// coordinator_core.h — the training coordinator's decisions, as a pure state machine.
//
// No actors, no I/O, no clock: the coordinator actor (coordinator.cc) feeds CoordinatorCore
// events with the current time and carries out the actions it returns, in order; a test does the
// same by hand. Every decision of the elastic protocol (who is in a generation, where its state
// comes from, when a step commits, when a checkpoint is complete, which fault fires when, when
// the job is done or cannot go on) is made here and nowhere else.
//
//             OnMembershipKnown + enough joins
//   kWaiting ─────────────────────────────────▶ kConfiguring ──all configured──▶ kStepping ◀─┐
//      ▲                                          │    ▲                         │  │  all    │
//      │ fewer than min_workers usable            │    │ NewGeneration           │  │ stepped │
//      └──────────────────────────────────────────┤    │ (a member down, a       │  └─commit──┘
//                                                 │    │  drain or a joiner at a │
//           a rank reports a failure              ▼    │  step boundary)         │ join-worker@S
//   kRecovering ◀──────────────────────── (configuring │ stepping │ finishing)   ▼
//      │ retry timer → kReadTable → OnTable ──────────┘              kAwaitingJoin (the joiner
//      │                                                              or its deadline → step S)
//   a notice on the coordinator's own node: at the next step boundary, before any hand-over,
//      save and kMoveSelf → kDone (the job supervisor restarts it on another node, from its record;
//      the restarted one hands the noticed ranks over).
//   kHandingOver: at a step boundary, ranks of noticed (draining) nodes leave; where the survivors'
//      memory cannot hold their state (an owner and its buddy both noticed, every worker noticed,
//      fewer than min_workers left), every rank first checkpoints the committed step
//      (OnCheckpointCommitted → the drain's generation restores it: nothing lost); every worker
//      noticed → that checkpoint, then kDone with kFail(PreemptedError) — run again to resume.
//   kFinishing: the last step committed; its checkpoint written (a rank's write error fails the
//      job naming the file), then kFinal to rank 0 → OnFinal → kDone with kFinish.
//   any phase ── a fatal condition (20 generations without a commit, the watchdog) ──▶ kDone/kFail
//
// Events of older generations (a slow rank's reply, a timer armed before a regeneration) are
// ignored. A worker once down is never planned again ("dead"); the set is part of the record.
// Faults fire at most once: a fired fault is in the record, saved (kSaveRecord) before the
// action that carries it out.
//
// Its parts: the chaos faults' schedule (fault_schedule.h) and the checkpoints asked of the ranks
// (pending_checkpoints.h), each pure; the core itself in coordinator_core.cc (membership,
// generations) and coordinator_core_steps.cc (the step boundary, checkpoints, the end, timers).
//
// Not thread-safe: owned by one actor.
#ifndef TROUPE_TRAIN_COORDINATOR_CORE_H_
#define TROUPE_TRAIN_COORDINATOR_CORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "troupe/base/events.h"
#include "troupe/train/elastic.h"
#include "troupe/train/job_spec.h"
#include "troupe/train/manifest.h"
#include "troupe/train/pending_checkpoints.h"

namespace troupe::train {

struct FaultTargets;  // fault_schedule.h

using CoreTime = std::chrono::steady_clock::time_point;
using CoreDuration = std::chrono::steady_clock::duration;

enum class CoordinatorPhase {
  kWaiting,       // for min_workers usable workers (or the membership table)
  kConfiguring,   // configure sent to the generation's ranks; waiting for every reply
  kStepping,      // step sent; waiting for every rank's stepped
  kAwaitingJoin,  // chaos join-worker@S: step S held until the joiner is in (or a deadline)
  kRecovering,    // a rank reported a failure; regenerating after the retry delay
  kHandingOver,   // noticed ranks leave and memory cannot restore their state: checkpointing first
  kFinishing,     // every step committed; the final checkpoint and CRC are being collected
  kDone,          // finished or failed: nothing more happens
};
const char* PhaseName(CoordinatorPhase p);

// What a restarted coordinator resumes from (see coordinator_record.h for the file).
struct CoordinatorRecord {
  int64_t committed = 0;            // steps committed
  uint64_t generation = 0;          // the newest generation planned
  int64_t steps_lost = 0;           // committed steps recomputed after checkpoint rollbacks
  bool awaiting_recovery = false;   // a fault fired; the next commit measures recovery
  std::set<int32_t> fired;          // indices into the job's faults
  std::vector<std::string> active;  // the committed configuration: worker of each rank
  int32_t buddy = 1;                // ... and its buddy offset (GenerationPlan::buddy)
  std::set<std::string> dead;       // workers known dead: never planned again
  bool operator==(const CoordinatorRecord& o) const;
};

struct CoordinatorAction {
  enum class Kind {
    kSaveRecord,   // persist `record` before carrying out any later action
    kAbort,        // tell `worker`: fail collectives of generations below `generation` now
    kConfigure,    // send `worker` generation `generation` with `plan`
    kStep,         // send `worker`: run step `step` of `generation`
    kCommit,       // send `worker`: apply the staged step; write checkpoint `step` unless -1
    kCheckpoint,   // commit checkpoint `step` (manifest of `shards`, world `world`) to the store
    kFinal,        // ask `worker` for the final parameters' CRC (every rank of a pipeline grid)
    kReadTable,    // read the head's membership table, then call OnTable
    kTimer,        // call OnTimer(`timer`) after `delay`
    kKillWorker,   // chaos: `worker` kills itself with `signal` at `point` of step `step` (`fault`)
    kNodeFault,    // chaos: `fault` (sigterm-node, partition-node, drop-node) on `worker`'s node
    kAddNode,      // chaos: a node named `text` with one worker joins
    kCrashSelf,    // chaos: this process dies now (kill-coordinator)
    kMoveSelf,     // this incarnation's node got a notice: stop, to be restarted on another node
    kReleaseNode,  // the noticed node `text` holds nothing of the job any more: it may leave now
    kReleaseRank,  // `worker`, given up (OnGiveUp), is out of the generation: stop its rank
    kEvict,        // `worker`, alive but failing its peers (stuck, or cut off from them) and
                   // out of the job for good: its process ends itself (`text`: why)
    kStallSelf,    // chaos: this actor blocks for a while (stall-coordinator)
    kArmCrash,     // chaos: this process dies at crash point `text` (crash-in-checkpoint of `step`)
    kCommitted,    // step `step` committed in `generation` (world `world`, mean `loss`; the
                   // validation loss `eval_loss` of the parameters of `eval_step` steps, if due)
    kEvent,        // a decision, for the job's event log and the operator: `event`
    kFinish,       // the job is done: report `crc`, `num_params`, `step` (and `eval_loss` of
                   // the final parameters, `eval_step` = `step`); stop every member
    kFail,         // the job cannot go on: `status` (and `event`, for the log); stop
  };
  explicit CoordinatorAction(Kind k) : kind(k) {}
  Kind kind;
  std::string worker;
  uint64_t generation = 0;
  int64_t step = -1;
  GenerationPlan plan;
  std::vector<ShardFileInfo> shards;
  int world = 0;
  int32_t signal = 0;
  FaultKind fault = FaultKind::kKillWorker;
  StepPoint point = StepPoint::kExchange;  // kKillWorker: where in step `step`
  uint64_t timer = 0;
  CoreDuration delay{0};
  double loss = 0;
  int64_t eval_step = -1;  // kCommitted, kFinish: -1 when no validation loss came with it
  double eval_loss = 0;
  bool recovered = false;  // kCommitted: the first commit after a fault
  int64_t crc = 0;
  int64_t num_params = 0;
  std::string text;
  // kEvent, kFail: what happened, in the event log's vocabulary (job_events.h); gen= is the
  // generation when it was decided.
  base::SupervisionEvent event;
  absl::Status status;
  CoordinatorRecord record;  // kSaveRecord: the record as of this action
};

// Per-microbatch mean losses averaged in microbatch order through the fixed tree sum, so the
// same for any world size: a step's loss, an evaluation's (0 for none).
double CanonicalMean(const std::map<int32_t, double>& by_microbatch);

// The short form tests compare: "configure(w1,g2,r1/3,memory)", "step(w0,g2,s5)", "event", ...
std::string DebugString(const CoordinatorAction& a);

class CoordinatorCore {
 public:
  struct Options {
    int64_t steps = 1;
    int32_t min_workers = 1;
    int32_t max_world =
        1;  // min(max_workers, microbatches × pipeline_stages); [lowcomm]: max_workers
    // Pipeline grids (pipeline.h): the stages asked for, the model's units and M; every
    // generation's world is one a grid fits (ChooseStages), its stages the closest to those
    // asked for.
    int32_t pipeline_stages = 1;
    int32_t pipeline_units = 1;
    int32_t microbatches = 1 << 16;
    int64_t checkpoint_every = 0;
    int64_t num_params = 0;
    std::vector<Fault> faults;
    // The newest valid checkpoint's step, or nullopt (the store, read by the shell; a fake in
    // tests). Asked only when a generation cannot restore from memory.
    std::function<std::optional<int64_t>()> latest_checkpoint;
    CoreDuration retry_delay = std::chrono::milliseconds(300);
    CoreDuration join_wait = std::chrono::seconds(60);
    // Preemption notices within this long of the first leave together (0: at the next boundary).
    CoreDuration notice_window{0};
    CoreDuration watchdog = std::chrono::seconds(120);
    // A rank still in a step this long after all its peers finished it fails the step, blamed
    // (timeouts.collective: its peers' collectives with it ended, so it is not waiting on them).
    // 0: no such deadline.
    CoreDuration straggler{0};
    int max_failed_generations = 20;
    // [lowcomm] (lowcomm_rank.h), on when > 0: each rank's group is its failure domain
    // (GenerationPlan::groups); a generation restores from memory when every group that goes on
    // can from its own survivors; workers are folded in where a round of this many steps ends; a
    // checkpoint is the first group's (in name order) shards.
    int64_t lowcomm_round = 0;
    // [optimizer] state = "replicated": every rank holds every range, so a generation restores
    // from memory while any rank of the last one survives (not only where each lost range's
    // buddy does).
    bool replicated_state = false;
  };

  explicit CoordinatorCore(Options options);

  // A restarted coordinator resumes from `record` (the previous incarnation's last save).
  std::vector<CoordinatorAction> Restore(const CoordinatorRecord& record, CoreTime now);
  // The driver announced how many ranks it knows of; `dead` are workers the head's table calls
  // dead. Nothing is planned before this.
  std::vector<CoordinatorAction> OnMembershipKnown(size_t expected_joins,
                                                   const std::vector<std::string>& dead,
                                                   CoreTime now);
  // A rank actor joined (its handle resolved), or could not be found. `domain`: its failure
  // domain (zone or host; empty: its node) — a generation mirrors each rank's moments on a buddy
  // in another domain where its group allows.
  std::vector<CoordinatorAction> OnJoin(const std::string& worker, const std::string& node,
                                        CoreTime now, const std::string& domain = "");
  std::vector<CoordinatorAction> OnJoinFailed(const std::string& worker, const std::string& why,
                                              CoreTime now);
  // Membership: a worker's process or actor is gone (killed, fenced, hung) with `why`.
  std::vector<CoordinatorAction> OnWorkerDown(const std::string& worker, const std::string& why,
                                              CoreTime now);
  // A node got a preemption notice (or was draining when this incarnation started): its ranks
  // leave at a step boundary — and if it is this coordinator's own node (SetOwnNode), the
  // coordinator moves first: kMoveSelf at the next boundary, its record saved.
  std::vector<CoordinatorAction> OnNodeDraining(const std::string& node, const std::string& why,
                                                CoreTime now);
  void SetOwnNode(const std::string& node);
  // The head asks the job to give up `n` ranks for a queued job of higher priority: as many as
  // keep min_workers leave at the next step boundary, handed over as a noticed node's are (nothing
  // lost), then kReleaseRank for each; they may join again later as new members.
  std::vector<CoordinatorAction> OnGiveUp(int32_t n, const std::string& why, CoreTime now);
  std::vector<CoordinatorAction> OnNodeDead(const std::string& node, CoreTime now);
  // A node joined (again, after it was declared dead: a healed partition): workers of it that
  // join from now on are new members (its old ones stay dead).
  std::vector<CoordinatorAction> OnNodeAlive(const std::string& node, CoreTime now);
  // The head's table was read after kReadTable (dead: workers it calls dead; empty if unread).
  std::vector<CoordinatorAction> OnTable(uint64_t generation, const std::vector<std::string>& dead,
                                         CoreTime now);
  // Rank replies. `blamed`: on a failure, the rank (in this generation) that the reporting rank's
  // collectives blamed — dead, or unreachable from it — or -1. A worker that every such failure
  // since the last commit has in common, over two failed generations or more, is left out as
  // unreachable (the head may still hear from it: a partial partition); if the same two remain
  // after three, the later-ranked of them is.
  std::vector<CoordinatorAction> OnConfigured(uint64_t generation, const std::string& worker,
                                              const absl::Status& status, CoreTime now,
                                              int32_t blamed = -1);
  // `eval_losses`: the rank's share of the held-out microbatches' losses ([eval]), evaluated
  // before the step on the parameters of `step` steps.
  std::vector<CoordinatorAction> OnStepped(uint64_t generation, int64_t step,
                                           const std::string& worker, const absl::Status& status,
                                           const std::map<int32_t, double>& losses, CoreTime now,
                                           int32_t blamed = -1,
                                           const std::map<int32_t, double>& eval_losses = {});
  std::vector<CoordinatorAction> OnShardWritten(uint64_t generation, int64_t step, int32_t index,
                                                const ShardFileInfo& info,
                                                const absl::Status& status, CoreTime now);
  // The shell committed checkpoint `step` (kCheckpoint) with `status`.
  std::vector<CoordinatorAction> OnCheckpointCommitted(int64_t step, const absl::Status& status,
                                                       CoreTime now);
  std::vector<CoordinatorAction> OnFinal(uint64_t generation, int64_t crc, int64_t num_params,
                                         int64_t steps, CoreTime now,
                                         const std::map<int32_t, double>& eval_losses = {});
  std::vector<CoordinatorAction> OnTimer(uint64_t timer, CoreTime now);

  CoordinatorPhase phase() const { return phase_; }
  const CoordinatorRecord& record() const { return record_; }
  uint64_t generation() const { return record_.generation; }
  int64_t committed() const { return record_.committed; }
  const std::vector<std::string>& group() const { return group_; }
  std::string DebugString() const;

 private:
  struct Member {
    std::string node;
    std::string domain;
    bool alive = true;
    bool draining = false;
  };
  enum class TimerKind { kRetry, kJoinWait, kWatchdog, kNoticeWindow, kStraggler };
  struct Timer {
    TimerKind kind;
    uint64_t generation;
    int64_t step;
  };
  using Actions = std::vector<CoordinatorAction>;

  bool Usable(const std::string& worker) const;
  int UsableCount() const;  // members Usable() holds for
  void Emit(Actions* out, CoordinatorAction a);
  void Save(Actions* out);
  void Event(Actions* out, base::SupervisionEvent event);
  void ArmTimer(Actions* out, TimerKind kind, CoreDuration delay);
  // The job fails with `status`; `event` (default: job_failed) goes to the log.
  void Fail(Actions* out, absl::Status status,
            std::optional<base::SupervisionEvent> event = std::nullopt);
  void MaybeStart(Actions* out);
  std::vector<std::string> NextGroup(bool with_draining) const;
  // The pipeline depth a world of `world` ranks runs (0: no grid fits it; [lowcomm]: 1).
  int StagesOf(int world) const;
  // The largest world of at most `usable` (and max_world) workers that a grid fits.
  int GridWorld(int usable) const;
  // The workers a generation would take now: UsableCount(), or under [lowcomm] NextGroup's (each
  // group capped at its microbatches).
  int StartableCount() const;
  // `trigger`: the generation event's trigger= (start, workers, worker_down, drain, join,
  // failure); `why`: its reason; `extra`: further fields (down=, node=: who leaves).
  // hand_over: the draining ranks leave now (HandOver made sure their state survives them);
  // else they stay where the state survives in memory only with them.
  void NewGeneration(Actions* out, const std::string& trigger, const std::string& why,
                     const std::map<std::string, std::string>& extra = {}, bool hand_over = false);
  // The plan's restore source; the generation event's source= (owners, mirrors, replicas,
  // checkpoint, seed).
  std::string PlanSource(const std::vector<std::string>& next, GenerationPlan* plan);
  // A rank's failure: `event` (recovering) is logged; `why` becomes the next generation's reason.
  void Recover(Actions* out, base::SupervisionEvent event, const std::string& why);
  void MarkDown(Actions* out, const std::vector<std::string>& workers, const std::string& why);
  // A failed generation's reporter and the rank it blamed narrow down the suspects.
  void Blame(const std::string& reporter, int32_t blamed);
  // The suspect to leave out now, if the blames single one out: the only suspect that never
  // reported a failure itself, or the only suspect after two failures, or the later of two
  // after three.
  std::optional<std::string> Unreachable() const;
  // The straggler timer fired: the one rank still in the step is blamed by every peer that
  // finished it, and the step fails.
  void OnStraggler(Actions* out);
  void StartStep(Actions* out);
  // Ranks of noticed nodes leave at this step boundary (see the .cc).
  void HandOver(Actions* out);
  bool HandOverCheckpointEnded() const;
  // The ranks of the committed configuration that are not in `next` (sorted: GenerationPlan::gone).
  std::vector<int> Gone(const std::vector<std::string>& next) const;
  // MemoryRestorePossible from the committed configuration to `next`.
  bool MemoryRestorePossibleTo(const std::vector<std::string>& next) const;
  bool CheckpointHolds(int64_t step) const;
  // A commit past owed_boundary_ with no checkpoint durable or under way for it writes one.
  bool CheckpointOwed() const;
  bool FireFaults(Actions* out);
  // Whom a fault fired now hits: the group by rank, their nodes, the buddy offset.
  FaultTargets Targets() const;
  void CommitStep(Actions* out);
  void CommitGroup(Actions* out, int64_t checkpoint_step);
  void ExpectCheckpoint(int64_t step);
  // [lowcomm]: the failure domain of each of `workers`.
  std::vector<std::string> Domains(const std::vector<std::string>& workers) const;
  int64_t CheckpointAt(int64_t step) const;
  void CompleteCheckpoint(Actions* out, int64_t step);
  void Finish(Actions* out);

  Options options_;
  CoordinatorRecord record_;
  CoordinatorPhase phase_ = CoordinatorPhase::kWaiting;
  std::map<std::string, Member> members_;
  std::set<std::string> dead_nodes_;  // a worker of one of these is dead when it joins
  std::vector<std::string> group_;    // this generation's workers, by rank
  int32_t group_buddy_ = 1;           // ... and its buddy offset
  std::set<std::string> pending_;     // ranks whose reply this phase still needs
  std::map<int32_t, double> losses_, eval_losses_;  // this step's, by microbatch
  PendingCheckpoints checkpoints_;
  std::map<uint64_t, Timer> timers_;
  uint64_t next_timer_ = 1;
  size_t expected_joins_ = 0;
  bool membership_known_ = false;
  std::string recover_why_;              // what Recover saw, for the generation it leads to
  int64_t last_checkpoint_ = -1;         // newest checkpoint this incarnation committed
  int64_t owed_boundary_ = -1;           // Restore found this boundary without a durable checkpoint
  int64_t owed_asked_ = -1;              // the checkpoint last asked for it
  uint64_t final_asked_generation_ = 0;  // the final checkpoint was asked again in this one
  uint64_t handover_asked_generation_ = 0;  // a hand-over checkpoint was asked in this one
  bool notice_window_open_ = false;         // a notice's window runs: its drain waits for it
  std::set<std::string> draining_nodes_;    // noticed: a worker of one joins draining
  std::string own_node_;                    // where this incarnation runs ("": unknown)
  std::set<std::string> released_nodes_;    // noticed nodes told they may leave
  std::set<std::string> given_up_;          // workers leaving for another job (OnGiveUp)
  int failed_generations_ = 0;
  // Since the last commit: the workers every blamed failure had in common (reporter or blamed),
  // and how many failed generations named one.
  std::set<std::string> suspects_;
  std::set<std::string> reporters_;  // since the last commit: workers that reported a failure
  int blamed_failures_ = 0;
  uint64_t blamed_generation_ = 0;  // the last generation a failure of which blamed someone
  int64_t watchdog_seen_ = -1;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_COORDINATOR_CORE_H_
