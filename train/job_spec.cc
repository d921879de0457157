#include "troupe/train/job_spec.h"

#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "toml_section.h"
#include "troupe/base/status_macros.h"

namespace troupe::train {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

namespace {
constexpr std::pair<FaultKind, const char*> kFaultKinds[] = {
    {FaultKind::kKillWorker, "kill-worker"},
    {FaultKind::kStopWorker, "stop-worker"},
    {FaultKind::kKillShardAndBuddy, "kill-shard-and-buddy"},
    {FaultKind::kSigtermNode, "sigterm-node"},
    {FaultKind::kJoinWorker, "join-worker"},
    {FaultKind::kKillCoordinator, "kill-coordinator"},
    {FaultKind::kCrashInCheckpoint, "crash-in-checkpoint"},
    {FaultKind::kPartitionNode, "partition-node"},
    {FaultKind::kDropNode, "drop-node"},
    {FaultKind::kStallCoordinator, "stall-coordinator"},
    {FaultKind::kDelayNode, "delay-node"},
    {FaultKind::kOneWayNode, "oneway-node"},
    {FaultKind::kFlapNode, "flap-node"},
    {FaultKind::kKillHead, "kill-head"},
    {FaultKind::kStopHead, "stop-head"},
    {FaultKind::kHangWorker, "hang-worker"},
    {FaultKind::kDiskFull, "disk-full"},
    {FaultKind::kDiskFail, "disk-fail"},
    {FaultKind::kDiskSlow, "disk-slow"},
    {FaultKind::kSpotNotice, "spot-notice"},
    {FaultKind::kClockStep, "clock-step"},
    {FaultKind::kCorruptUpdate, "corrupt-update"},
};
}  // namespace

bool IsHeadFault(FaultKind kind) {
  return kind == FaultKind::kKillHead || kind == FaultKind::kStopHead;
}

bool IsDiskFault(FaultKind kind) {
  return kind == FaultKind::kDiskFull || kind == FaultKind::kDiskFail ||
         kind == FaultKind::kDiskSlow;
}

const char* FaultKindName(FaultKind kind) {
  for (const auto& [k, name] : kFaultKinds) {
    if (k == kind) return name;
  }
  return "?";
}

std::string Fault::ToString() const {
  std::string out = absl::StrCat(FaultKindName(kind), "@", step);
  if (arg >= 0) absl::StrAppend(&out, ":", arg);
  if (point != StepPoint::kExchange) absl::StrAppend(&out, ":", StepPointName(point));
  return out;
}

absl::StatusOr<Fault> ParseFault(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '@');
  Fault f;
  bool known = false;
  for (const auto& [k, name] : kFaultKinds) {
    if (parts[0] == name) {
      f.kind = k;
      known = true;
    }
  }
  if (parts.size() != 2 || !known) {
    std::vector<std::string> names;
    for (const auto& [k, name] : kFaultKinds) names.push_back(name);
    return absl::InvalidArgumentError(
        absl::StrCat("fault: expected KIND@STEP[:ARG] with KIND one of ",
                     absl::StrJoin(names, ", "), ", got '", text, "'"));
  }
  std::vector<std::string> sa = absl::StrSplit(parts[1], ':');
  // A trailing point names where inside the step a kill (or a hang) strikes.
  const bool kills = f.kind == FaultKind::kKillWorker || f.kind == FaultKind::kStopWorker ||
                     f.kind == FaultKind::kKillShardAndBuddy;
  if (sa.size() >= 2 && !sa.back().empty() && !absl::ascii_isdigit(sa.back()[0])) {
    bool known_point = false;
    for (StepPoint p : {StepPoint::kExchange, StepPoint::kGather, StepPoint::kCheckpoint}) {
      if (sa.back() != StepPointName(p)) continue;
      f.point = p;
      known_point = true;
    }
    if (!known_point) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault '", text,
                       "': expected the point mid-exchange, mid-gather or mid-checkpoint, got '",
                       sa.back(), "'"));
    }
    const bool hangs = f.kind == FaultKind::kHangWorker && f.point != StepPoint::kCheckpoint;
    if (!kills && !hangs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fault '", text, "': a point inside the step (", sa.back(),
          ") expected only with kill-worker, stop-worker or kill-shard-and-buddy (any point) "
          "or hang-worker (mid-exchange, mid-gather)"));
    }
    sa.pop_back();
  }
  if (sa.size() > 2 || !absl::SimpleAtoi(sa[0], &f.step) || f.step < 0 ||
      (sa.size() == 2 && (!absl::SimpleAtoi(sa[1], &f.arg) || f.arg < 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", text,
                     "': expected STEP (an integer >= 0), optional :ARG and optional :POINT, "
                     "got '",
                     parts[1], "'"));
  }
  return f;
}

