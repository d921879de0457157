// troupe/train/job_spec.h — a training job, from a TOML file (Debian's libtomlplusplus).
//
//   [job]        name, steps, seed, work_dir, deterministic, priority (on a shared cluster)
//   [model]      type ("gpt" or a registered Trainable), size, data_dir, device ("cpu",
//                "cuda", "cuda:N"), precision ("fp32", or "bf16" on CUDA), seq_len,
//                microbatch_size, microbatches (M per step, fixed whatever the world size),
//                [model.options] free-form strings for user models
//   [optimizer]  lr, min_lr, warmup_steps, weight_decay, max_grad_norm, beta1, beta2, state
//                ("sharded": each rank keeps its range's moments, a buddy mirrors them;
//                "replicated": every rank keeps them all, as DDP does)
//   [elastic]    workers (started by the embedded cluster), min_workers, max_workers,
//                ranks_per_gpu (CUDA, embedded cluster: worker nodes sharing one GPU),
//                bucket_kib (the overlapped gradient exchange's pieces; 0: chosen by the link),
//                param_delta ("auto", "on", "off": updated parameters as a lossless delta),
//                rank_resources, rank_labels, rank_spot (what each rank asks of a node)
//   [pipeline]   stages (pipeline stages asked for: each generation's grid takes the divisor of
//                its world closest to it, see ChooseStages; 1 with device "cuda"), schedule
//                ("1f1b" or "gpipe")
//   [checkpoint] dir, every (steps), keep_last
//   [eval]       every (steps; 0: never), shard (held-out tokens: a path, relative to data_dir;
//                default data_dir's first val-*.tok), microbatches (per evaluation; default
//                model.microbatches): the validation loss of the parameters after every `every`
//                steps and after the last, in the event log, the report and /metrics
//   [lowcomm]    groups (>= 1: the low-communication mode; the embedded cluster puts its workers
//                in this many zones, g0, g1, ...; on a cluster of your own a group is a failure
//                domain: zone label, else host), inner_steps, outer_lr, outer_momentum,
//                fragments, compression ("none", "int8", "topk:<fraction>"), robust ("none",
//                "clip", "reject"), robust_factor, verify_feedback — train/lowcomm.h
//   [chaos]      faults = ["kill-worker@10", ...]  (see Fault), network_fault (a duration),
//                drop_percent, delay and jitter (durations), flap_period, stall, disk_delay,
//                clock_step
//   [timeouts]   liveness, collective, bootstrap, rpc, retry, join_wait, watchdog,
//                driver_silence, cluster_start: durations such as "2s", "300ms" (see Timeouts)
//
// Every field is optional (defaults below: the tiny GPT on the fortunes corpus). Parsing rejects
// unknown sections and keys, wrong types and out-of-range values with a message naming the file
// and the field, with what was expected and what was found.
//
// Example:
//   absl::StatusOr<JobSpec> spec = LoadJobSpec("job.toml");
//   absl::StatusOr<JobSpec> same = ParseJobSpec(spec->ToToml(), "job.toml");
#ifndef TROUPE_TRAIN_JOB_SPEC_H_
#define TROUPE_TRAIN_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "troupe/model/optimizer.h"
#include "troupe/train/lowcomm.h"
#include "troupe/train/pipeline.h"
#include "troupe/train/trainable.h"

