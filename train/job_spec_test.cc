#include "troupe/train/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace troupe::train {
namespace {

using ::testing::HasSubstr;

TEST(JobSpecTest, DefaultsAreTheTinyGptWithFourWorkers) {
  absl::StatusOr<JobSpec> s = ParseJobSpec("", "empty.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.type, "gpt");
  EXPECT_EQ(s->model.size, "tiny");
  EXPECT_EQ(s->workers, 4);
  EXPECT_EQ(s->schedule.total_steps, s->steps);
  EXPECT_EQ(s->CheckpointDir(), "troupe-job/ckpt");
}

TEST(JobSpecTest, PipelineStagesAndScheduleAreReadAndChecked) {
  absl::StatusOr<JobSpec> s =
      ParseJobSpec("[pipeline]\nstages = 4\nschedule = \"gpipe\"\n", "p.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->pipeline_stages, 4);
  EXPECT_EQ(s->pipeline_schedule, PipelineSchedule::kGPipe);
  absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pipeline_stages, 4);
  EXPECT_EQ(back->pipeline_schedule, PipelineSchedule::kGPipe);
  EXPECT_EQ(ParseJobSpec("", "d.toml")->pipeline_stages, 1);
  absl::Status bad = ParseJobSpec("[pipeline]\nschedule = \"zero-bubble\"\n", "p.toml").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("p.toml"), absl::string_view::npos) << bad;
  EXPECT_NE(bad.message().find("pipeline.schedule"), absl::string_view::npos) << bad;
  EXPECT_NE(bad.message().find("zero-bubble"), absl::string_view::npos) << bad;
  bad = ParseJobSpec("[pipeline]\nstages = 0\n", "p.toml").status();
  EXPECT_NE(bad.message().find("pipeline.stages"), absl::string_view::npos) << bad;
  // Two stages of M = 2: at most four workers can each compute something.
  bad = ParseJobSpec(
            "[model]\nmicrobatches = 2\n[elastic]\nworkers = 5\nmin_workers = 5\n"
            "[pipeline]\nstages = 2\n",
            "p.toml")
            .status();
  EXPECT_NE(bad.message().find("elastic.min_workers"), absl::string_view::npos) << bad;
}

TEST(JobSpecTest, RoundTripsThroughToml) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(R"(
[job]
name = "t"
steps = 12
seed = 9
deterministic = false
[model]
type = "mlp"
device = "cuda:1"
microbatches = 16
[model.options]
hidden = "32"
[optimizer]
lr = 0.001
warmup_steps = 3
[elastic]
workers = 3
min_workers = 2
max_workers = 5
[checkpoint]
every = 4
keep_last = 2
[chaos]
faults = ["kill-worker@5:2", "join-worker@7", "delay-node@3:1", "flap-node@4:2"]
delay = "20ms"
jitter = "0s"
flap_period = "400ms"
[timeouts]
liveness = "500ms"
watchdog = "90s"
)",
                                           "job.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.options.at("hidden"), "32");
  EXPECT_EQ(s->model.device, "cuda:1");
  ASSERT_EQ(s->faults.size(), 4u);
  EXPECT_EQ(s->faults[2].kind, FaultKind::kDelayNode);
  EXPECT_EQ(s->faults[3].ToString(), "flap-node@4:2");
  EXPECT_EQ(s->flap_period, absl::Milliseconds(400));
  EXPECT_EQ(s->delay, absl::Milliseconds(20));
  EXPECT_EQ(s->jitter, absl::ZeroDuration());
  EXPECT_EQ(s->faults[0].kind, FaultKind::kKillWorker);
  EXPECT_EQ(s->faults[1].ToString(), "join-worker@7");
  EXPECT_EQ(s->faults[0].step, 5);
  EXPECT_EQ(s->faults[0].arg, 2);
  absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "again.toml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << s->ToToml();
  EXPECT_EQ(back->ToToml(), s->ToToml());
  EXPECT_EQ(back->schedule.max_lr, s->schedule.max_lr);
  EXPECT_EQ(back->seed, 9u);
  EXPECT_FALSE(back->deterministic);
  EXPECT_EQ(back->timeouts.liveness, absl::Milliseconds(500));
  EXPECT_EQ(back->timeouts.watchdog, absl::Seconds(90));
  EXPECT_EQ(back->timeouts.collective, absl::Seconds(30)) << "the default";
  EXPECT_EQ(back->delay, absl::Milliseconds(20));
  EXPECT_EQ(back->jitter, absl::ZeroDuration());
  EXPECT_EQ(back->flap_period, absl::Milliseconds(400));
}

