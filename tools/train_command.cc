// troupe train: an elastic training job (actors/training.h) on the embedded local cluster, or on a
// running one with --head. Flags (or TROUPE_* variables) override the job spec file's fields.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commands.h"
#include "troupe/actors/training.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/config.h"
#include "troupe/train/preempted.h"

namespace troupe::tools {
namespace {

constexpr char kUsage[] =
    "usage: troupe train [--spec FILE.toml] [--head HOST:PORT] [--workers N] [--steps N]\n"
    "                    [--work_dir DIR] [--data_dir DIR] [--chaos KIND@STEP[:ARG]]...\n"
    "                    [--report FILE] [--tls_ca F --tls_cert F --tls_key F]\n"
    "  --spec     job spec (TOML: [job] [model] [optimizer] [elastic] [checkpoint] [chaos])\n"
    "  --head     submit to a running cluster; without it an embedded cluster is started\n"
    "  --tls_*    the cluster's CA and this driver's certificate and key (`troupe certs`): needed\n"
    "             to submit to a cluster whose head runs with mutual TLS; without --head, the\n"
    "             embedded cluster runs with mutual TLS using these files\n"
    "  --chaos    inject a fault: kill-worker@S[:R][:P], stop-worker@S[:R][:P],\n"
    "             kill-shard-and-buddy@S[:R][:P] (P: mid-exchange, the default, mid-gather or\n"
    "             mid-checkpoint), hang-worker@S[:R][:P] (stuck in a collective, alive),\n"
    "             sigterm-node@S[:R], join-worker@S, kill-coordinator@S, crash-in-checkpoint@S,\n"
    "             partition-node@S[:R], drop-node@S[:R] (the node's host, for [chaos] "
    "network_fault),\n"
    "             delay-node@S[:R] (packets held [chaos] delay ± jitter), oneway-node@S[:R]\n"
    "             (what the host sends is dropped), flap-node@S[:R] (cut and restored every\n"
    "             [chaos] flap_period),\n"
    "             stall-coordinator@S (its actor blocks for [chaos] stall), disk-full@S[:N],\n"
    "             disk-fail@S[:N], disk-slow@S[:N] (the checkpoints of steps S..S+N-1),\n"
    "             spot-notice@S[:R] (through the node's metadata endpoint), clock-step@S[:R]\n"
    "             (the rank's wall clock by [chaos] clock_step; needs TROUPE_CLOCK_STEP_DIR)\n"
    "  --report   write 'recovery_s=<s> steps_lost=<n> crc32c=<hex> steps=<n> world=<n>\n"
    "             generations=<n> tokens_per_s=<x> bubble=<share> overlap=<share>' when done,\n"
    "             a line 'step_s=<s> compute_s=<s> exposed_s=<s> update_s=<s> delta_share=<x>'\n"
    "             (a rank's mean step: forwards and backwards, exposed communication,\n"
    "             optimizer; the share of rank steps sending a parameter delta), a line\n"
    "             'val_loss=<x>' (the final parameters') with [eval], one\n"
    "             'outer_rounds=<n> outer_bytes=<n>' (between groups) with [lowcomm]\n"
    "Exit status: 0 done, 1 failed, 2 bad spec or flags, 75 preempted (every worker got a\n"
    "preemption notice; the committed step is checkpointed: run the same command to resume).";

// EX_TEMPFAIL (sysexits.h): a batch system's cue to run the job again (SLURM --requeue, a
// Kubernetes Job's backoff).
constexpr int kExitPreempted = 75;

// What `troupe train` reads from its command line, and where each option is declared.
struct TrainFlags {
  SpecFlags spec;
  std::string head, report_path, job;
  actors::TrainOptions options;

