// [lowcomm] end to end: `troupe train` as real processes, the embedded cluster's worker nodes in
// zones g0, g1, ... (one group each), faults real kills, spot notices and joins. The bits are
// checked against DiLoCo written out here from the model and its optimizer alone (model::Trainer
// per group, on the group's data stream; the outer Nesterov step by its formula), driven by the
// membership history the job's event log records.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "job_harness.h"
#include "troupe/model/crc32c.h"
#include "troupe/model/data_source.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/trainer.h"
#include "troupe/train/diloco_reference.h"
#include "troupe/train/job_spec.h"

namespace {

namespace fs = std::filesystem;
using troupe::base::SupervisionEvent;
using troupe::testing::FindEvents;
using troupe::testing::JobRun;
using troupe::testing::Slurp;

constexpr int kRound = 4;  // inner steps
using Groups = std::vector<std::string>;

class LowCommTest : public troupe::testing::JobTest {
 protected:
  LowCommTest() {
    steps_ = 12;
    max_workers_ = 7;
    spec_extra_ = "[lowcomm]\ngroups = 2\ninner_steps = 4\n";
  }
  void SetUp() override {
    JobTest::SetUp();
    // A checkpoint where a round ends ([checkpoint] every 5 is the harness's).
    std::string spec = Slurp(spec_);
    spec.replace(spec.find("every = 5"), 9, "every = 4");
    std::ofstream(spec_) << spec;
  }
  void SetGroups(int n) {
    std::string spec = Slurp(spec_);
    const size_t at = spec.find("groups = ");
    spec.replace(at, spec.find('\n', at) - at, "groups = " + std::to_string(n));
    std::ofstream(spec_) << spec;
  }

  // The groups (zones, "zone:g<i>") that trained each step of run `name`, from its generation
  // events: worker n<i>/w0 of W initial workers is in zone g<i·G/W> (the embedded cluster's rule).
  std::vector<Groups> History(const std::string& name, int groups, int workers) {
    std::vector<Groups> at(steps_);
    for (const SupervisionEvent& e : FindEvents(Events(name), "generation")) {
      std::set<std::string> zones;
      for (const std::string& w :
           std::vector<std::string>(absl::StrSplit(e.Field("workers"), ' ', absl::SkipEmpty()))) {
        const int i = std::stoi(w.substr(1, w.find('/') - 1));
        zones.insert("zone:g" + std::to_string(i * groups / workers));
      }
      for (int s = std::stoi(e.Field("step")); s < steps_; ++s) {
        at[s] = Groups(zones.begin(), zones.end());
      }
    }
    return at;
  }