struct BadCase {
  const char* toml;
  const char* must_mention;
};

class JobSpecErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(JobSpecErrorTest, NamesTheFileFieldExpectedAndGot) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(GetParam().toml, "bad.toml");
  ASSERT_FALSE(s.ok()) << GetParam().toml;
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  const std::string msg(s.status().message());
  EXPECT_NE(msg.find("bad.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find(GetParam().must_mention), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, JobSpecErrorTest,
    ::testing::Values(
        BadCase{"[job]\nsteps = \"ten\"\n", "job.steps: expected an integer, got string"},
        BadCase{"[job]\nsteps = 0\n", "job.steps: expected an integer in [1,"},
        BadCase{"[job]\nstep = 3\n", "job.step: expected one of"},
        BadCase{"[jobs]\n", "[jobs]: expected one of"},
        BadCase{"[elastic]\nmin_workers = 5\nmax_workers = 2\n", "elastic.min_workers"},
        BadCase{"[elastic]\nworkers = 9\n", "elastic.workers: expected between"},
        BadCase{"[model]\nmicrobatches = 4\n[elastic]\nworkers = 6\n",
                "elastic.workers: expected at most model.microbatches × pipeline.stages (4 × 1)"},
        BadCase{"[model]\nmicrobatches = 2\n[elastic]\nworkers = 2\nmin_workers = 3\n"
                "max_workers = 3\n",
                "elastic.workers"},
        BadCase{"[optimizer]\nlr = true\n", "optimizer.lr: expected a number, got boolean"},
        BadCase{"[chaos]\nfaults = [\"explode@3\"]\n", "chaos.faults"},
        BadCase{"[chaos]\nfaults = [\"kill-worker@99\"]\n", "below job.steps"},
        BadCase{"[job\n", "bad.toml:"},
        BadCase{"[timeouts]\nliveness = 2\n", "timeouts.liveness: expected a duration string"},
        BadCase{"[timeouts]\nrpc = \"soon\"\n", "timeouts.rpc: expected a positive duration"},
        BadCase{"[timeouts]\nretry = \"-1s\"\n", "timeouts.retry: expected a positive"},
        BadCase{"[timeouts]\nliveness = \"40s\"\n",
                "timeouts.liveness: expected less than timeouts.collective (30s), got 40s"},
        BadCase{"[timeouts]\ncollective = \"3m\"\n",
                "timeouts.collective: expected less than timeouts.watchdog (2m), got 3m"},
        BadCase{"[timeouts]\nwatchdog = \"5m\"\n",
                "timeouts.watchdog: expected less than timeouts.driver_silence (3m), got 5m"},
        BadCase{"[chaos]\ndelay = \"0s\"\n", "chaos.delay: expected a positive duration"},
        BadCase{"[chaos]\njitter = \"-1ms\"\n", "chaos.jitter: expected a duration >= 0"},
        BadCase{"[chaos]\nflap_period = \"10ms\"\n",
                "chaos.flap_period: expected at least 50ms, got \"10ms\""},
        BadCase{"[chaos]\nfaults = [\"kill-head@3\"]\n",
                "chaos.faults: expected a fault of the job (the head's are `troupe chaos run "
                "--lab`'s to carry out), got 'kill-head@3'"},
        BadCase{"[chaos]\ndelay = \"2ms\"\njitter = \"3ms\"\n",
                "chaos.jitter: expected at most [chaos] delay (2ms), got \"3ms\""},
        BadCase{"model = 3\n", "model: expected a table, got integer"},
        BadCase{"[model]\ndevice = \"gpu\"\n",
                "model.device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"gpu\""},
        BadCase{"[model]\ndevice = \"cuda:x\"\n", "model.device: expected"},
        BadCase{"[model]\nprecision = \"fp16\"\n",
                "model.precision: expected \"fp32\" or \"bf16\", got \"fp16\""},
        BadCase{"[model]\nprecision = \"bf16\"\n",
                "model.precision: expected \"fp32\" with model.device = \"cpu\""},
        BadCase{"[elastic]\nranks_per_gpu = 0\n", "elastic.ranks_per_gpu: expected"},
        BadCase{"[elastic]\nbucket_kib = 2000000\n",
                "elastic.bucket_kib: expected an integer in [0, 1048576], got 2000000"},
        BadCase{"[elastic]\nparam_delta = \"zstd\"\n",
                "elastic.param_delta: expected \"auto\", \"on\" or \"off\", got \"zstd\""},
        BadCase{"[elastic]\nrank_resources = \"cpu\"\n",
                "elastic.rank_resources: expected \"key=value,key=value\" (e.g. "
                "\"cpu=2,memory=8G\"), got \"cpu\""},
        BadCase{"[elastic]\nrank_labels = \"=a\"\n", "elastic.rank_labels: expected"},
        BadCase{"[elastic]\nrank_spot = \"always\"\n",
                "elastic.rank_spot: expected \"prefer\", \"avoid\" or \"none\", got \"always\""},
        BadCase{"[eval]\nevery = -1\n", "eval.every: expected an integer in [0,"},
        BadCase{"[eval]\nevery = 2\nmicrobatches = 70000\n",
                "eval.microbatches: expected an integer in [0, 65536], got 70000"},
        BadCase{"[eval]\nevery = 2\n[pipeline]\nstages = 2\n",
                "eval.every: expected 0 with pipeline.stages = 2 (evaluation runs under data "
                "parallelism only), got 2"},
        BadCase{"[eval]\nshard = 3\n", "eval.shard: expected a string, got integer"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 10\nfragments = 3\n[checkpoint]\n"
                "every = 0\n",
                "lowcomm.fragments: expected a divisor of lowcomm.inner_steps (10), got 3"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 4\n[checkpoint]\nevery = 10\n",
                "checkpoint.every: expected a multiple of lowcomm.inner_steps (4): a checkpoint "
                "is taken where a round ends, got 10"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 5\n[pipeline]\nstages = 2\n",
                "pipeline.stages: expected 1 with [lowcomm] groups = 2, got 2"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 5\n[job]\ndeterministic = false\n",
                "job.deterministic: expected true with [lowcomm] groups = 2, got false"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 5\n[model]\ndevice = \"cuda\"\n",
                "model.device: expected \"cpu\" with [lowcomm] groups = 2"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 4\n[checkpoint]\nevery = 8\n[chaos]\n"
                "faults = [\"corrupt-update@5:1\"]\n",
                "chaos.faults: expected a [lowcomm] job's step that ends a round"},
        BadCase{"[chaos]\nfaults = [\"corrupt-update@3:1\"]\n",
                "chaos.faults: expected a [lowcomm] job's step that ends a round"},
        BadCase{"[lowcomm]\ngroups = 2\ninner_steps = 4\n[checkpoint]\nevery = 8\n[eval]\n"
                "every = 6\n",
                "eval.every: expected a multiple of lowcomm.inner_steps (4)"},
        BadCase{"[lowcomm]\ncompression = \"fp4\"\n",
                "lowcomm.compression: expected \"none\", \"int8\" or \"topk:<fraction>\""},
        BadCase{"[lowcomm]\nrobust = \"median\"\n",
                "lowcomm.robust: expected \"none\", \"clip\" or \"reject\", got \"median\""},
        BadCase{"[job]\npriority = 5000\n",
                "job.priority: expected an integer in [-1000, 1000], got 5000"},
        // The GPU path has no pipeline stages: refused here, not at every generation's configure.
        BadCase{"[model]\ndevice = \"cuda\"\n[pipeline]\nstages = 2\n",
                "pipeline.stages: expected 1 with model.device = \"cuda\" (pipeline stages run "
                "on the CPU only; use data parallelism on GPUs), got 2"}));

// [eval]: off by default (nothing opened); on, the held-out microbatches default to a step's.
TEST(JobSpecTest, EvalIsReadDefaultedAndRoundTrips) {
  absl::StatusOr<JobSpec> off = ParseJobSpec("", "job.toml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->eval_every, 0);
  EXPECT_EQ(off->model.eval_microbatches, 0) << "off: the model opens no held-out data";
  absl::StatusOr<JobSpec> on =
      ParseJobSpec("[model]\nmicrobatches = 16\n[eval]\nevery = 5\n", "job.toml");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->eval_every, 5);
  EXPECT_EQ(on->model.eval_microbatches, 16);
  EXPECT_EQ(on->model.eval_shard, "");
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[eval]\nevery = 3\nshard = \"held/val-00003.tok\"\nmicrobatches = 2\n", "job.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.eval_shard, "held/val-00003.tok");
  EXPECT_EQ(s->model.eval_microbatches, 2);
  for (const JobSpec& spec : {*off, *on, *s}) {
    absl::StatusOr<JobSpec> back = ParseJobSpec(spec.ToToml(), "again.toml");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << spec.ToToml();
    EXPECT_EQ(back->ToToml(), spec.ToToml());
    EXPECT_EQ(back->eval_every, spec.eval_every);
    EXPECT_EQ(back->model.eval_microbatches, spec.model.eval_microbatches);
  }
}

// [lowcomm]: off by default; on, its options are read and round-trip.
TEST(JobSpecTest, LowCommIsReadAndRoundTrips) {
  absl::StatusOr<JobSpec> off = ParseJobSpec("", "job.toml");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->lowcomm_groups, 0);
  absl::StatusOr<JobSpec> on = ParseJobSpec(
      "[lowcomm]\ngroups = 2\ninner_steps = 10\nouter_lr = 0.5\nfragments = 5\n"
      "compression = \"topk:0.02\"\nrobust = \"reject\"\nrobust_factor = 4\nstale_outer = true\n"
      "[checkpoint]\nevery = 20\n",
      "job.toml");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->lowcomm_groups, 2);
  EXPECT_EQ(on->lowcomm.inner_steps, 10);
  EXPECT_EQ(on->lowcomm.outer_lr, 0.5f);
  EXPECT_EQ(on->lowcomm.outer_momentum, 0.9f) << "the paper's default";
  EXPECT_EQ(on->lowcomm.fragments, 5);
  EXPECT_EQ(on->lowcomm.compression, collectives::Compression::kTopK);
  EXPECT_EQ(on->lowcomm.topk_fraction, 0.02);
  EXPECT_EQ(on->lowcomm.robust, RobustOuter::kReject);
  EXPECT_EQ(on->lowcomm.robust_factor, 4.0);
  EXPECT_TRUE(on->lowcomm.stale_outer);
  EXPECT_FALSE(off->lowcomm.stale_outer);
  for (const JobSpec& spec : {*off, *on}) {
    absl::StatusOr<JobSpec> back = ParseJobSpec(spec.ToToml(), "again.toml");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << spec.ToToml();
    EXPECT_EQ(back->ToToml(), spec.ToToml());
  }
}