std::string JobSpec::CheckpointDir() const {
  return checkpoint_dir.empty() ? work_dir + "/ckpt" : checkpoint_dir;
}

namespace {

void ReadJob(Section& s, JobSpec& spec) {
  s.Str("name", &spec.name, true);
  s.Int("steps", &spec.steps, 1, int64_t{1} << 40);
  int64_t seed = static_cast<int64_t>(spec.seed);
  s.Int("seed", &seed, 0, std::numeric_limits<int64_t>::max());
  spec.seed = static_cast<uint64_t>(seed);
  s.Str("work_dir", &spec.work_dir, true);
  s.Bool("deterministic", &spec.deterministic);
  s.Int32("priority", &spec.priority, -1000, 1000);
  spec.model.seed = spec.seed;
}

void ReadModel(Section& s, JobSpec& spec) {
  s.Str("type", &spec.model.type, true);
  s.Str("size", &spec.model.size, true);
  s.Str("data_dir", &spec.model.data_dir);
  s.Str("device", &spec.model.device);
  s.Str("precision", &spec.model.precision, true);
  s.Int32("seq_len", &spec.model.seq_len, 1, 1 << 20);
  s.Int32("microbatch_size", &spec.model.microbatch_size, 1, 1 << 20);
  s.Int32("microbatches", &spec.model.microbatches, 1, 1 << 16);
  if (const toml::node* o = s.Raw("options")) {
    if (!o->is_table()) {
      s.Fail("options", "a table of strings", TypeName(o->type()));
    } else {
      for (auto&& [k, v] : *o->as_table()) {
        std::optional<std::string> str = v.value_exact<std::string>();
        if (!str) {
          s.Fail(absl::StrCat("options.", std::string(k.str())), "a string", TypeName(v.type()));
          break;
        }
        spec.model.options[std::string(k.str())] = *str;
      }
    }
  }
}

void ReadOptimizer(Section& s, JobSpec& spec) {
  s.Float("lr", &spec.schedule.max_lr, 0, 10);
  s.Float("min_lr", &spec.schedule.min_lr, 0, 10);
  s.Int("warmup_steps", &spec.schedule.warmup_steps, 0, int64_t{1} << 40);
  const bool total_set = s.Raw("total_steps") != nullptr;
  s.Int("total_steps", &spec.schedule.total_steps, 1, int64_t{1} << 40);
  s.Float("weight_decay", &spec.adamw.weight_decay, 0, 10);
  s.Float("max_grad_norm", &spec.adamw.max_grad_norm, 0, 1e9);
  s.Float("beta1", &spec.adamw.beta1, 0, 0.999999);
  s.Float("beta2", &spec.adamw.beta2, 0, 0.999999);
  if (!total_set) spec.schedule.total_steps = spec.steps;
  std::string state = spec.replicate_optimizer ? "replicated" : "sharded";
  s.Str("state", &state, true);
  if (state == "sharded" || state == "replicated") {
    spec.replicate_optimizer = state == "replicated";
  } else {
    s.Fail("state", "\"sharded\" or \"replicated\"", absl::StrCat("\"", state, "\""));
  }
}

void ReadElastic(Section& s, JobSpec& spec) {
  s.Int32("workers", &spec.workers, 1, 1024);
  s.Int32("min_workers", &spec.min_workers, 1, 1024);
  s.Int32("max_workers", &spec.max_workers, 1, 1024);
  s.Int32("ranks_per_gpu", &spec.ranks_per_gpu, 1, 64);
  s.Int32("bucket_kib", &spec.bucket_kib, 0, 1 << 20);
  std::string delta = ParamDeltaName(spec.param_delta);
  s.Str("param_delta", &delta, true);
  if (delta == "auto" || delta == "on" || delta == "off") {
    spec.param_delta = delta == "on"    ? ParamDelta::kOn
                       : delta == "off" ? ParamDelta::kOff
                                        : ParamDelta::kAuto;
  } else {
    s.Fail("param_delta", "\"auto\", \"on\" or \"off\"", absl::StrCat("\"", delta, "\""));
  }
  s.Str("rank_resources", &spec.rank_resources);
  s.Str("rank_labels", &spec.rank_labels);
  s.Str("rank_spot", &spec.rank_spot, true);
}

// "k=v,k=v" (no empty key or value), as --resources and --labels take it.
bool KeyValueList(const std::string& text) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t eq = item.find('=');
    if (eq == 0 || eq == absl::string_view::npos || eq + 1 == item.size()) return false;
  }
  return true;
}