namespace troupe::train {

// An injected fault: `kind`@`step`[:`arg`][:`point`].
//   kill-worker@S[:R][:P]    the process of rank R (default 1) kills itself with SIGKILL in the
//                            middle of step S: P = mid-exchange (the default: its gradient
//                            exchange under way), mid-gather (the updated parameters' share
//                            under way, the optimizer partly done) or mid-checkpoint (half of
//                            its shard of checkpoint S written: S a multiple of checkpoint.every)
//   stop-worker@S[:R][:P]    the same with SIGSTOP: a hung process, found by missed heartbeats
//                            and fenced (SIGKILL) by its node
//   kill-shard-and-buddy@S[:R][:P]  rank R (default 1) and its buddy (R + the generation's
//                            buddy offset) are killed together in step S
//   sigterm-node@S[:R]       the node of rank R gets SIGTERM (grace: the node's) before step S
//   join-worker@S[:Z]        a node with one more worker joins before step S (in zone g<Z> of
//                            the embedded cluster's [lowcomm] groups: Z >= groups, a new group)
//   kill-coordinator@S       the coordinator's process is killed before step S
//   crash-in-checkpoint@S    the coordinator's process is killed in the middle of committing
//                            the first checkpoint at or after step S (manifest written, LATEST
//                            not yet moved)
//   partition-node@S[:R]     the host of rank R's node is cut off from every other host, both
//                            ways, before step S, for [chaos] network_fault (then healed)
//   drop-node@S[:R]          the host of rank R's node loses [chaos] drop_percent % of its
//                            packets each way before step S, for [chaos] network_fault
//   stall-coordinator@S      the coordinator's actor blocks for [chaos] stall before step S (a
//                            stalled disk, a paused VM); the head reports it hung, the ranks wait
//   delay-node@S[:R]         every packet in or out of the host of rank R's node is held [chaos]
//                            delay ± jitter before step S, for [chaos] network_fault (a relay of
//                            troupe's on that host: no netem needed)
//   oneway-node@S[:R]        what the host of rank R's node sends is dropped, what is sent to it
//                            arrives, before step S, for [chaos] network_fault
//   flap-node@S[:R]          the host of rank R's node cut off both ways and restored, every
//                            [chaos] flap_period in turn, before step S, for [chaos] network_fault
//   hang-worker@S[:R][:P]    rank R's step stops making progress at P of step S (mid-exchange or
//                            mid-gather: stuck in a collective) while its process, actors,
//                            heartbeats and liveness channel go on answering
//   disk-full@S[:N]          the checkpoint disk is full for the checkpoints of steps S..S+N-1
//                            (N default checkpoint.every): each write fails half-way with ENOSPC
//   disk-fail@S[:N]          the same disk fails instead: every fsync returns EIO
//   disk-slow@S[:N]          the same disk is slow: every write and fsync waits [chaos] disk_delay
//   spot-notice@S[:R]        the node of rank R gets its cloud's spot notice through the metadata
//                            endpoint its agent watches (an AWS instance-action, or GCE's
//                            preempted; a simulated endpoint: --metadata_endpoint simulate) before
//                            step S; handed over like sigterm-node's
//   clock-step@S[:R]         the wall clock of rank R's process steps by [chaos] clock_step
//                            (default +1h; "-1h" steps it back) before step S, as an NTP step
//                            would; its monotonic clock does not (the worker runs with
//                            libtroupe_clock_step.so preloaded when TROUPE_CLOCK_STEP_DIR is set,
//                            as `troupe chaos run` does)
//   kill-head@S, stop-head@S the head killed (-9) and started again from its store 0.3 s later, or
//                            stopped (SIGSTOP) for [chaos] network_fault, once step S is
//                            committed: carried out by `troupe chaos run --lab` on the head's host
//                            (the head is no process of the job's); `troupe train` refuses them
//   corrupt-update@S:R       [lowcomm]: the group of rank R (its first rank: the one that sends)
//                            sends a corrupted pseudo-gradient (1000 × its Δ) in the outer sync
//                            that ends step S (S + 1 a multiple of inner_steps) — what the robust
//                            outer step ([lowcomm] robust) is for
// The network faults are carried out by the node's agent on its own host (iptables in its network
// namespace: the agent needs CAP_NET_ADMIN, as root on a host of its own has); a heal happens
// even if the agent dies meanwhile. Loopback is never touched, so on a one-machine cluster they
// change nothing.
enum class FaultKind {
  kKillWorker,
  kStopWorker,
  kKillShardAndBuddy,
  kSigtermNode,
  kJoinWorker,
  kKillCoordinator,
  kCrashInCheckpoint,
  kPartitionNode,
  kDropNode,
  kStallCoordinator,
  kDelayNode,
  kOneWayNode,
  kFlapNode,
  kKillHead,
  kStopHead,
  kHangWorker,
  kDiskFull,
  kDiskFail,
  kDiskSlow,
  kSpotNotice,
  kClockStep,
  kCorruptUpdate,
};
// The last kind (for listing them all).
constexpr FaultKind kLastFaultKind = FaultKind::kCorruptUpdate;
// disk-full, disk-fail, disk-slow: the checkpoint store's FileSystem carries them out
// (chaos_file_system.h), in every process that writes checkpoints.
bool IsDiskFault(FaultKind kind);
// kill-head and stop-head: faults of the cluster's head, which `troupe chaos run --lab` carries
// out; not the job's.
bool IsHeadFault(FaultKind kind);
// "kill-worker", ... as written in job specs and on the command line.
const char* FaultKindName(FaultKind kind);

struct Fault {
  FaultKind kind = FaultKind::kKillWorker;
  int64_t step = 0;
  int32_t arg = -1;
  StepPoint point = StepPoint::kExchange;  // the kinds that kill inside a step
  std::string ToString() const;
};
[[nodiscard]] absl::StatusOr<Fault> ParseFault(const std::string& text);

// Every deadline of a training job, in one place. Validated relations: liveness < collective
// < watchdog; bootstrap, rpc and retry each < watchdog; watchdog < driver_silence.
struct Timeouts {
  // A peer rank silent this long is dead (the collectives' liveness channel): how fast a hung
  // (SIGSTOPped) process is found.
  absl::Duration liveness = absl::Seconds(2);
  // One collective's deadline (a generation that cannot finish its exchange gives up).
  absl::Duration collective = absl::Seconds(30);
  // A generation's communicator connects (every rank publishes and finds the others) within this.
  absl::Duration bootstrap = absl::Seconds(20);
  // A control request: the collectives' bootstrap store, head lookups, the membership table.
  absl::Duration rpc = absl::Seconds(10);
  // After a rank reports a failure, before the coordinator regenerates (a down event that
  // explains the failure usually arrives first).
  absl::Duration retry = absl::Milliseconds(300);
  // join-worker@S: step S waits this long for the joining worker.
  absl::Duration join_wait = absl::Seconds(60);
  // Preemption notices that come within this long of the first are handed over together, at one
  // step boundary (a cloud reclaims machines in batches); training goes on meanwhile.
  absl::Duration notice_window = absl::Milliseconds(250);
  // No step committed for this long, with work to do: the job fails rather than hang.
  absl::Duration watchdog = absl::Seconds(120);
  // The driver gives up on a coordinator it has not heard from for this long.
  absl::Duration driver_silence = absl::Seconds(180);
  // The embedded cluster's workers register within this.
  absl::Duration cluster_start = absl::Seconds(60);
};

struct JobSpec {
  std::string name = "tiny-gpt";
  int64_t steps = 40;
  uint64_t seed = 1;
  std::string work_dir = "troupe-job";
  bool deterministic = true;
  // On a shared cluster: a queued job of higher priority is granted ranks first, and takes them
  // from running jobs of lower priority above their min_workers (job_gang_atom, cluster.h).
  int32_t priority = 0;