  // DiLoCo in one process over the job's spec and data: the CRC32C of θ_global after the job's
  // steps, the groups of each step as given.
  // `left_out`: by the step a round ends, groups whose Δ that round does not apply.
  // `restored_at`: the step a checkpoint (the first group's state, θ_global and the outer
  // momentum) restores: every group goes on from the first group's model and optimizer state.
  // `stale` (stale_outer): a group's Δ is the change since its round began; a round's mean is
  // applied where the next one ends (over the groups there then), and a group goes on from
  // θ_global − its newest Δ; after the last step the newest are applied too.
  std::string Reference(const std::vector<Groups>& groups_at,
                        const std::map<int, std::set<std::string>>& left_out = {},
                        int restored_at = -1, bool stale = false) {
    absl::StatusOr<troupe::train::JobSpec> spec = troupe::train::LoadJobSpec(spec_);
    EXPECT_TRUE(spec.ok()) << spec.status();
    std::vector<std::string> shards;
    for (const auto& e : fs::directory_iterator(data_)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("train-", 0) == 0 && e.path().extension() == ".tok") {
        shards.push_back(e.path().string());
      }
    }
    std::sort(shards.begin(), shards.end());
    const int32_t vocab = (*troupe::model::TokenShard::Open(shards[0], 0))->vocab_size();
    const troupe::train::ModelSpec& m = spec->model;
    std::map<std::string, std::unique_ptr<troupe::model::DataSource>> data;
    std::map<std::string, std::unique_ptr<troupe::model::Trainer>> trainers;
    troupe::train::DiLoCoReference ref(spec->lowcomm.outer_lr, spec->lowcomm.outer_momentum, stale);
    for (int s = 0; s < steps_; ++s) {
      const Groups& groups = groups_at[s];
      for (size_t g = 0; g < groups.size(); ++g) {
        if (!data.count(groups[g])) {
          auto d = troupe::model::DataSource::Open(shards, vocab,
                                                   {.seq_len = m.seq_len,
                                                    .microbatch_size = m.microbatch_size,
                                                    .microbatches_per_step = m.microbatches,
                                                    .seed = m.seed});
          data[groups[g]] = std::make_unique<troupe::model::DataSource>(*std::move(d));
          auto t = troupe::model::Trainer::Create({.config = troupe::model::GptConfig::Tiny(vocab),
                                                   .adamw = spec->adamw,
                                                   .schedule = spec->schedule,
                                                   .init_seed = spec->seed},
                                                  data[groups[g]].get());
          EXPECT_TRUE(t.ok()) << t.status();
          trainers[groups[g]] = std::make_unique<troupe::model::Trainer>(*std::move(t));
          ref.Start(groups[g], trainers[groups[g]]->model().params(),
                    trainers[groups[g]]->model().num_params());
        }
        EXPECT_TRUE(data[groups[g]]->SetStream(g, groups.size()).ok());
      }
      if (s == restored_at) {
        const std::string saved = base_ + "/reference-restored.state";
        EXPECT_TRUE(trainers[groups_at[s - 1][0]]->Save(saved).ok());
        for (const std::string& g : groups) EXPECT_TRUE(trainers[g]->Restore(saved).ok());
      }
      for (const std::string& g : groups) EXPECT_TRUE(trainers[g]->Step().ok());
      if ((s + 1) % kRound != 0 && s + 1 != steps_) continue;
      std::vector<std::pair<std::string, float*>> at;
      for (const std::string& g : groups) at.emplace_back(g, trainers[g]->model().params());
      ref.RoundEnd(at, s + 1 == steps_, [&](const std::string& g) {
        return !left_out.count(s + 1) || !left_out.at(s + 1).count(g);
      });
    }
    const std::vector<float>& global = ref.global();
    return absl::StrFormat("%08x", troupe::model::Crc32c(global.data(), global.size() * 4));
  }

  // The outer rounds of run `name`: step -> the groups applied.
  std::map<std::string, std::string> Rounds(const std::string& name) {
    std::map<std::string, std::string> out;
    for (const SupervisionEvent& e : FindEvents(Events(name), "outer_round")) {
      out[e.Field("step")] = e.Field("applied");
    }
    return out;
  }
};