void ReadPipeline(Section& s, JobSpec& spec) {
  s.Int32("stages", &spec.pipeline_stages, 1, 1024);
  std::string schedule = PipelineScheduleName(spec.pipeline_schedule);
  s.Str("schedule", &schedule, true);
  if (absl::StatusOr<PipelineSchedule> p = ParsePipelineSchedule(schedule); p.ok()) {
    spec.pipeline_schedule = *p;
  } else {
    s.Fail("schedule", "\"1f1b\" or \"gpipe\"", absl::StrCat("\"", schedule, "\""));
  }
}

void ReadCheckpoint(Section& s, JobSpec& spec) {
  s.Str("dir", &spec.checkpoint_dir);
  s.Int("every", &spec.checkpoint_every, 0, int64_t{std::numeric_limits<int32_t>::max()});
  s.Int32("keep_last", &spec.keep_last, 1, 1000);
}

void ReadEval(Section& s, JobSpec& spec) {
  s.Int("every", &spec.eval_every, 0, int64_t{1} << 40);
  s.Str("shard", &spec.model.eval_shard);
  s.Int32("microbatches", &spec.model.eval_microbatches, 0, 1 << 16);
  // 0 (the default): as many as a step has. Off: nothing is opened.
  if (spec.model.eval_microbatches == 0) spec.model.eval_microbatches = spec.model.microbatches;
  if (spec.eval_every == 0) spec.model.eval_microbatches = 0;
}

void ReadLowComm(Section& s, JobSpec& spec) {
  LowCommOptions& o = spec.lowcomm;
  s.Int32("groups", &spec.lowcomm_groups, 0, 1024);
  s.Int("inner_steps", &o.inner_steps, 1, int64_t{1} << 40);
  s.Float("outer_lr", &o.outer_lr, 0, 100);
  s.Float("outer_momentum", &o.outer_momentum, 0, 0.999999);
  s.Int32("fragments", &o.fragments, 1, 1 << 16);
  std::string compression = CompressionName(o);
  s.Str("compression", &compression, true);
  if (absl::Status c = ParseCompression(compression, &o); !c.ok()) {
    s.Fail("compression", "\"none\", \"int8\" or \"topk:<fraction>\" (0 < fraction <= 1)",
           absl::StrCat("\"", compression, "\""));
  }
  std::string robust = RobustOuterName(o.robust);
  s.Str("robust", &robust, true);
  if (absl::StatusOr<RobustOuter> r = ParseRobustOuter(robust); r.ok()) {
    o.robust = *r;
  } else {
    s.Fail("robust", "\"none\", \"clip\" or \"reject\"", absl::StrCat("\"", robust, "\""));
  }
  s.Number("robust_factor", &o.robust_factor, 1, 1e9);
  s.Bool("verify_feedback", &o.verify_feedback);
  s.Bool("stale_outer", &o.stale_outer);
}