TEST(JobSpecTest, PrecisionAndRanksPerGpuAreReadAndRoundTrip) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[model]\ndevice = \"cuda\"\nprecision = \"bf16\"\n[elastic]\nranks_per_gpu = 4\n", "g.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.precision, "bf16");
  EXPECT_EQ(s->ranks_per_gpu, 4);
  absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model.precision, "bf16");
  EXPECT_EQ(back->ranks_per_gpu, 4);
  absl::StatusOr<JobSpec> d = ParseJobSpec("", "d.toml");
  EXPECT_EQ(d->model.precision, "fp32");
  EXPECT_EQ(d->ranks_per_gpu, 1);
}

TEST(JobSpecTest, BucketSizeIsReadAndRoundTrips) {
  absl::StatusOr<JobSpec> s = ParseJobSpec("[elastic]\nbucket_kib = 64\n", "b.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bucket_kib, 64);
  absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->bucket_kib, 64);
  EXPECT_EQ(ParseJobSpec("", "d.toml")->bucket_kib, 0);  // chosen by the link
}

TEST(JobSpecTest, TheParameterDeltaIsReadAndRoundTrips) {
  for (auto [text, want] : {std::pair{"on", ParamDelta::kOn}, std::pair{"off", ParamDelta::kOff},
                            std::pair{"auto", ParamDelta::kAuto}}) {
    absl::StatusOr<JobSpec> s =
        ParseJobSpec(absl::StrCat("[elastic]\nparam_delta = \"", text, "\"\n"), "p.toml");
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->param_delta, want) << text;
    absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "back.toml");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->param_delta, want) << text;
  }
  EXPECT_EQ(ParseJobSpec("", "d.toml")->param_delta, ParamDelta::kAuto);
}

