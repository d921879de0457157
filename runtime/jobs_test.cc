#include "internal/jobs.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace troupe::runtime::internal {
namespace {

std::string Line(const std::string& event, int64_t step, std::map<std::string, std::string> f,
                 uint64_t gen = 1, const std::string& child = "", double t = 1000) {
  base::SupervisionEvent e;
  e.wall_time = absl::ToChronoTime(absl::FromUnixSeconds(0) + absl::Seconds(t));
  e.supervisor = "coordinator";
  e.child = child;
  e.generation = gen;
  e.event = event;
  e.fields = std::move(f);
  e.fields["step"] = absl::StrCat(step);
  return base::FormatEvent(e);
}

TEST(JobTableTest, ASubmittedJobIsPendingUntilItsDriverRegistersAndEndsOnce) {
  JobTable t;
  const std::string id = t.Submit("tiny", "[job]\n", 30, 100);
  EXPECT_EQ(id, "job-1");
  EXPECT_EQ(t.Unplaced(), std::vector<std::string>{id});
  t.Placed(id, "od");
  EXPECT_TRUE(t.Unplaced().empty());
  EXPECT_EQ(t.Find(id)->state, JobState::kPending);
  ASSERT_EQ(*t.Register(id, "tiny", "[job]\n", 30, 42, "", 101), id);
  EXPECT_EQ(t.Find(id)->state, JobState::kRunning);
  EXPECT_EQ(t.Find(id)->node, "od");  // kept: the driver did not say
  // One the head does not know (its predecessor had no store) is taken as the driver says.
  EXPECT_EQ(*t.Register("job-9", "x", "", 1, 1, "", 1), "job-9");
  t.End(id, JobState::kSucceeded, "", R"({"steps_lost": 2, "crc32c": "0a0b0c0d"})", 130);
  t.End(id, JobState::kFailed, "late", "", 131);  // the first end stands
  const Job& j = *t.Find(id);
  EXPECT_EQ(j.state, JobState::kSucceeded);
  EXPECT_EQ(j.steps_lost, 2);
  EXPECT_EQ(j.report["crc32c"], "0a0b0c0d");
  EXPECT_EQ(t.Register(id, "tiny", "", 30, 43, "", 132).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A driver of its own gets the next id.
  EXPECT_EQ(*t.Register("", "mine", "", 5, 7, "", 140), "job-10");
}

TEST(JobTableTest, TheEventLogBecomesSeriesEventsRanksAndMetrics) {
  JobTable t;
  const std::string id = *t.Register("", "tiny", "", 10, 1, "", 0);
  t.Ingest(
      id,
      {Line("step", 1,
            {{"loss", "5.5"}, {"tokens_per_s", "100.0"}, {"step_s", "0.02"}, {"world", "2"}}),
       Line("rank_step", 1,
            {{"rank", "0"},
             {"start_ns", "999000000000"},
             {"step_s", "0.01"},
             {"compute_s", "0.006"},
             {"collective_s", "0.003"},
             {"collective_bytes", "4096"}},
            1, "n0/w0"),
       Line("rank_step", 2, {{"collective_bytes", "100"}}, 1, "n0/w0"),
       Line("fault_fired", 1, {{"kind", "kill-worker"}}),
       Line("generation", 1, {{"world", "1"}, {"steps_lost", "1"}}, 2),
       Line("recovered", 2, {{"seconds", "0.25"}, {"fault", "kill-worker"}}, 2),
       Line("checkpoint_committed", 2, {{"bytes", "800"}, {"seconds", "0.004"}}, 2),
       "not an event line",
       Line("step", 2,
            {{"loss", "5.0"}, {"tokens_per_s", "90.0"}, {"step_s", "0.5"}, {"world", "1"}}, 2)});
  const Job& j = *t.Find(id);
  EXPECT_EQ(j.step, 2);
  EXPECT_EQ(j.world, 1);
  EXPECT_EQ(j.generation, 2);
  EXPECT_EQ(j.steps_lost, 1);
  EXPECT_EQ(j.recoveries, 1u);
  EXPECT_EQ(j.collective_bytes, 4196u);
  const nlohmann::json full = JobTable::Full(j);
  ASSERT_EQ(full["series"].size(), 2u);
  EXPECT_DOUBLE_EQ(full["series"][0]["t"].get<double>(), 1000.0);
  ASSERT_EQ(full["ranks"].size(), 2u);
  EXPECT_TRUE(full["ranks"][0]["committed"].get<bool>());   // step 1 committed in gen 1
  EXPECT_FALSE(full["ranks"][1]["committed"].get<bool>());  // step 2 committed in gen 2 only
  EXPECT_DOUBLE_EQ(full["ranks"][0]["start"].get<double>(), 999.0);
  ASSERT_EQ(full["events"].size(), 4u);  // fault, generation, recovered, checkpoint
  EXPECT_EQ(full["events"][0]["event"], "fault_fired");
  EXPECT_EQ(full["events"][0]["step"], 1);
  EXPECT_EQ(full["events"][2]["kind"], "kill-worker");
  EXPECT_EQ(full["checkpoints"][0]["bytes"], 800);

  const std::string m = t.Metrics();
  for (const char* want : {
           "troupe_jobs{state=\"running\"} 1\n",
           "troupe_job_step{job_id=\"job-1\"} 2\n",
           "troupe_job_recoveries_total{job_id=\"job-1\"} 1\n",
           "troupe_collective_bytes_total{job_id=\"job-1\"} 4196\n",
           "troupe_step_seconds_bucket{job_id=\"job-1\",le=\"0.025\"} 1\n",
           "troupe_step_seconds_bucket{job_id=\"job-1\",le=\"+Inf\"} 2\n",
           "troupe_step_seconds_count{job_id=\"job-1\"} 2\n",
           "troupe_recovery_seconds_sum{job_id=\"job-1\"} 0.25\n",
           "# TYPE troupe_checkpoint_write_seconds histogram\n",
       }) {
    EXPECT_TRUE(absl::StrContains(m, want)) << want << " not in\n" << m;
  }
}

// [eval]: a job's evaluations become its val_series and its newest validation loss, in the
// summary, the record and /metrics — where only jobs that evaluate have a sample.
TEST(JobTableTest, EvaluationsBecomeTheValidationSeriesAndAMetricOfTheirOwn) {
  JobTable t;
  const std::string id = *t.Register("", "tiny", "", 10, 1, "", 0);
  const std::string quiet = *t.Register("", "other", "", 10, 2, "", 0);
  t.Ingest(id, {Line("eval", 5, {{"val_loss", "5.25"}, {"eval_s", "0.1"}}),
                Line("step", 6, {{"loss", "5.0"}, {"step_s", "0.5"}, {"world", "2"}}),
                Line("eval", 10, {{"val_loss", "4.5"}, {"eval_s", "0.1"}}, 1, "", 1001)});
  const Job& j = *t.Find(id);
  EXPECT_EQ(j.val_step, 10);
  EXPECT_EQ(j.val_loss, 4.5);
  const nlohmann::json full = JobTable::Full(j);
  ASSERT_EQ(full["val_series"].size(), 2u) << full.dump();
  EXPECT_EQ(full["val_series"][0]["step"], 5);
  EXPECT_EQ(full["val_series"][1]["val_loss"], 4.5);
  EXPECT_EQ(full["series"].size(), 1u) << "the training series keeps its own points";
  EXPECT_EQ(full["val_loss"], 4.5);
  EXPECT_TRUE(JobTable::Summary(*t.Find(quiet))["val_loss"].is_null());
  EXPECT_EQ(full["events"].back()["text"], "eval eval_s=0.1 step=10 val_loss=4.5");
  const std::string m = t.Metrics();
  EXPECT_TRUE(absl::StrContains(m, "# TYPE troupe_job_val_loss gauge\n")) << m;
  EXPECT_TRUE(absl::StrContains(m, "troupe_job_val_loss{job_id=\"" + id + "\"} 4.5\n")) << m;
  EXPECT_FALSE(absl::StrContains(m, "troupe_job_val_loss{job_id=\"" + quiet + "\"}")) << m;
  JobTable again;
  ASSERT_TRUE(again.Restore(id, JobTable::Record(j)).ok());
  EXPECT_EQ(again.Find(id)->val_step, 10);
  EXPECT_EQ(again.Find(id)->val_loss, 4.5);
}

TEST(JobTableTest, ARecordRestoresTheJobAndTheNextIdGoesOn) {
  JobTable t;
  const std::string id = t.Submit("tiny", "[job]\nsteps = 3\n", 3, 10);
  t.End(id, JobState::kStopped, "stopped by hand", "", 20);
  JobTable again;
  ASSERT_TRUE(again.Restore(id, JobTable::Record(*t.Find(id))).ok());
  const Job& j = *again.Find(id);
  EXPECT_EQ(j.state, JobState::kStopped);
  EXPECT_EQ(j.error, "stopped by hand");
  EXPECT_EQ(j.spec_toml, "[job]\nsteps = 3\n");
  EXPECT_EQ(again.Submit("next", "", 1, 30), "job-2");
  absl::Status bad = again.Restore("job-7", "{not json");
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(bad.message(), "job-7")) << bad;
}

}  // namespace
}  // namespace troupe::runtime::internal