void ReadChaos(Section& s, JobSpec& spec) {
  if (const toml::node* f = s.Raw("faults")) {
    if (!f->is_array()) {
      s.Fail("faults", "an array of strings like \"kill-worker@10\"", TypeName(f->type()));
    } else {
      for (const toml::node& e : *f->as_array()) {
        std::optional<std::string> str = e.value_exact<std::string>();
        if (!str) {
          s.Fail("faults", "an array of strings", absl::StrCat("a ", TypeName(e.type())));
          break;
        }
        absl::StatusOr<Fault> fault = ParseFault(*str);
        if (!fault.ok()) {
          s.Fail("faults", "KIND@STEP[:ARG]",
                 absl::StrCat("'", *str, "' (", fault.status().message(), ")"));
          break;
        }
        spec.faults.push_back(*fault);
      }
    }
  }
  s.Duration("network_fault", &spec.network_fault);
  s.Int32("drop_percent", &spec.drop_percent, 1, 100);
  s.Duration("stall", &spec.stall);
  s.Duration("delay", &spec.delay);
  s.Duration("jitter", &spec.jitter, /*zero_ok=*/true);
  s.Duration("flap_period", &spec.flap_period);
  s.Duration("disk_delay", &spec.disk_delay);
  s.SignedDuration("clock_step", &spec.clock_step);
  if (spec.flap_period < absl::Milliseconds(50)) {  // each flap runs iptables twice
    s.Fail("flap_period", "at least 50ms",
           absl::StrCat("\"", absl::FormatDuration(spec.flap_period), "\""));
  }
  if (spec.jitter > spec.delay) {
    s.Fail("jitter", absl::StrCat("at most [chaos] delay (", absl::FormatDuration(spec.delay), ")"),
           absl::StrCat("\"", absl::FormatDuration(spec.jitter), "\""));
  }
}

void ReadTimeouts(Section& s, JobSpec& spec) {
  Timeouts& t = spec.timeouts;
  s.Duration("liveness", &t.liveness);
  s.Duration("collective", &t.collective);
  s.Duration("bootstrap", &t.bootstrap);
  s.Duration("rpc", &t.rpc);
  s.Duration("retry", &t.retry);
  s.Duration("join_wait", &t.join_wait);
  s.Duration("notice_window", &t.notice_window);
  s.Duration("watchdog", &t.watchdog);
  s.Duration("driver_silence", &t.driver_silence);
  s.Duration("cluster_start", &t.cluster_start);
}

// The relations between fields (each field's own range is checked as it is read).
// [elastic] rank_resources, rank_labels, rank_spot: what each rank asks of the scheduler.
absl::Status CheckRankAsks(const JobSpec& spec, const std::string& file) {
  auto bad = [&](const std::string& field, const std::string& expected, const std::string& got) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", field, ": expected ", expected, ", got ", got));
  };
  for (const auto& [field, text] : {std::pair{"elastic.rank_resources", &spec.rank_resources},
                                    std::pair{"elastic.rank_labels", &spec.rank_labels}}) {
    if (!KeyValueList(*text)) {
      return bad(field, "\"key=value,key=value\" (e.g. \"cpu=2,memory=8G\")",
                 absl::StrCat("\"", *text, "\""));
    }
  }
  if (spec.rank_spot != "prefer" && spec.rank_spot != "avoid" && spec.rank_spot != "none") {
    return bad("elastic.rank_spot", "\"prefer\", \"avoid\" or \"none\"",
               absl::StrCat("\"", spec.rank_spot, "\""));
  }
  return absl::OkStatus();
}