TEST(JobSpecTest, TheOptimizerStateIsReadRoundTripsAndIsRefusedWhereItCannotRun) {
  absl::StatusOr<JobSpec> s = ParseJobSpec("[optimizer]\nstate = \"replicated\"\n", "o.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->replicate_optimizer);
  absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->replicate_optimizer);
  EXPECT_FALSE(ParseJobSpec("", "d.toml")->replicate_optimizer);  // sharded
  EXPECT_FALSE(ParseJobSpec(ParseJobSpec("", "d.toml")->ToToml(), "d2.toml")->replicate_optimizer);
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"[optimizer]\nstate = \"zero\"\n",
            "o.toml: optimizer.state: expected \"sharded\" or \"replicated\", got \"zero\""},
           {"[optimizer]\nstate = \"replicated\"\n[job]\ndeterministic = false\n",
            "o.toml: job.deterministic: expected true with optimizer.state = \"replicated\""},
           {"[optimizer]\nstate = \"replicated\"\n[pipeline]\nstages = 2\n",
            "o.toml: pipeline.stages: expected 1 with optimizer.state = \"replicated\""},
           {"[optimizer]\nstate = \"replicated\"\n[model]\ndevice = \"cuda\"\n",
            "o.toml: model.device: expected \"cpu\" with optimizer.state = \"replicated\""},
       }) {
    absl::StatusOr<JobSpec> bad = ParseJobSpec(text, "o.toml");
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
    EXPECT_NE(bad.status().message().find(want), std::string::npos) << bad.status();
  }
}

