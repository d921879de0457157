// troupe/actors/training.h — elastic training as actors across worker processes.
//
//   driver (troupe train, or your program)           worker processes (one rank actor each)
//   ┌──────────────────────────────────────┐        ┌───────────────────────────────────────┐
//   │ coordinator actor: generations,      │ CAF →  │ rank actor "troupe.rank":             │
//   │ step commits, checkpoint manifests,  │        │   data loader (pure data function),   │
//   │ recovery, chaos; bootstrap key-value │ ← CAF  │   trainer (forward/backward),         │
//   │ store for the collectives            │        │   parameter shard (ZeRO range + AdamW │
//   │ driver thread: membership, spawning  │        │   + buddy mirror), checkpoint writer  │
//   └──────────────────────────────────────┘        └───────── UCX (tensors) ───────────────┘
//
// Control messages are small CAF messages; gradients and parameters move only through the
// collectives (UCX between the worker processes), bootstrapped over the coordinator.
//
// A generation is a fixed group of ranks. Each membership change (a rank's process dies, a node
// drains, a worker joins at a step boundary) aborts the generation's collectives, re-plans the
// ranks and restores the committed state (ElasticRank::Configure: memory, buddy mirror or
// checkpoint); the step in flight is abandoned and re-run. Only committed steps count.
//
// Files under the job's work_dir: serve/<worker>.log — one "step microbatch generation" line per
// microbatch a data loader served, written before it is computed; commits.log — one
// "step generation" line per committed step; logs/ — the worker processes' output; ckpt/.
//
// Example (a program that embeds troupe and trains its own model):
//   int main(int argc, char** argv) {
//     TrainableRegistry::Global().Register("mlp", MakeMlp);
//     troupe::runtime::ActorRegistry registry;
//     RegisterTrainingActors(registry);
//     if (int rc = troupe::runtime::RunMain(argc, argv, registry); rc >= 0) return rc;  // a role
//     absl::StatusOr<JobReport> r = RunTrainingJob(*LoadJobSpec("job.toml"), {});
//   }
#ifndef TROUPE_ACTORS_TRAINING_H_
#define TROUPE_ACTORS_TRAINING_H_

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/runtime/registry.h"
#include "troupe/runtime/runtime_options.h"
#include "troupe/train/job_spec.h"