// The [chaos] faults: within the job, the job's own (not the head's), a mid-checkpoint kill on
// a step with a checkpoint.
absl::Status CheckFaults(const JobSpec& spec, const std::string& file) {
  auto bad = [&](const std::string& expected, const Fault& f) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": chaos.faults: expected ", expected, ", got '", f.ToString(), "'"));
  };
  for (const Fault& f : spec.faults) {
    if (f.step >= spec.steps)
      return bad(absl::StrCat("a step below job.steps (", spec.steps, ")"), f);
    if (f.kind == FaultKind::kCorruptUpdate &&
        (spec.lowcomm_groups == 0 ||
         ((f.step + 1) % spec.lowcomm.inner_steps != 0 && f.step + 1 != spec.steps))) {
      return bad(
          "a [lowcomm] job's step that ends a round (corrupt-update corrupts a group's "
          "pseudo-gradient in the sync at its end: S + 1 a multiple of inner_steps)",
          f);
    }
    if (IsHeadFault(f.kind)) {
      return bad("a fault of the job (the head's are `troupe chaos run --lab`'s to carry out)", f);
    }
    if (f.point == StepPoint::kCheckpoint &&
        (spec.checkpoint_every <= 0 || f.step % spec.checkpoint_every != 0 || f.step == 0)) {
      return bad(absl::StrCat("mid-checkpoint at a step with a checkpoint (a multiple of "
                              "checkpoint.every = ",
                              spec.checkpoint_every, ")"),
                 f);
    }
  }
  return absl::OkStatus();
}

// [optimizer] state = "replicated": deterministic data parallelism on the host only.
template <class Bad>
absl::Status CheckReplicatedOptimizer(const JobSpec& spec, const Device& device, const Bad& bad) {
  if (!spec.replicate_optimizer) return absl::OkStatus();
  const std::string why =
      " (the replicated optimizer state is deterministic data parallelism's, "
      "on the host)";
  if (spec.pipeline_stages > 1) {
    return bad("pipeline.stages", absl::StrCat("1 with optimizer.state = \"replicated\"", why),
               absl::StrCat(spec.pipeline_stages));
  }
  if (!spec.deterministic) {
    return bad("job.deterministic", absl::StrCat("true with optimizer.state = \"replicated\"", why),
               "false");
  }
  if (spec.lowcomm_groups > 0) {
    return bad("lowcomm.groups", "0 with optimizer.state = \"replicated\" (not combined yet)",
               absl::StrCat(spec.lowcomm_groups));
  }
  if (device.is_cuda()) {
    return bad("model.device", absl::StrCat("\"cpu\" with optimizer.state = \"replicated\"", why),
               absl::StrCat("\"", spec.model.device, "\""));
  }
  return absl::OkStatus();
}

// [lowcomm]: the groups' step is the deterministic data-parallel one, on the host; a round holds
// whole fragments, and a checkpoint falls on a round's end.
template <class Bad>
absl::Status CheckLowComm(const JobSpec& spec, const Device& device, const Bad& bad) {
  const LowCommOptions& o = spec.lowcomm;
  if (spec.lowcomm_groups == 0) return absl::OkStatus();
  const std::string on = absl::StrCat(" with [lowcomm] groups = ", spec.lowcomm_groups);
  if (spec.pipeline_stages > 1) {
    return bad("pipeline.stages", "1" + on, absl::StrCat(spec.pipeline_stages));
  }
  if (device.is_cuda()) {
    return bad("model.device",
               "\"cpu\"" + on + " (the low-communication mode runs on the host in this version)",
               absl::StrCat("\"", spec.model.device, "\""));
  }
  if (!spec.deterministic) return bad("job.deterministic", "true" + on, "false");
  if (o.inner_steps % o.fragments != 0) {
    return bad("lowcomm.fragments",
               absl::StrCat("a divisor of lowcomm.inner_steps (", o.inner_steps, ")"),
               absl::StrCat(o.fragments));
  }
  if (spec.eval_every % o.inner_steps != 0) {  // the groups meet on θ_global there
    return bad("eval.every",
               absl::StrCat("a multiple of lowcomm.inner_steps (", o.inner_steps,
                            "): an evaluation is taken where a round ends"),
               absl::StrCat(spec.eval_every));
  }
  if (spec.checkpoint_every % o.inner_steps != 0) {
    return bad("checkpoint.every",
               absl::StrCat("a multiple of lowcomm.inner_steps (", o.inner_steps,
                            "): a checkpoint is taken where a round ends"),
               absl::StrCat(spec.checkpoint_every));
  }
  return absl::OkStatus();
}

