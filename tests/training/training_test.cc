// Elastic training end to end (issue: must show 1–3). Every run is `troupe train` as a real
// process tree; the faults are real: a worker process killed with SIGKILL in the middle of the
// gradient exchange, SIGTERM to a node agent, a node that joins, the whole job killed. Final
// weights are compared through the CRC32C of the flat parameter vector the job reports.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "caf/all.hpp"
#include "job_harness.h"
#include "troupe/base/events.h"
#include "troupe/runtime/cluster.h"

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

using troupe::base::SupervisionEvent;
using troupe::testing::Fields;
using troupe::testing::FindEvents;
using troupe::testing::JobRun;
using troupe::testing::kMicrobatches;
using troupe::testing::kSteps;
using troupe::testing::ReadEvents;
using troupe::testing::ReadReport;
using troupe::testing::Report;
using troupe::testing::Slurp;

class TrainingTest : public troupe::testing::JobTest {
 protected:
  // Run `name` on 4 workers, killed in the middle of step 4's gradient exchange (rank 2) and of
  // step 8's share (rank 1): both faults fire at their points, and both generations restore from
  // memory (`source`: the owners and buddy mirrors of a sharded state, or the replicas).
  JobRun KilledAtBothStepPoints(const std::string& name, const std::string& source = "mirrors") {
    JobRun r = Train(name, {"--workers", "4", "--chaos", "kill-worker@4:2:mid-exchange", "--chaos",
                            "kill-worker@8:1:mid-gather"});
    for (const auto& [step, point] :
         {std::pair<std::string, std::string>{"4", "mid-exchange"}, {"8", "mid-gather"}}) {
      EXPECT_EQ(FindEvents(Events(name), "fault_fired",
                           {{"kind", "kill-worker"}, {"step", step}, {"point", point}})
                    .size(),
                1u)
          << EventLogText(name);
      EXPECT_TRUE(HasEvent(name, "generation",
                           {{"trigger", "worker_down"}, {"step", step}, {"source", source}}))
          << EventLogText(name);
    }
    return r;
  }
};