TEST_F(LowCommTest, TwoGroupsEndOnTheBitsOfDiLoCoWrittenOutFromTheModelAndOptimizer) {
  JobRun r = Train("two", {"--workers", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps, steps_);
  const std::map<std::string, std::string> want = {
      {"4", "zone:g0,zone:g1"}, {"8", "zone:g0,zone:g1"}, {"12", "zone:g0,zone:g1"}};
  EXPECT_EQ(Rounds("two"), want) << EventLogText("two");
  EXPECT_EQ(r.report.crc, Reference(History("two", 2, 4))) << r.output;
  microbatches_ = 2 * troupe::testing::kMicrobatches;  // group g's k is the step's g·M + k
  ExpectExactlyOnce("two", -1, 0);
}

TEST_F(LowCommTest, ARankKilledInsideAGroupLosesNoStepAndEndsOnTheSameBits) {
  JobRun r = Train("kill", {"--workers", "4", "--chaos", "kill-worker@6:1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0);
  EXPECT_EQ(r.report.world, 3);
  EXPECT_TRUE(HasEvent("kill", "generation", {{"step", "6"}, {"source", "mirrors"}}))
      << EventLogText("kill");
  EXPECT_EQ(Rounds("kill").at("8"), "zone:g0,zone:g1") << EventLogText("kill");
  EXPECT_EQ(r.report.crc, Reference(History("kill", 2, 4))) << r.output;
}

// stale_outer: each round's exchange runs while the next round trains, and a rank killed with a
// round in flight costs nothing: the survivors' new generation exchanges it again. The bits are
// DiLoCo's one round late, written out here, and not the synchronous variant's.
TEST_F(LowCommTest, TheOverlappingVariantEndsOnOneRoundLateDiLoCoThroughARankKill) {
  std::string spec = Slurp(spec_);
  const size_t at = spec.find("[lowcomm]\n");
  std::ofstream(spec_) << spec.substr(0, at + 10) << "stale_outer = true\n" << spec.substr(at + 10);
  JobRun r = Train("stale", {"--workers", "4", "--chaos", "kill-worker@6:1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0);
  EXPECT_TRUE(HasEvent("stale", "generation", {{"step", "6"}, {"source", "mirrors"}}))
      << EventLogText("stale");
  const std::map<std::string, std::string> want = {
      {"4", ""}, {"8", "zone:g0,zone:g1"}, {"12", "zone:g0,zone:g1"}};
  EXPECT_EQ(Rounds("stale"), want) << EventLogText("stale");
  const std::vector<Groups> history = History("stale", 2, 4);
  EXPECT_EQ(r.report.crc, Reference(history, {}, -1, true)) << r.output;
  EXPECT_NE(r.report.crc, Reference(history)) << "the synchronous variant's bits";
}

// Group g1 (workers n2, n3 of 6 in three zones) is killed whole in the middle of the round of
// steps 4-8: the round completes with g0 and g2, and DiLoCo replayed with that membership
// history (from the log) gives the job's bits.
TEST_F(LowCommTest, AGroupKilledWholeMidRoundLeavesTheRoundToTheOthers) {
  SetGroups(3);
  JobRun r = Train("group",
                   {"--workers", "6", "--chaos", "kill-worker@6:2", "--chaos", "kill-worker@6:3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0);
  const std::map<std::string, std::string> rounds = Rounds("group");
  EXPECT_EQ(rounds.at("4"), "zone:g0,zone:g1,zone:g2") << EventLogText("group");
  EXPECT_EQ(rounds.at("8"), "zone:g0,zone:g2") << EventLogText("group");
  const std::vector<Groups> history = History("group", 3, 6);
  EXPECT_EQ(history[7], (Groups{"zone:g0", "zone:g2"}));
  EXPECT_EQ(r.report.crc, Reference(history)) << r.output;
}

// Both nodes of g2 get their cloud's spot notice before step 8, where a round ends: they drain at
// a step boundary soon after (the notice is polled for), and the others go on without them,
// nothing lost; replayed with the logged membership, the bits are the job's.
TEST_F(LowCommTest, AGroupNoticedAtARoundEndLeavesAndTheOthersGoOn) {
  SetGroups(3);
  std::string spec = Slurp(spec_);
  spec.replace(spec.find("steps = 12"), 10, "steps = 40");
  std::ofstream(spec_) << spec;
  steps_ = 40;
  JobRun r =
      Train("spot", {"--workers", "6", "--chaos", "spot-notice@8:4", "--chaos", "spot-notice@8:5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0);
  EXPECT_EQ(r.report.world, 4);
  const std::map<std::string, std::string> rounds = Rounds("spot");
  EXPECT_EQ(rounds.at("8"), "zone:g0,zone:g1,zone:g2") << EventLogText("spot");
  EXPECT_EQ(rounds.at("40"), "zone:g0,zone:g1") << EventLogText("spot");
  EXPECT_EQ(r.report.crc, Reference(History("spot", 3, 6))) << r.output;
}

// A node of a zone no group has yet joins at step 8: a new group, from θ_global, in the round of
// steps 8-12.
TEST_F(LowCommTest, AGroupJoiningAtARoundEndTakesPartInTheNextRound) {
  JobRun r = Train("join", {"--workers", "4", "--chaos", "join-worker@8:2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.world, 5);
  EXPECT_EQ(r.report.steps_lost, 0);
  const std::map<std::string, std::string> rounds = Rounds("join");
  EXPECT_EQ(rounds.at("8"), "zone:g0,zone:g1") << EventLogText("join");
  EXPECT_EQ(rounds.at("12"), "zone:g0,zone:g1,zone:g2") << EventLogText("join");
  EXPECT_TRUE(HasEvent("join", "generation", {{"step", "8"}, {"trigger", "join"}}))
      << EventLogText("join");
}

// Stopped after step 8's checkpoint with two groups, the job resumes with three: the first
// group's shards restore every group, θ_global and the outer momentum go on — DiLoCo's bits with
// that restore.
TEST_F(LowCommTest, ACheckpointRestoresAtAnotherGroupCount) {
  const std::string dir = base_ + "/resume";
  pid_t pid = Start(dir, {"--workers", "4"});
  const bool committed =
      WaitForEvent("resume", "checkpoint_committed", {{"step", "8"}}, std::chrono::seconds(120));
  kill(-pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(committed) << EventLogText("resume") << Slurp(dir + "/out.txt");
  SetGroups(3);
  JobRun r = Train("resume", {"--workers", "6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(HasEvent("resume", "generation", {{"source", "checkpoint"}, {"step", "8"}}))
      << EventLogText("resume");
  EXPECT_EQ(r.report.steps, steps_);
  EXPECT_EQ(Rounds("resume").at("12"), "zone:g0,zone:g1,zone:g2") << EventLogText("resume");
  std::vector<Groups> history(steps_, {"zone:g0", "zone:g1"});
  for (int s = 8; s < steps_; ++s) history[s] = {"zone:g0", "zone:g1", "zone:g2"};
  EXPECT_EQ(r.report.crc, Reference(history, {}, 8)) << r.output;
}

// One group of three sends garbage (1000 × its Δ) in the round ending at step 8: the median rule
// leaves it out of that round, and the model is DiLoCo's without that group's Δ there (it goes
// on from θ_global with the others).
TEST_F(LowCommTest, ACorruptedUpdateIsRejectedAndTheModelIsUnaffected) {
  SetGroups(3);
  std::string spec = Slurp(spec_);
  const size_t at = spec.find("[lowcomm]\n");
  std::ofstream(spec_) << spec.substr(0, at + 10) << "robust = \"reject\"\n"
                       << spec.substr(at + 10);
  JobRun r = Train("corrupt", {"--workers", "6", "--chaos", "corrupt-update@7:2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(FindEvents(Events("corrupt"), "fault_fired", {{"kind", "corrupt-update"}}).size(), 1u)
      << EventLogText("corrupt");
  const std::vector<SupervisionEvent> round =
      FindEvents(Events("corrupt"), "outer_round", {{"step", "8"}});
  ASSERT_EQ(round.size(), 1u) << EventLogText("corrupt");
  EXPECT_EQ(round[0].Field("rejected"), "zone:g1");
  EXPECT_EQ(round[0].Field("applied"), "zone:g0,zone:g2");
  EXPECT_EQ(Rounds("corrupt").at("12"), "zone:g0,zone:g1,zone:g2");
  EXPECT_EQ(r.report.crc, Reference(History("corrupt", 3, 6), {{8, {"zone:g1"}}})) << r.output;
}

// int8 and top-k pseudo-gradients: a quarter and a tenth of the bytes between groups, and the
// model still learns; every rank checks after every round that what its group sent plus its
// residual is what it meant to send (verify_feedback: a violation would fail the step), and the
// log carries the worst discrepancy, within float rounding.
TEST_F(LowCommTest, CompressedPseudoGradientsSendAFractionOfTheBytesAndStillLearn) {
  std::map<std::string, double> bytes;
  for (const std::string c : {"none", "int8", "topk:0.05"}) {
    std::string spec = Slurp(spec_);
    const size_t at = spec.find("[lowcomm]\n");
    std::ofstream(spec_) << spec.substr(0, at + 10) << "compression = \"" << c
                         << "\"\nverify_feedback = true\n"
                         << spec.substr(at + 10);
    const std::string name = c == "topk:0.05" ? "topk" : c;
    JobRun r = Train(name, {"--workers", "4"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string report = Slurp(base_ + "/" + name + "/report");
    const size_t at_bytes = report.find("outer_bytes=");
    ASSERT_NE(at_bytes, std::string::npos) << report;
    bytes[c] = std::stod(report.substr(at_bytes + 12));
    const std::vector<SupervisionEvent> steps = FindEvents(Events(name), "step");
    ASSERT_GE(steps.size(), 2u);
    EXPECT_LT(std::stod(steps.back().Field("loss")), std::stod(steps.front().Field("loss"))) << c;
    const std::vector<SupervisionEvent> rounds = FindEvents(Events(name), "outer_round");
    ASSERT_EQ(rounds.size(), 3u) << EventLogText(name);
    for (const SupervisionEvent& e : rounds) {
      ASSERT_FALSE(e.Field("feedback_error").empty()) << EventLogText(name);
      EXPECT_LE(std::stod(e.Field("feedback_error")), 1e-5) << c;
    }
    std::ofstream(spec_) << spec;
  }
  EXPECT_NEAR(bytes["int8"] / bytes["none"], 260.0 / 1024, 0.01);
  EXPECT_NEAR(bytes["topk:0.05"] / bytes["none"], 0.1, 0.01);
}

}  // namespace