TEST(JobSpecTest, PriorityAndWhatEachRankAsksAreReadAndRoundTrip) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[job]\npriority = 10\n[elastic]\nrank_resources = \"cpu=2,memory=8G\"\n"
      "rank_labels = \"zone=a\"\nrank_spot = \"avoid\"\n",
      "r.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<JobSpec> back = ParseJobSpec(s->ToToml(), "back.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->priority, 10);
  EXPECT_EQ(back->rank_resources, "cpu=2,memory=8G");
  EXPECT_EQ(back->rank_labels, "zone=a");
  EXPECT_EQ(back->rank_spot, "avoid");
  absl::StatusOr<JobSpec> d = ParseJobSpec("", "d.toml");
  EXPECT_EQ(d->priority, 0);
  EXPECT_EQ(d->rank_resources, "");  // cpu=1 (+ gpu=1 on CUDA)
  EXPECT_EQ(d->rank_spot, "prefer");
}

TEST(FaultTest, APointInsideTheStepIsReadAndRoundTrips) {
  absl::StatusOr<Fault> gather = ParseFault("kill-worker@5:2:mid-gather");
  ASSERT_TRUE(gather.ok()) << gather.status();
  EXPECT_EQ(gather->step, 5);
  EXPECT_EQ(gather->arg, 2);
  EXPECT_EQ(gather->point, StepPoint::kGather);
  EXPECT_EQ(gather->ToString(), "kill-worker@5:2:mid-gather");
  absl::StatusOr<Fault> exchange = ParseFault("stop-worker@3:mid-exchange");
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  EXPECT_EQ(exchange->arg, -1);
  EXPECT_EQ(exchange->point, StepPoint::kExchange);
  EXPECT_EQ(exchange->ToString(), "stop-worker@3");  // the default point
  EXPECT_EQ(ParseFault("kill-shard-and-buddy@4:1:mid-gather")->point, StepPoint::kGather);
  EXPECT_THAT(std::string(ParseFault("kill-worker@5:1:mid-backward").status().message()),
              HasSubstr("expected the point mid-exchange, mid-gather or mid-checkpoint, got "
                        "'mid-backward'"));
  EXPECT_THAT(std::string(ParseFault("join-worker@5:mid-gather").status().message()),
              HasSubstr("expected only with kill-worker, stop-worker or kill-shard-and-buddy"));
  EXPECT_FALSE(ParseFault("kill-worker@5:1:mid-gather:2").ok());
  // A hang is inside a collective: not in the middle of writing a checkpoint.
  EXPECT_EQ(ParseFault("hang-worker@5:1:mid-gather")->point, StepPoint::kGather);
  EXPECT_FALSE(ParseFault("hang-worker@5:1:mid-checkpoint").ok());
  EXPECT_EQ(ParseFault("kill-worker@10:1:mid-checkpoint")->ToString(),
            "kill-worker@10:1:mid-checkpoint");
}