// Every worker computes at least one microbatch of a stage (under [lowcomm], of its group's): a
// larger world would idle ranks.
template <class Bad>
absl::Status CheckWorldFitsMicrobatches(const JobSpec& spec, const Bad& bad) {
  const bool lowcomm = spec.lowcomm_groups > 0;
  const int64_t most =
      int64_t{spec.model.microbatches} * (lowcomm ? spec.lowcomm_groups : spec.pipeline_stages);
  for (const auto& [field, count] : {std::pair{"elastic.min_workers", spec.min_workers},
                                     std::pair{"elastic.workers", spec.workers}}) {
    if (count <= most) continue;
    return bad(field,
               lowcomm ? absl::StrCat("at most model.microbatches × lowcomm.groups (",
                                      spec.model.microbatches, " × ", spec.lowcomm_groups,
                                      "): every worker computes at least one microbatch of its "
                                      "group's step")
                       : absl::StrCat("at most model.microbatches × pipeline.stages (",
                                      spec.model.microbatches, " × ", spec.pipeline_stages,
                                      "): every worker computes at least one microbatch of a "
                                      "stage"),
               absl::StrCat(count));
  }
  return absl::OkStatus();
}

absl::Status Validate(const JobSpec& spec, const std::string& file) {
  auto bad = [&](const std::string& field, const std::string& expected, const std::string& got) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", field, ": expected ", expected, ", got ", got));
  };
  if (spec.min_workers > spec.max_workers) {
    return bad("elastic.min_workers", absl::StrCat("at most max_workers (", spec.max_workers, ")"),
               absl::StrCat(spec.min_workers));
  }
  if (spec.workers < spec.min_workers || spec.workers > spec.max_workers) {
    return bad("elastic.workers",
               absl::StrCat("between min_workers and max_workers (", spec.min_workers, "..",
                            spec.max_workers, ")"),
               absl::StrCat(spec.workers));
  }
  TROUPE_RETURN_IF_ERROR(CheckWorldFitsMicrobatches(spec, bad));
  TROUPE_RETURN_IF_ERROR(CheckRankAsks(spec, file));
  absl::StatusOr<Device> device = ParseDevice(spec.model.device);
  if (!device.ok()) {
    return bad("model.device", "\"cpu\", \"cuda\" or \"cuda:N\"",
               absl::StrCat("\"", spec.model.device, "\""));
  }
  if (spec.model.precision != "fp32" && spec.model.precision != "bf16") {
    return bad("model.precision", "\"fp32\" or \"bf16\"",
               absl::StrCat("\"", spec.model.precision, "\""));
  }
  if (spec.model.precision == "bf16" && !device->is_cuda()) {
    return bad("model.precision", "\"fp32\" with model.device = \"cpu\" (bf16 is the GPU path's)",
               "\"bf16\"");
  }
  // The stage exchange (pipeline.cc) moves activations through the host communicator; the GPU
  // path has no ordered point-to-point of device buffers yet, so every generation's configure
  // would fail and the coordinator retry it: refused here instead.
  if (device->is_cuda() && spec.pipeline_stages > 1) {
    return bad("pipeline.stages",
               absl::StrCat("1 with model.device = \"", spec.model.device,
                            "\" (pipeline stages run on the CPU only; use data parallelism "
                            "on GPUs)"),
               absl::StrCat(spec.pipeline_stages));
  }
  TROUPE_RETURN_IF_ERROR(CheckLowComm(spec, *device, bad));
  TROUPE_RETURN_IF_ERROR(CheckReplicatedOptimizer(spec, *device, bad));
  // An evaluation is a forward pass of the whole model on one rank; a grid's rank holds one stage.
  if (spec.eval_every > 0 && spec.pipeline_stages > 1) {
    return bad("eval.every",
               absl::StrCat("0 with pipeline.stages = ", spec.pipeline_stages,
                            " (evaluation runs under data parallelism only)"),
               absl::StrCat(spec.eval_every));
  }
  if (spec.schedule.min_lr > spec.schedule.max_lr) {
    return bad("optimizer.min_lr", absl::StrCat("at most lr (", spec.schedule.max_lr, ")"),
               absl::StrCat(spec.schedule.min_lr));
  }
  const Timeouts& t = spec.timeouts;
  auto less = [&](const char* a, absl::Duration da, const char* b, absl::Duration db) {
    return da < db
               ? absl::OkStatus()
               : bad(absl::StrCat("timeouts.", a),
                     absl::StrCat("less than timeouts.", b, " (", absl::FormatDuration(db), ")"),
                     absl::FormatDuration(da));
  };
  for (absl::Status st :
       {less("liveness", t.liveness, "collective", t.collective),
        less("collective", t.collective, "watchdog", t.watchdog),
        less("bootstrap", t.bootstrap, "watchdog", t.watchdog),
        less("rpc", t.rpc, "watchdog", t.watchdog), less("retry", t.retry, "watchdog", t.watchdog),
        less("watchdog", t.watchdog, "driver_silence", t.driver_silence)}) {
    if (!st.ok()) return st;
  }
  return CheckFaults(spec, file);
}