  ModelSpec model;
  model::AdamWConfig adamw;
  // [optimizer] state = "replicated" (ElasticRank::Options::replicate_optimizer): every rank
  // keeps the whole optimizer state and runs AdamW on every parameter, so the ranks share the
  // reduced gradient — as the backward pass finishes it — instead of the updated parameters
  // after AdamW, and no buddy mirror is sent. Deterministic data parallelism on the host only.
  bool replicate_optimizer = false;
  model::LrSchedule schedule;  // total_steps follows `steps` unless set

  int32_t workers = 4;
  int32_t min_workers = 1;
  int32_t max_workers = 8;
  // Model on CUDA, embedded cluster: how many worker nodes may share one GPU (1: a GPU each, as
  // NCCL wants). Above 1, each rank is told it is a host of its own (NCCL_HOSTID) and NCCL moves
  // bytes between them over sockets on loopback: small jobs on one big GPU, the elastic path on a
  // one-GPU machine (SharedGpuEnvironment).
  int32_t ranks_per_gpu = 1;
  // The deterministic step sends the gradient in pieces of this many KiB (whole 16 KiB norm
  // chunks) as the backward pass finishes them, and gathers the parameters in pieces behind
  // AdamW (ElasticRank::Options::bucket_bytes); 0: the rank chooses by its link (16 MiB on one
  // host, 4 MiB across hosts).
  int32_t bucket_kib = 0;
  // The sharded step's updated parameters as a lossless delta ("on"), as they are ("off"), or
  // each rank choosing by its link ("auto"; ElasticRank::Options::param_delta). Only the
  // deterministic data-parallel step in host memory gathers parameters: elsewhere (replicated
  // state, fast mode, pipeline grids, a GPU) it changes nothing.
  ParamDelta param_delta = ParamDelta::kAuto;
  // What each rank asks of the cluster's scheduler (runtime::RankGang): its resources ("" =
  // cpu=1, plus gpu=1 with model.device on CUDA; e.g. "cpu=2,memory=8G"), node labels that must
  // hold ("zone=a,instance=p5"), and "prefer" (spot nodes first: a preemption only shrinks the
  // job), "avoid" or "none".
  std::string rank_resources;
  std::string rank_labels;
  std::string rank_spot = "prefer";

  int32_t pipeline_stages = 1;  // 1: data parallelism only
  PipelineSchedule pipeline_schedule = PipelineSchedule::kOneFOneB;

  // [lowcomm]: groups 0 = off.
  int32_t lowcomm_groups = 0;
  LowCommOptions lowcomm;

  // [eval] every: evaluate after every this many steps (and after the last); 0: never. Its shard
  // and microbatches are model.eval_shard and model.eval_microbatches.
  int64_t eval_every = 0;

  std::string checkpoint_dir;  // "" = <work_dir>/ckpt
  int64_t checkpoint_every = 10;
  int32_t keep_last = 3;

  std::vector<Fault> faults;
  absl::Duration network_fault = absl::Seconds(3);     // partition-node, drop-node: how long
  int32_t drop_percent = 5;                            // drop-node: of the packets each way
  absl::Duration stall = absl::Seconds(12);            // stall-coordinator: how long
  absl::Duration delay = absl::Milliseconds(5);        // delay-node: each way, on the node's host
  absl::Duration jitter = absl::Milliseconds(1);       // delay-node: ± (uniform), at most delay
  absl::Duration flap_period = absl::Seconds(1);       // flap-node: each cut, and each gap
  absl::Duration disk_delay = absl::Milliseconds(50);  // disk-slow: each write and fsync
  absl::Duration clock_step = absl::Hours(1);          // clock-step: by how much (+ or -)
  Timeouts timeouts;

  std::string ToToml() const;
  std::string CheckpointDir() const;
};

[[nodiscard]] absl::StatusOr<JobSpec> ParseJobSpec(const std::string& toml_text,
                                                   const std::string& file);
[[nodiscard]] absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_JOB_SPEC_H_