// mid-checkpoint needs a checkpoint at its step; the disk faults' :N is a count of steps.
TEST(FaultTest, MidCheckpointFallsOnACheckpointStep) {
  const std::string base = "[job]\nsteps = 30\n[checkpoint]\nevery = 10\n";
  absl::StatusOr<JobSpec> ok = ParseJobSpec(
      base +
          "[chaos]\nfaults = [\"kill-worker@20:1:mid-checkpoint\", \"disk-full@8:3\"]\n"
          "disk_delay = \"20ms\"\n",
      "job.toml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->faults[1].kind, FaultKind::kDiskFull);
  EXPECT_EQ(ok->faults[1].arg, 3);
  EXPECT_EQ(ok->disk_delay, absl::Milliseconds(20));
  absl::StatusOr<JobSpec> again = ParseJobSpec(ok->ToToml(), "again.toml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->disk_delay, absl::Milliseconds(20));
  absl::StatusOr<JobSpec> bad =
      ParseJobSpec(base + "[chaos]\nfaults = [\"kill-worker@15:1:mid-checkpoint\"]\n", "job.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("mid-checkpoint at a step with a checkpoint (a multiple of "
                        "checkpoint.every = 10), got 'kill-worker@15:1:mid-checkpoint'"));
}

TEST(FaultTest, Parses) {
  EXPECT_EQ(ParseFault("kill-worker@10")->step, 10);
  EXPECT_EQ(ParseFault("kill-worker@10")->arg, -1);
  EXPECT_EQ(ParseFault("sigterm-node@3:1")->arg, 1);
  EXPECT_FALSE(ParseFault("kill-worker").ok());
  EXPECT_FALSE(ParseFault("kill-worker@x").ok());
  EXPECT_FALSE(ParseFault("kill-worker@1:-2").ok());
}

}  // namespace
}  // namespace troupe::train