// Every top-level key is a known section holding a table.
absl::Status CheckSections(const toml::table& root, const std::string& file) {
  static const std::set<std::string> kSections = {"job",      "model",      "optimizer", "elastic",
                                                  "pipeline", "checkpoint", "eval",      "lowcomm",
                                                  "chaos",    "timeouts"};
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (!kSections.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": [", key, "]: expected one of [",
                                                     absl::StrJoin(kSections, "], ["),
                                                     "], got an unknown section"));
    }
    if (!v.is_table()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key, ": expected a table, got ", TypeName(v.type())));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& toml_text, const std::string& file) {
  TROUPE_ASSIGN_OR_RETURN(toml::table parsed, ParseToml(toml_text, file));
  const toml::table& root = parsed;
  TROUPE_RETURN_IF_ERROR(CheckSections(root, file));
  JobSpec spec;
  absl::Status err;
  // [job] first: the model takes its seed, the schedule its total_steps by default.
  constexpr std::pair<const char*, void (*)(Section&, JobSpec&)> kReaders[] = {
      {"job", ReadJob},          {"model", ReadModel},       {"optimizer", ReadOptimizer},
      {"elastic", ReadElastic},  {"pipeline", ReadPipeline}, {"checkpoint", ReadCheckpoint},
      {"eval", ReadEval},        {"lowcomm", ReadLowComm},   {"chaos", ReadChaos},
      {"timeouts", ReadTimeouts}};
  for (const auto& [name, read] : kReaders) {
    Section s(root[name].as_table(), name, file, &err);
    read(s, spec);
    s.RejectUnknown();
  }
  if (!err.ok()) return err;
  TROUPE_RETURN_IF_ERROR(Validate(spec, file));
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "the job spec"));
  return ParseJobSpec(text, path);
}