namespace troupe::actors {

// Registers "troupe.rank" (args: job spec TOML, worker id). Every program whose worker processes
// run training jobs calls this before RunMain.
[[nodiscard]] absl::Status RegisterTrainingActors(runtime::ActorRegistry& registry);

struct JobReport {
  int64_t committed_steps = 0;
  std::vector<double> losses;  // per committed step
  uint32_t final_params_crc32c = 0;
  int64_t num_params = 0;
  int generations = 0;
  int final_world = 0;
  // First injected fault: from the kill (as the dying process wrote it down) to the next commit.
  double recovery_seconds = -1;
  int64_t steps_lost = 0;  // committed steps recomputed after faults (checkpoint rollbacks)
  double tokens_per_second = 0;
  // The share of the ranks' forward-and-backward time spent waiting (steps after the first):
  // a pipeline's bubble; near 0 for data parallelism.
  double bubble = 0;
  // The share of the ranks' gradient exchange and parameter share (steps after the first) that
  // ran while they computed or stepped the optimizer: the overlapped step's hidden communication.
  // 0 where nothing overlapped (fast mode, pipeline grids).
  double overlap = 0;
  // A rank's mean step (steps after the first) by phase, seconds: all of it, its forwards and
  // backwards in the model, the communication left exposed (overlapped step), the optimizer
  // (sharded: AdamW, the mirror's and the parameter delta's encoding and decoding; replicated:
  // the norm from the shares, its AdamW runs at the commit, outside the step). The rest is the
  // norm, the step's hand-offs, an evaluation due and, on a pipeline, the bubble.
  double step_seconds = 0, compute_seconds = 0, exposed_seconds = 0, update_seconds = 0;
  // The share of those rank steps whose updated parameters went as a lossless delta
  // ([elastic] param_delta).
  double delta_share = 0;
  // [eval]: the validation loss of the final parameters (val_step = committed_steps), and every
  // evaluation as (steps, loss); val_step -1 without [eval].
  int64_t val_step = -1;
  double val_loss = 0;
  std::vector<std::pair<int64_t, double>> val_losses;
  // [lowcomm]: bytes the ranks sent to other groups (the outer exchange), and its rounds.
  uint64_t outer_bytes = 0;
  int64_t outer_rounds = 0;
};

// The driver's runtime unless told otherwise: no supervision lines on stderr, and a short
// shutdown (it owns only the driver relay and the job supervisor, neither with state to save;
// when the cluster is gone, waiting long for their remote children helps no one).
runtime::RuntimeOptions DefaultDriverRuntimeOptions();

struct TrainOptions {
  std::string binary;  // embedded cluster: the program to run roles with ("" = this one)
  std::string head;    // "HOST:PORT" of a running cluster; "" = start the embedded one
  std::ostream* progress = nullptr;  // one line per step and per event; std::cout when null
  // The head lost: the job pauses at a step boundary while the driver, the coordinator and every
  // node and worker rejoin the head that takes over (restarted, or a standby on its address);
  // the job fails, naming the head, when none has after this long. The embedded cluster's head
  // is restarted from its store at once.
  runtime::Duration head_grace = std::chrono::seconds(30);
  // Every job is registered with its cluster's head (`troupe job list`, the dashboard, /metrics);
  // this is the id of the submitted job (`troupe job submit`) this driver runs, "" for a new one.
  std::string job_id;
  // The driver process's runtime, declared in `troupe train`'s config registry like every role's
  // (--tls_ca/--tls_cert/--tls_key or TROUPE_TLS_*, --threads, ...). With TLS the driver reaches
  // the head over mutual TLS, and an embedded cluster runs with the same certificate files.
  // `network` is turned on by RunTrainingJob.
  runtime::RuntimeOptions runtime = DefaultDriverRuntimeOptions();
};

// Runs `spec` to its last step (or an error that cannot be recovered from, e.g. fewer than
// min_workers for too long) and returns what happened. The GPT reads model.data_dir, which
// defaults to <work_dir>/data and is prepared from the fortunes corpus when empty. Every worker
// noticed (preempted) at once: the committed step is checkpointed and the job returns an error
// for which IsPreempted holds; running it again resumes from that checkpoint.
[[nodiscard]] absl::StatusOr<JobReport> RunTrainingJob(train::JobSpec spec,
                                                       const TrainOptions& options);

// Model on CUDA, embedded cluster on a machine with `gpus` GPUs: OK when spec.workers nodes fit
// at [elastic] ranks_per_gpu per GPU; otherwise InvalidArgument naming the option and the value
// that would fit, or FailedPrecondition when there is no GPU.
[[nodiscard]] absl::Status CheckEmbeddedGpuCount(const train::JobSpec& spec, int gpus);

// The environment of an embedded worker node on GPU `gpu`, the `slot`-th (0-based) of the
// ranks_per_gpu nodes that may share it. CUDA_VISIBLE_DEVICES always; with ranks_per_gpu > 1, each
// node is also a host of its own to NCCL, which refuses two ranks of one communicator on one
// device ("Duplicate GPU detected": same host hash and bus id): NCCL_HOSTID names the slot, so
// ranks sharing a device are different hosts, reaching each other by sockets on the loopback
// interface (NCCL_SOCKET_IFNAME=lo, no InfiniBand) — the embedded cluster's processes share this
// host — while ranks of one slot on different GPUs stay one host.
std::map<std::string, std::string> EmbeddedGpuEnvironment(int gpu, int slot, int ranks_per_gpu);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_TRAINING_H_