TEST_F(TrainingTest, KillDashNineMidExchangeFinishesOnThreeWithIdenticalWeights) {
  const std::string want = Reference();
  ASSERT_FALSE(want.empty());
  JobRun one = Train("one", {"--workers", "1"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.report.crc, want) << "1 worker vs 4 workers";

  JobRun r = Train("kill", {"--workers", "4", "--chaos", "kill-worker@7"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The rank wrote down its own death in step 7; the head saw the process die of SIGKILL; the
  // next generation left it out, restoring step 7 from the survivors' memory.
  const std::vector<SupervisionEvent> fired =
      FindEvents(Events("kill"), "fault_fired", {{"kind", "kill-worker"}, {"step", "7"}});
  ASSERT_EQ(fired.size(), 1u) << EventLogText("kill");
  EXPECT_TRUE(HasEvent("kill", "generation",
                       {{"trigger", "worker_down"},
                        {"down", fired[0].child},
                        {"world", "3"},
                        {"step", "7"},
                        {"source", "mirrors"}}))
      << EventLogText("kill");
  // Its death is logged with the signal, as "signaled" even when the head's heartbeat timeout
  // (1 s here) runs out before the process has finished dying (the node agent leaves a process
  // that is already dying alone: AlreadyDying).
  bool death_logged = false;
  for (const SupervisionEvent& e :
       FindEvents(Events("kill"), "process_exit", {{"signal", std::to_string(SIGKILL)}})) {
    death_logged |= e.child == fired[0].child && e.cause == troupe::base::ExitCause::kSignaled;
  }
  EXPECT_TRUE(death_logged) << EventLogText("kill");
  EXPECT_TRUE(HasEvent("kill", "recovered", {{"fault", "kill-worker"}})) << EventLogText("kill");
  EXPECT_EQ(r.report.world, 3) << r.output;
  EXPECT_EQ(r.report.steps, kSteps);
  EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
  EXPECT_EQ(r.report.steps_lost, 0);
  EXPECT_GT(r.report.recovery_s, 0);
  ExpectExactlyOnce("kill");
  // The report's step phases are the ranks' own timings: each part of the step took time, and
  // the parts fit in the whole.
  EXPECT_GT(r.report.compute_s, 0) << r.output;
  EXPECT_GT(r.report.update_s, 0) << r.output;
  EXPECT_GE(r.report.exposed_s, 0) << r.output;
  EXPECT_LE(r.report.compute_s + r.report.exposed_s + r.report.update_s, r.report.step_s)
      << r.output;
  EXPECT_GE(r.report.overlap, 0) << r.output;
  EXPECT_LE(r.report.overlap, 1) << r.output;
}

// The overlapped step (train/elastic_overlap.cc) killed at both of its points: once during the
// last microbatch's backward pass with gradient pieces on the wire, once with the optimizer partly
// done and updated parameter pieces on the wire (16 KiB pieces: a few dozen per rank), each as a
// lossless delta against the committed parameters (param_delta = "on"; the reference sends them as
// they are). Each step is abandoned and re-run from memory, and the weights are the fault-free
// run's with the default pieces: neither the piece size nor the delta changes a bit.
TEST_F(TrainingTest, KillDashNineInTheMiddleOfAnOverlappedStepLosesNothing) {
  const std::string want = Reference();
  ASSERT_FALSE(want.empty());
  std::string spec = Slurp(spec_);
  const size_t at = spec.find("[elastic]\n");
  ASSERT_NE(at, std::string::npos) << spec;
  spec.insert(at + 10, "bucket_kib = 16\nparam_delta = \"on\"\n");
  std::ofstream(spec_) << spec;
  JobRun r = KilledAtBothStepPoints("overlap");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.world, 2) << r.output;
  EXPECT_EQ(r.report.steps, kSteps);
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
  // Every rank step with a rank to send to (neither itself nor its buddy: at W > 2) sent a delta.
  EXPECT_GT(r.report.delta_share, 0) << r.output;
  ExpectExactlyOnce("overlap");
}

// [optimizer] state = "replicated": the fault-free run's bits with the same bytes on the wire as
// sharded (at W = 4 each rank sends 3/4 + 3/4 of a gradient either way: the sharded owner's
// buddy gets its range's gradient and computes the updated range itself, so the mirror costs no
// byte), and a kill -9 at both points of the step loses nothing, nor does killing an owner with
// its buddy: every survivor holds the whole state.
TEST_F(TrainingTest, AReplicatedOptimizerStateTrainsTheSameBitsAndLosesNoStepToAnyKill) {
  const std::string want = Reference();
  ASSERT_FALSE(want.empty());
  JobRun sharded = Train("sharded", {"--workers", "4"});
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  std::ofstream(spec_, std::ios::app) << "[optimizer]\nstate = \"replicated\"\n";
  JobRun plain = Train("replicated", {"--workers", "4"});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.report.crc, want) << "replicated vs sharded\n" << plain.output;
  auto bytes = [&](const std::string& run) {
    double sum = 0;
    for (const SupervisionEvent& e : FindEvents(Events(run), "rank_step")) {
      if (e.Field("step") != "1") sum += std::stod(e.Field("collective_bytes"));
    }
    return sum;
  };
  const double ratio = bytes("replicated") / bytes("sharded");
  std::printf("collective bytes, replicated ÷ sharded: %.3f (%.0f ÷ %.0f)\n", ratio,
              bytes("replicated"), bytes("sharded"));
  EXPECT_NEAR(ratio, 1.0, 0.03) << "collective bytes, replicated ÷ sharded";
  JobRun r = KilledAtBothStepPoints("kill", "replicas");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.world, 2) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
  ExpectExactlyOnce("kill");
  // An owner and its buddy killed together: the sharded state restores from disk and loses steps
  // (ShardOwnerAndBuddyKilledTogetherRestoreFromDisk); here any survivor holds every range.
  JobRun both = Train("both", {"--workers", "4", "--chaos", "kill-shard-and-buddy@12"});
  ASSERT_EQ(both.exit_code, 0) << both.output;
  EXPECT_TRUE(HasEvent("both", "generation", {{"step", "12"}, {"source", "replicas"}}))
      << EventLogText("both");
  EXPECT_FALSE(HasEvent("both", "generation", {{"source", "checkpoint"}})) << EventLogText("both");
  EXPECT_EQ(both.report.steps_lost, 0) << both.output;
  EXPECT_EQ(both.report.world, 2) << both.output;
  EXPECT_EQ(both.report.crc, want) << both.output;
  ExpectExactlyOnce("both");
}

// [eval]: the validation loss every 6 steps and after the last, on the held-out shard `troupe
// data prepare` wrote. The same bits at any world size and through a kill -9 in a step that
// evaluates (its evaluation is re-run with the step); it falls as the model learns; the report
// carries the final one, and the event log every one — and every step event its gradient norm,
// the same bits too.
class ValidationTest : public troupe::testing::JobTest {
 protected:
  ValidationTest() { spec_extra_ = "[eval]\nevery = 6\nmicrobatches = 4\n"; }
  // Field `field` of run's `event` events, by step; each step once.
  std::map<std::string, std::string> ByStep(const std::string& run, const std::string& event,
                                            const std::string& field) {
    std::map<std::string, std::string> out;
    for (const SupervisionEvent& e : FindEvents(Events(run), event)) {
      EXPECT_TRUE(out.emplace(e.Field("step"), e.Field(field)).second)
          << event << " of step " << e.Field("step") << " twice\n"
          << EventLogText(run);
    }
    return out;
  }
  std::map<std::string, std::string> ValLosses(const std::string& run) {
    return ByStep(run, "eval", "val_loss");
  }
};