  void Register(runtime::ConfigRegistry& config) {
    options.runtime.Register(config);  // --tls_ca/--tls_cert/--tls_key, --threads, ... as roles
    spec.Register(config);
    config.AddString("head", &head,
                     "HOST:PORT of a running cluster's head to submit to; \"\": start an "
                     "embedded cluster on this machine",
                     [](const std::string& v) {
                       return v.empty() || runtime::ParseHostPort(v).ok()
                                  ? std::string()
                                  : std::string("expected HOST:PORT (e.g. 127.0.0.1:7000)");
                     });
    config.AddString("job", &job,
                     "the id of the submitted job this driver runs (set by the node agent that "
                     "`troupe job submit` had start it); \"\": a job of its own");
    config.AddString("report", &report_path, "write a one-line report here when done");
    config.AddDuration("head_grace", &options.head_grace,
                       "a job whose head is lost waits this long for one to take over, then "
                       "fails naming it (the embedded cluster restarts its head at once)",
                       runtime::Positive());
  }
};

}  // namespace

void SpecFlags::Register(runtime::ConfigRegistry& config) {
  config.AddString("spec", &spec_path, "job spec file (TOML); \"\": the defaults");
  config.AddInt("workers", &workers, "worker processes ([elastic] workers; 0: the spec's)",
                runtime::AtLeast(1));
  config.AddInt("steps", &steps, "steps to train ([job] steps; 0: the spec's)",
                runtime::AtLeast(1));
  config.AddString("work_dir", &work_dir, "job directory ([job] work_dir; \"\": the spec's)");
  config.AddString("data_dir", &data_dir,
                   "token shards ([model] data_dir; \"\": the spec's, or <work_dir>/data)");
  config.AddStringList("chaos", &chaos,
                       "faults to inject, KIND@STEP[:ARG][:POINT] (added to the spec's)",
                       [](const std::string& v) {
                         absl::StatusOr<train::Fault> f = train::ParseFault(v);
                         return f.ok() ? std::string() : std::string(f.status().message());
                       });
}

absl::StatusOr<train::JobSpec> SpecFlags::Make() const {
  absl::StatusOr<train::JobSpec> spec =
      spec_path.empty() ? train::ParseJobSpec("", "(defaults)") : train::LoadJobSpec(spec_path);
  if (!spec.ok()) return spec.status();
  if (workers > 0) {
    // Refused above [elastic] max_workers, never clamped: the ceiling is the spec's to raise.
    if (workers > spec->max_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--workers ", workers, ": above [elastic] max_workers (", spec->max_workers, ") of ",
          spec_path.empty() ? "the default spec" : spec_path,
          "; raise max_workers (and model.microbatches: every worker computes at least one)"));
    }
    spec->workers = static_cast<int32_t>(workers);
    spec->min_workers = std::min(spec->min_workers, spec->workers);
  }
  if (steps > 0) {
    spec->steps = steps;
    spec->schedule.total_steps = steps;
  }
  if (!work_dir.empty()) spec->work_dir = work_dir;
  if (!data_dir.empty()) spec->model.data_dir = data_dir;
  for (const std::string& c : chaos) {
    TROUPE_ASSIGN_OR_RETURN(train::Fault fault, train::ParseFault(c));
    spec->faults.push_back(fault);
  }
  // Re-validate the combination (flags may have moved fields out of range).
  return train::ParseJobSpec(spec->ToToml(), "flags + spec");
}

int RunTrain(const Args& args) {
  TrainFlags flags;
  runtime::ConfigRegistry config;
  flags.Register(config);
  if (int rc = runtime::ParseCommandLine("train", kUsage, args, config); rc >= 0) return rc;
  absl::StatusOr<train::JobSpec> spec = flags.spec.Make();
  if (!spec.ok()) {
    std::fprintf(stderr, "troupe train: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  flags.options.head = flags.head;
  flags.options.job_id = flags.job;
  absl::StatusOr<actors::JobReport> report = actors::RunTrainingJob(*spec, flags.options);
  if (!report.ok()) {
    std::fprintf(stderr, "troupe train: %s\n", report.status().ToString().c_str());
    return train::IsPreempted(report.status()) ? kExitPreempted : 1;
  }
  if (!flags.report_path.empty()) {
    std::ofstream out(flags.report_path);
    out << absl::StrFormat(
        "recovery_s=%.6f steps_lost=%d crc32c=%08x steps=%d world=%d generations=%d "
        "tokens_per_s=%.1f bubble=%.4f overlap=%.4f\n",
        report->recovery_seconds, report->steps_lost, report->final_params_crc32c,
        report->committed_steps, report->final_world, report->generations,
        report->tokens_per_second, report->bubble, report->overlap);
    out << absl::StrFormat(
        "step_s=%.6f compute_s=%.6f exposed_s=%.6f update_s=%.6f delta_share=%.4f\n",
        report->step_seconds, report->compute_seconds, report->exposed_seconds,
        report->update_seconds, report->delta_share);
    if (report->val_step >= 0) out << absl::StrFormat("val_loss=%.6f\n", report->val_loss);
    if (report->outer_rounds > 0) {
      out << absl::StrFormat("outer_rounds=%d outer_bytes=%d\n", report->outer_rounds,
                             report->outer_bytes);
    }
  }
  return 0;
}

}  // namespace troupe::tools