std::string JobSpec::ToToml() const {
  std::vector<std::string> faults_q;
  for (const Fault& f : faults) faults_q.push_back(Quote(f.ToString()));
  std::string options;
  for (const auto& [k, v] : model.options)
    absl::StrAppend(&options, Quote(k), " = ", Quote(v), "\n");
  // Floats are written with enough digits to read back the same float.
  auto num = [](float x) { return absl::StrFormat("%.9g", x); };
  return absl::StrCat(
      "[job]\nname = ", Quote(name), "\nsteps = ", steps, "\nseed = ", seed,
      "\nwork_dir = ", Quote(work_dir), "\ndeterministic = ", deterministic ? "true" : "false",
      "\npriority = ", priority, "\n\n[model]\ntype = ", Quote(model.type),
      "\nsize = ", Quote(model.size), "\ndata_dir = ", Quote(model.data_dir),
      "\ndevice = ", Quote(model.device), "\nprecision = ", Quote(model.precision),
      "\nseq_len = ", model.seq_len, "\nmicrobatch_size = ", model.microbatch_size,
      "\nmicrobatches = ", model.microbatches, "\n\n[model.options]\n", options,
      "\n[optimizer]\nlr = ", num(schedule.max_lr), "\nmin_lr = ", num(schedule.min_lr),
      "\nwarmup_steps = ", schedule.warmup_steps, "\ntotal_steps = ", schedule.total_steps,
      "\nweight_decay = ", num(adamw.weight_decay), "\nmax_grad_norm = ", num(adamw.max_grad_norm),
      "\nbeta1 = ", num(adamw.beta1), "\nbeta2 = ", num(adamw.beta2),
      "\nstate = ", replicate_optimizer ? "\"replicated\"" : "\"sharded\"",
      "\n\n[elastic]\nworkers = ", workers, "\nmin_workers = ", min_workers,
      "\nmax_workers = ", max_workers, "\nranks_per_gpu = ", ranks_per_gpu,
      "\nbucket_kib = ", bucket_kib, "\nparam_delta = \"", ParamDeltaName(param_delta),
      "\"\nrank_resources = ", Quote(rank_resources), "\nrank_labels = ", Quote(rank_labels),
      "\nrank_spot = ", Quote(rank_spot), "\n\n[pipeline]\nstages = ", pipeline_stages,
      "\nschedule = ", Quote(PipelineScheduleName(pipeline_schedule)),
      "\n\n[checkpoint]\ndir = ", Quote(checkpoint_dir), "\nevery = ", checkpoint_every,
      "\nkeep_last = ", keep_last, "\n\n[eval]\nevery = ", eval_every,
      "\nshard = ", Quote(model.eval_shard), "\nmicrobatches = ", model.eval_microbatches,
      "\n\n[lowcomm]\ngroups = ", lowcomm_groups, "\ninner_steps = ", lowcomm.inner_steps,
      "\nouter_lr = ", num(lowcomm.outer_lr), "\nouter_momentum = ", num(lowcomm.outer_momentum),
      "\nfragments = ", lowcomm.fragments, "\ncompression = ", Quote(CompressionName(lowcomm)),
      "\nrobust = ", Quote(RobustOuterName(lowcomm.robust)),
      "\nrobust_factor = ", absl::StrFormat("%.17g", lowcomm.robust_factor),
      "\nverify_feedback = ", lowcomm.verify_feedback ? "true" : "false",
      "\nstale_outer = ", lowcomm.stale_outer ? "true" : "false", "\n\n[chaos]\nfaults = [",
      absl::StrJoin(faults_q, ", "), "]\nnetwork_fault = \"", absl::FormatDuration(network_fault),
      "\"\ndrop_percent = ", drop_percent, "\nstall = \"", absl::FormatDuration(stall),
      "\"\ndelay = \"", absl::FormatDuration(delay), "\"\njitter = \"",
      absl::FormatDuration(jitter), "\"\nflap_period = \"", absl::FormatDuration(flap_period),
      "\"\ndisk_delay = \"", absl::FormatDuration(disk_delay), "\"\nclock_step = \"",
      absl::FormatDuration(clock_step), "\"\n\n[timeouts]\nliveness = \"",
      absl::FormatDuration(timeouts.liveness), "\"\ncollective = \"",
      absl::FormatDuration(timeouts.collective), "\"\nbootstrap = \"",
      absl::FormatDuration(timeouts.bootstrap), "\"\nrpc = \"", absl::FormatDuration(timeouts.rpc),
      "\"\nretry = \"", absl::FormatDuration(timeouts.retry), "\"\njoin_wait = \"",
      absl::FormatDuration(timeouts.join_wait), "\"\nnotice_window = \"",
      absl::FormatDuration(timeouts.notice_window), "\"\nwatchdog = \"",
      absl::FormatDuration(timeouts.watchdog), "\"\ndriver_silence = \"",
      absl::FormatDuration(timeouts.driver_silence), "\"\ncluster_start = \"",
      absl::FormatDuration(timeouts.cluster_start), "\"\n");
}

}  // namespace troupe::train