TEST_F(ValidationTest, TheValidationLossIsTheSameBitsAtAnyWorldSizeAndThroughAKill) {
  JobRun one = Train("one", {"--workers", "1"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  JobRun r = Train("kill", {"--workers", "4", "--chaos", "kill-worker@12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.crc, one.report.crc);
  const std::map<std::string, std::string> want = ValLosses("one");
  ASSERT_EQ(want.size(), 4u) << EventLogText("one");
  for (const char* step : {"6", "12", "18", "24"}) {
    ASSERT_TRUE(want.count(step)) << "no evaluation after step " << step << "\n"
                                  << EventLogText("one");
  }
  EXPECT_EQ(ValLosses("kill"), want) << EventLogText("kill");
  const std::map<std::string, std::string> norms = ByStep("one", "step", "grad_norm");
  ASSERT_EQ(norms.size(), 24u) << EventLogText("one");
  for (const auto& [step, norm] : norms) {
    ASSERT_FALSE(norm.empty()) << "step " << step << " has no grad_norm\n" << EventLogText("one");
    EXPECT_GT(std::stod(norm), 0) << "step " << step;
  }
  EXPECT_EQ(ByStep("kill", "step", "grad_norm"), norms) << EventLogText("kill");
  EXPECT_EQ(FindEvents(Events("kill"), "fault_fired", {{"step", "12"}}).size(), 1u)
      << EventLogText("kill");
  EXPECT_LT(std::stod(want.at("24")), std::stod(want.at("6"))) << "the model learned nothing";
  EXPECT_EQ(absl::StrFormat("%.6f", r.report.val_loss), want.at("24")) << r.output;
  EXPECT_NE(r.output.find(absl::StrFormat("val_loss@12 %.4f", std::stod(want.at("12")))),
            std::string::npos)
      << "the progress line shows it\n"
      << r.output;
}

TEST_F(TrainingTest, StoppedWorkerIsFoundByMissedHeartbeatsFencedAndLeftBehind) {
  const std::string want = Reference();
  // SIGSTOP in the middle of step 7's gradient exchange: alive to the kernel, silent to everyone.
  JobRun r = Train("stop", {"--workers", "4", "--chaos", "stop-worker@7"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      HasEvent("stop", "fault_fired",
               {{"kind", "stop-worker"}, {"rank", "1"}, {"signal", std::to_string(SIGSTOP)}}))
      << EventLogText("stop");
  EXPECT_EQ(r.report.world, 3) << r.output;
  EXPECT_EQ(r.report.steps, kSteps);
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
  ExpectExactlyOnce("stop");
}

TEST_F(TrainingTest, SigtermDrainsTheNodeAtAStepBoundaryWithNothingLost) {
  const std::string want = Reference();
  JobRun r = Train("drain", {"--workers", "4", "--chaos", "sigterm-node@6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(HasEvent("drain", "drain")) << EventLogText("drain");
  EXPECT_TRUE(HasEvent("drain", "generation", {{"trigger", "drain"}, {"world", "3"}}))
      << EventLogText("drain");
  EXPECT_EQ(r.report.world, 3) << r.output;
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("drain");
}

TEST_F(TrainingTest, AWorkerThatJoinsIsFoldedInAtTheNextStepBoundary) {
  const std::string want = Reference();
  JobRun r = Train("join", {"--workers", "4", "--chaos", "join-worker@20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(HasEvent("join", "join_folded")) << EventLogText("join");
  EXPECT_TRUE(HasEvent("join", "generation", {{"trigger", "join"}, {"world", "5"}, {"step", "20"}}))
      << EventLogText("join");
  EXPECT_EQ(r.report.world, 5) << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("join");
}

TEST_F(TrainingTest, KilledCoordinatorIsRestartedAndResumesFromTheCommittedStepRecord) {
  const std::string want = Reference();
  JobRun r = Train("coordinator", {"--workers", "4", "--chaos", "kill-coordinator@6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(HasEvent("coordinator", "fault_fired", {{"kind", "kill-coordinator"}, {"step", "6"}}))
      << EventLogText("coordinator");
  EXPECT_TRUE(HasEvent("coordinator", "coordinator_restarted", {{"step", "6"}}))
      << EventLogText("coordinator");
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.world, 4) << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("coordinator");
}

TEST_F(TrainingTest, CrashInTheMiddleOfACheckpointWriteLeavesLatestComplete) {
  const std::string want = Reference();
  // Checkpoints every 5 steps: the coordinator's process dies committing step-10 (its shard files
  // and manifest are on disk, LATEST still says step-5); the restarted coordinator finds step-5
  // as the newest valid checkpoint and the job finishes with the same weights.
  JobRun r = Train("ckptcrash", {"--workers", "3", "--chaos", "crash-in-checkpoint@10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The coordinator writes down the crash before it happens (its progress line to the driver may
  // not leave the process before SIGKILL does).
  EXPECT_TRUE(
      HasEvent("ckptcrash", "fault_fired", {{"kind", "crash-in-checkpoint"}, {"step", "10"}}))
      << EventLogText("ckptcrash");
  EXPECT_TRUE(
      HasEvent("ckptcrash", "coordinator_restarted",
               {{"checkpoint_step", "5"}, {"checkpoint", base_ + "/ckptcrash/ckpt/step-5"}}))
      << EventLogText("ckptcrash");
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("ckptcrash");
}

TEST_F(TrainingTest, ShardOwnerAndBuddyKilledTogetherRestoreFromDisk) {
  const std::string want = Reference();
  JobRun r = Train("both", {"--workers", "4", "--chaos", "kill-shard-and-buddy@12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(HasEvent("both", "generation", {{"source", "checkpoint"}, {"step", "10"}}))
      << EventLogText("both");
  EXPECT_EQ(r.report.steps_lost, 2) << "step 10's checkpoint, killed in step 12\n" << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
}

TEST_F(TrainingTest, WholeJobKilledThenResumedWithAnotherWorldSize) {
  const std::string want = Reference();
  const std::string dir = base_ + "/resume";
  pid_t pid = Start(dir, {"--workers", "4"});
  // Wait until step 10's checkpoint is committed, then kill the whole job (driver, head, nodes,
  // workers: the process group and, through their death signals, everything below).
  const bool committed =
      WaitForEvent("resume", "checkpoint_committed", {{"step", "10"}}, std::chrono::seconds(120));
  kill(-pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(committed) << EventLogText("resume") << Slurp(dir + "/out.txt");
  JobRun r = Train("resume", {"--workers", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(HasEvent("resume", "generation", {{"source", "checkpoint"}}))
      << EventLogText("resume");
  EXPECT_EQ(r.report.world, 2);
  EXPECT_EQ(r.report.crc, want) << r.output;
}

// The pid of `parent`'s child whose command line contains `word` (0 if none).
pid_t ChildWith(pid_t parent, const std::string& word) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(Slurp(e.path() / "stat"));
    std::string pid, comm, state;
    pid_t ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    std::string cmdline = Slurp(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (ppid == parent && cmdline.find(word) != std::string::npos) return std::stoi(name);
  }
  return 0;
}

// Processes (other than this test) whose command line mentions `word`.
std::vector<pid_t> ProcessesWith(const std::string& word) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = Slurp(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(word) != std::string::npos && std::stoi(name) != getpid()) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

// kill -9 from outside, of two worker processes at once, in the middle of a run: the worker that
// hosts the coordinator and a rank's worker (an operator picking two `troupe worker` pids from ps
// hits the coordinator's two times in five). Every death is in the job's event log with its
// cause; the coordinator is restarted and the job ends with the fault-free run's weights.
TEST_F(TrainingTest, TwoWorkersKilledAtOnceFromOutsideAreLoggedWithTheirCauses) {
  const std::string want = Reference();
  ASSERT_FALSE(want.empty());
  const std::string dir = base_ + "/kill2";
  const pid_t job = Start(dir, {"--workers", "4"});
  // Mid-run: two steps committed (the coordinator's commit record has a line per commit).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int commits = 0;
  pid_t coord = 0, rank = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    commits = Commits(dir);
    if (commits >= 2) {
      coord = ChildWith(ChildWith(job, "--name coord "), " worker ");
      rank = ChildWith(ChildWith(job, "--name n1 "), " worker ");
      break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_GE(commits, 2) << Slurp(dir + "/out.txt");
  ASSERT_GT(coord, 0);
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(coord, SIGKILL), 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  const int rc = Wait(job, milliseconds(240000));
  const std::string out = Slurp(dir + "/out.txt");
  ASSERT_EQ(rc, 0) << out;

  const std::vector<troupe::base::SupervisionEvent> events = ReadEvents(dir + "/logs/events.log");
  for (pid_t victim : {coord, rank}) {
    bool found = false;
    for (const auto& e : events) {
      found = found || (e.event == "process_exit" && e.pid == victim &&
                        e.cause == troupe::base::ExitCause::kSignaled && e.signal == SIGKILL);
    }
    EXPECT_TRUE(found) << "no process_exit event with cause=signaled signal=9 for pid " << victim
                       << "\n"
                       << Slurp(dir + "/logs/events.log");
  }
  // Every death in the log has a cause, and the coordinator's exit is there with the reason.
  bool coordinator_exit = false, coordinator_restart = false;
  for (const auto& e : events) {
    if (e.event == "process_exit") {
      EXPECT_NE(e.cause, troupe::base::ExitCause::kNone) << troupe::base::FormatEvent(e);
      EXPECT_GT(e.pid, 0) << troupe::base::FormatEvent(e);
    }
    const bool is_coordinator =
        e.child.size() > 12 && e.child.compare(e.child.size() - 12, 12, ".coordinator") == 0;
    if (is_coordinator && e.event == "exit") {
      coordinator_exit = true;
      EXPECT_FALSE(e.reason.empty()) << troupe::base::FormatEvent(e);
    }
    coordinator_restart =
        coordinator_restart || (is_coordinator && e.event == "start" && coordinator_exit);
  }
  EXPECT_TRUE(coordinator_exit) << Slurp(dir + "/logs/events.log");
  EXPECT_TRUE(coordinator_restart) << Slurp(dir + "/logs/events.log");

  const Report report = ReadReport(dir + "/report");
  EXPECT_EQ(report.steps, kSteps);
  EXPECT_EQ(report.crc, want) << "final weights differ from the fault-free run\n" << out;
  ExpectExactlyOnce("kill2");
  // Nothing is left behind: the head and node agents name the job's log folder (their workers
  // die with them, PR_SET_PDEATHSIG).
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ProcessesWith(dir + "/logs").empty() && std::chrono::steady_clock::now() < gone_by) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(ProcessesWith(dir + "/logs").empty());
}

// kill -9 of the embedded cluster's head in the middle of the job: the cluster starts it again
// from its store (as systemd would); the driver, the coordinator and every node and worker rejoin
// it, the job pauses at most at a step boundary, and it finishes with nothing lost and the
// fault-free run's weights. (A head gone for longer than the grace: HeadFailoverTest.)
TEST_F(TrainingTest, LosingTheHeadPausesTheJobUntilItsRestartedHeadTakesOver) {
  const std::string want = Reference();
  const std::string dir = base_ + "/headloss";
  const pid_t pid = Start(dir, {"--workers", "2"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Commits(dir) < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const pid_t head = ChildWith(pid, " head ");
  ASSERT_GT(head, 0) << Slurp(dir + "/out.txt");
  ASSERT_EQ(kill(head, SIGKILL), 0);
  const int rc = Wait(pid, milliseconds(120000));
  const std::string out = Slurp(dir + "/out.txt");
  ASSERT_EQ(rc, 0) << out;
  const Report report = ReadReport(dir + "/report");
  EXPECT_EQ(report.steps, kSteps) << out;
  EXPECT_EQ(report.steps_lost, 0) << out;
  EXPECT_EQ(report.crc, want) << "final weights differ from the fault-free run\n" << out;
  const std::vector<SupervisionEvent> events = Events("headloss");
  const std::vector<SupervisionEvent> lost = FindEvents(events, "head_lost");
  ASSERT_EQ(lost.size(), 1u) << EventLogText("headloss");
  EXPECT_LT(std::stoi(lost[0].Field("step")), kSteps) << "the head was lost after the job's end";
  EXPECT_EQ(FindEvents(events, "head_back").size(), 1u) << EventLogText("headloss");
  EXPECT_NE(Slurp(dir + "/logs/head.err").find("started again"), std::string::npos);
  ExpectExactlyOnce("headloss");
}

TEST_F(TrainingTest, SubmitsToARunningClusterWithHead) {
  const std::string want = Reference();
  // `troupe up --workers 3` in its own process group; its first line names the head.
  const std::string up_log = base_ + "/up.txt";
  pid_t up = fork();
  if (up == 0) {
    setpgid(0, 0);
    int fd = open(up_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(TROUPE_BINARY, TROUPE_BINARY, "up", "--workers", "3", "--log_dir",
          (base_ + "/up-logs").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string head;
  for (int i = 0; i < 1000 && head.empty(); ++i) {
    const std::string text = Slurp(up_log);
    const size_t at = text.find("head at ");
    if (at != std::string::npos) head = text.substr(at + 8, text.find(' ', at + 8) - at - 8);
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_FALSE(head.empty()) << Slurp(up_log);
  JobRun r = Train("remote", {"--head", head, "--chaos", "kill-worker@6"});
  kill(-up, SIGTERM);
  EXPECT_EQ(Wait(up, milliseconds(20000)), 0) << Slurp(up_log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.world, 2) << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("remote");
}

// The checkpoints on a 2 MB tmpfs of their own: step 5's checkpoint (1.6 MB) fits, every later
// one finds the disk full. Training goes on (one warning per dropped checkpoint, no temporary file
// left behind); the final checkpoint cannot be written, so the job ends at once with a non-zero
// exit naming the file and the cause (it used to retry the final write forever). The work_dir's
// logs are on another disk, as a checkpoint volume's usually are: with the whole work_dir on the
// tmpfs, the event log lost the tail of its last line (final_checkpoint_failed, logged when the
// first shard failed) once the other shard's temporary file had taken the space left.
TEST_F(TrainingTest, ADiskFullEndsTheJobCleanlyNamingTheFinalCheckpoint) {
  const std::string dir = base_ + "/full";
  fs::create_directories(dir + "/ckpt");
  ASSERT_EQ(std::system(("mount -t tmpfs -o size=2m troupe-full " + dir + "/ckpt").c_str()), 0)
      << "mounting a tmpfs needs root (CI runs as root)";
  struct Unmount {
    std::string dir;
    ~Unmount() { std::system(("umount -l " + dir).c_str()); }
  } unmount{dir + "/ckpt"};
  JobRun r = Train("full", {"--workers", "2"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "still running after 240 s\n" << r.output;
  const std::vector<SupervisionEvent> events = Events("full");
  EXPECT_EQ(FindEvents(events, "checkpoint_committed", {{"step", "5"}}).size(), 1u)
      << EventLogText("full");
  std::vector<std::string> dropped;
  for (const SupervisionEvent& e : FindEvents(events, "checkpoint_dropped")) {
    dropped.push_back(e.Field("step"));
    EXPECT_EQ(e.Field("path"), dir + "/ckpt/step-" + e.Field("step")) << FormatEvent(e);
  }
  EXPECT_EQ(dropped, (std::vector<std::string>{"10", "15", "20"}))
      << "one each for step-10, step-15 and step-20\n"
      << EventLogText("full");
  EXPECT_EQ(FindEvents(events, "final_checkpoint_failed", {{"step", "24"}}).size(), 1u)
      << EventLogText("full");
  // The job's error names the file and the cause.
  EXPECT_NE(r.output.find("final checkpoint step-24"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  for (const auto& e : fs::recursive_directory_iterator(dir + "/ckpt")) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path() << " left behind";
  }
  std::istringstream commits(Slurp(dir + "/commits.log"));
  int64_t s, g, n = 0;
  while (commits >> s >> g) ++n;
  EXPECT_EQ(n, kSteps) << "every step was still trained";
}

// A coordinator that cannot run (its checkpoint directory is a file: every incarnation loses its
// lease at its first fence write) is restarted until its supervisor gives up; the job then fails
// at once naming the cause, not after timeouts.driver_silence (180 s) of silence.
TEST_F(TrainingTest, ACoordinatorThatCannotRunFailsTheJobAtOnceNamingWhy) {
  const std::string dir = base_ + "/nockpt";
  fs::create_directories(dir);
  std::ofstream(dir + "/ckpt") << "a file where the checkpoint directory goes\n";
  const auto t0 = std::chrono::steady_clock::now();
  JobRun r = Train("nockpt", {"--workers", "2"}, milliseconds(150000));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NE(r.exit_code, -1) << "still running after 150 s\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 120) << "failed only after " << seconds << " s\n" << r.output;
  EXPECT_NE(r.output.find("the job supervisor stopped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ckpt/FENCE.tmp: Not a directory"), std::string::npos) << r.output;
  const std::vector<SupervisionEvent> events = Events("nockpt");
  EXPECT_GE(FindEvents(events, "exit").size(), 10u) << EventLogText("nockpt");
  EXPECT_EQ(FindEvents(events, "escalate").size(), 1u) << EventLogText("nockpt");
}

std::vector<std::string> TlsFlags(const std::string& certs, const std::string& who) {
  return {"--tls_ca",  certs + "/ca.pem",         "--tls_cert", certs + "/" + who + ".pem",
          "--tls_key", certs + "/" + who + ".key"};
}

// Blocks until `want` workers of the cluster are alive (woken by its membership events), or the
// deadline passes; returns how many are alive.
size_t WaitForAliveWorkers(troupe::runtime::Runtime& rt, troupe::runtime::ClusterClient& client,
                           size_t want, std::chrono::seconds timeout) {
  caf::scoped_actor self{rt.system()};
  client.Subscribe(self);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t alive = 0;
  while (true) {
    absl::StatusOr<std::vector<troupe::runtime::MemberInfo>> members = client.Members();
    alive = 0;
    for (const auto& m : members.value_or(std::vector<troupe::runtime::MemberInfo>{})) {
      if (m.kind == troupe::runtime::MemberKind::kWorker &&
          m.state == troupe::runtime::MemberState::kAlive) {
        ++alive;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (alive >= want || now >= deadline) return alive;
    self->receive([](troupe::runtime::membership_atom, const troupe::runtime::MembershipEvent&) {},
                  caf::after(std::chrono::duration_cast<milliseconds>(deadline - now)) >> [] {});
  }
}

TEST_F(TrainingTest, MutualTlsClusterTrainsThroughAKillAndRefusesADriverWithoutCertificates) {
  const std::string want = Reference();
  ASSERT_FALSE(want.empty());
  // The cluster's certificates, made by `troupe certs` as a person would.
  const std::string certs = base_ + "/certs";
  {
    pid_t pid = fork();
    if (pid == 0) {
      execl(TROUPE_BINARY, TROUPE_BINARY, "certs", "--dir", certs.c_str(), "--members",
            "head,node,driver", static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_EQ(Wait(pid, milliseconds(30000)), 0);
  }
  // A head and a node agent with three workers, each its own process, with their certificates.
  troupe::runtime::LocalCluster::Options o;
  o.binary = TROUPE_BINARY;
  o.workers = 0;
  o.cluster.log_dir = base_ + "/tls-logs";
  o.head_args = TlsFlags(certs, "head");
  absl::StatusOr<std::unique_ptr<troupe::runtime::LocalCluster>> cluster =
      troupe::runtime::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->AddNode("n1", 3, "cpu=3", "", TlsFlags(certs, "node")).ok());
  const std::string head = "127.0.0.1:" + std::to_string((*cluster)->port());
  {
    // All three workers joined over TLS before the job starts (so its first world is 3).
    troupe::runtime::RuntimeOptions ro;
    ro.network = true;
    ro.log_events = false;
    ro.tls_ca = certs + "/ca.pem";
    ro.tls_cert = certs + "/driver.pem";
    ro.tls_key = certs + "/driver.key";
    absl::StatusOr<std::unique_ptr<troupe::runtime::Runtime>> rt =
        troupe::runtime::Runtime::Create(troupe::runtime::ActorRegistry{}, ro);
    ASSERT_TRUE(rt.ok()) << rt.status();
    absl::StatusOr<troupe::runtime::ClusterClient> client =
        troupe::runtime::ClusterClient::Connect(**rt, "127.0.0.1", (*cluster)->port());
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_EQ(WaitForAliveWorkers(**rt, *client, 3, std::chrono::seconds(60)), 3u);
  }

  // A driver without the cluster's certificate is cut off in the handshake: it fails fast and
  // says which options it lacks.
  const auto t0 = std::chrono::steady_clock::now();
  JobRun plain = Train("tls-plain", {"--head", head}, milliseconds(30000));
  const double plain_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(plain.exit_code, 1) << plain.output;
  EXPECT_LT(plain_s, 15.0) << plain.output;
  EXPECT_NE(plain.output.find("cannot reach " + head), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("--tls_ca, --tls_cert and --tls_key"), std::string::npos)
      << plain.output;

  // With the driver's certificate the job runs, loses a worker to kill -9 in step 6 and ends
  // with the fault-free run's weights.
  std::vector<std::string> args = TlsFlags(certs, "driver");
  args.insert(args.end(), {"--head", head, "--chaos", "kill-worker@6"});
  JobRun r = Train("tls", args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps, kSteps) << r.output;
  EXPECT_EQ(r.report.world, 2) << r.output;
  EXPECT_GE(r.report.generations, 2) << r.output;
  EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
  // commits.log ("step generation" per committed step): step 6 was committed by a later
  // generation than step 5, and the job ended in that generation.
  std::map<int64_t, int64_t> generation_of;
  std::istringstream commits(Slurp(base_ + "/tls/commits.log"));
  for (int64_t step, gen; commits >> step >> gen;) generation_of[step] = gen;
  ASSERT_TRUE(generation_of.count(5) && generation_of.count(6) && generation_of.count(kSteps - 1))
      << Slurp(base_ + "/tls/commits.log");
  EXPECT_GT(generation_of[6], generation_of[5]) << Slurp(base_ + "/tls/commits.log");
  EXPECT_EQ(generation_of[kSteps - 1], generation_of[6]) << Slurp(base_ + "/tls/commits.log");
  ExpectExactlyOnce("tls");
}

TEST_F(TrainingTest, CorruptNewestCheckpointIsSkippedAndThePreviousUsed) {
  const std::string want = Reference();
  // A finished job (checkpoints every 5 and at the end, keep 3) leaves step-15, step-20 and
  // step-24; damage step-24's first shard.
  JobRun first = Train("corrupt", {"--workers", "3"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string shard = base_ + "/corrupt/ckpt/step-24/shard-00000.bin";
  ASSERT_TRUE(fs::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  // Re-running the job resumes from the newest *valid* checkpoint (step-20), recomputes steps
  // 20..23 and ends with the same weights as the fault-free run.
  JobRun again = Train("corrupt", {"--workers", "2"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("shard-00000.bin"), std::string::npos)
      << "the warning names the damaged file\n"
      << again.output;
  EXPECT_TRUE(HasEvent("corrupt", "generation", {{"source", "checkpoint"}, {"step", "20"}}))
      << EventLogText("corrupt");
  EXPECT_EQ(again.report.crc, want) << again.output;
}

// Pipeline stages end to end (issue 16): `troupe train` of the 4-block GPT on DP × PP grids, each
// bit-identical to the data-parallel run of the same job; a stage worker killed with SIGKILL, a
// stage worker's node drained, a joiner — each re-plans the grid at a step boundary and the job
// ends with the data-parallel weights, every microbatch served once per committed step.
constexpr int kPipelineSteps = 12;

class PipelineTest : public TrainingTest {
 protected:
  // The job with `stages` pipeline stages asked for; `spec_` points at it.
  void UseStages(int stages, const std::string& schedule = "1f1b") {
    spec_ = absl::StrCat(base_, "/job_p", stages, "_", schedule, ".toml");
    std::ofstream(spec_) << "[job]\nname = \"p\"\nsteps = " << kPipelineSteps
                         << "\n[model]\nsize = \"tiny4\"\nmicrobatches = " << kMicrobatches
                         << "\ndata_dir = \"" << data_
                         << "\"\n[elastic]\nmin_workers = 1\nmax_workers = 8\n"
                         << "[pipeline]\nstages = " << stages << "\nschedule = \"" << schedule
                         << "\"\n[checkpoint]\nevery = 5\nkeep_last = 3\n";
  }
  // The data-parallel run's final weights (2 workers), once per test binary.
  const std::string& DataParallel() {
    static std::string crc;
    if (crc.empty()) {
      UseStages(1);
      JobRun r = Train("data_parallel", {"--workers", "2"});
      EXPECT_EQ(r.exit_code, 0) << r.output;
      crc = r.report.crc;
    }
    return crc;
  }
  // Runs the job on `workers` workers with `stages` stages asked for; expects it to finish
  // with the data-parallel weights, nothing lost, and a first generation of `stages` stages.
  JobRun Grid(const std::string& name, int workers, int stages, const std::string& schedule,
              const std::vector<std::string>& chaos = {}) {
    const std::string want = DataParallel();
    EXPECT_FALSE(want.empty());
    UseStages(stages, schedule);
    std::vector<std::string> args = {"--workers", std::to_string(workers)};
    args.insert(args.end(), chaos.begin(), chaos.end());
    JobRun r = Train(name, args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(HasEvent(name, "generation",
                         {{"trigger", "start"},
                          {"world", std::to_string(workers)},
                          {"stages", std::to_string(stages)}}))
        << EventLogText(name);
    EXPECT_EQ(r.report.steps, kPipelineSteps) << r.output;
    EXPECT_EQ(r.report.steps_lost, 0) << r.output;
    EXPECT_EQ(r.report.crc, want) << "final weights differ from the data-parallel run\n"
                                  << r.output;
    ExpectExactlyOnce(name, kPipelineSteps);
    // Every stage's most microbatches in flight, as its rank logged them: within the schedule's
    // bound always, at it in the first generation.
    std::set<int64_t> first_generation_stages;
    for (const SupervisionEvent& e : FindEvents(Events(name), "stage_in_flight", {})) {
      const int64_t stage = e.IntField("stage"), p = e.IntField("stages");
      const int64_t m = e.IntField("microbatches"), got = e.IntField("in_flight");
      const int64_t bound = e.Field("schedule") == "gpipe" ? m : std::min(m, p - stage);
      EXPECT_GT(got, 0) << e.child;
      EXPECT_LE(got, bound) << e.child << " stage " << stage << " of " << p;
      if (e.generation != 1) continue;
      EXPECT_EQ(got, bound) << e.child << " stage " << stage << " of " << p;
      EXPECT_EQ(e.Field("schedule"), schedule);
      first_generation_stages.insert(stage);
    }
    EXPECT_EQ(first_generation_stages.size(), static_cast<size_t>(stages)) << EventLogText(name);
    return r;
  }
};

TEST_F(PipelineTest, TwoStagesOfOneReplicaMatchDataParallel) { Grid("p2d1", 2, 2, "1f1b"); }

TEST_F(PipelineTest, TwoStagesOfTwoReplicasMatchDataParallel) { Grid("p2d2", 4, 2, "1f1b"); }

TEST_F(PipelineTest, FourStagesOfOneReplicaUnderGPipeMatchDataParallel) {
  Grid("p4d1", 4, 4, "gpipe");
}

TEST_F(PipelineTest, FourStagesOfTwoReplicasMatchDataParallel) { Grid("p4d2", 8, 4, "1f1b"); }

TEST_F(PipelineTest, KillDashNineOfAMiddleStagesWorkerReplansTheGrid) {
  // Rank 1 of a 1 × 4 grid (stage 1) dies in the middle of step 5's gradient exchange: the three
  // survivors go on as a 1 × 3 grid from the committed state in memory.
  JobRun r = Grid("kill", 4, 4, "1f1b", {"--chaos", "kill-worker@5:1"});
  EXPECT_TRUE(HasEvent("kill", "fault_fired", {{"kind", "kill-worker"}, {"step", "5"}}))
      << EventLogText("kill");
  EXPECT_TRUE(HasEvent("kill", "generation",
                       {{"trigger", "worker_down"},
                        {"world", "3"},
                        {"stages", "3"},
                        {"step", "5"},
                        {"source", "mirrors"}}))
      << EventLogText("kill");
  EXPECT_EQ(r.report.world, 3) << r.output;
}

TEST_F(PipelineTest, SigtermDrainOfAStagesWorkerReplansAtAStepBoundary) {
  // The node of rank 2 (a 2 × 2 grid's stage 1) gets SIGTERM before step 4: its rank leaves at
  // the next step boundary the coordinator sees the notice at, the others go on as 1 × 3.
  JobRun r = Grid("drain", 4, 2, "1f1b", {"--chaos", "sigterm-node@4:2"});
  EXPECT_TRUE(
      HasEvent("drain", "generation", {{"trigger", "drain"}, {"world", "3"}, {"stages", "3"}}))
      << EventLogText("drain");
  EXPECT_EQ(r.report.world, 3) << r.output;
}

TEST_F(PipelineTest, AJoinerChangesTheGrid) {
  // 1 × 2, then a third worker joins before step 6: 1 × 3.
  JobRun r = Grid("join", 2, 2, "1f1b", {"--chaos", "join-worker@6"});
  EXPECT_TRUE(HasEvent("join", "generation",
                       {{"trigger", "join"}, {"world", "3"}, {"stages", "3"}, {"step", "6"}}))
      << EventLogText("join");
  EXPECT_EQ(r.report.world, 3) << r.output;
}

}  // namespace
