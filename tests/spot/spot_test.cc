// Spot lifecycle end to end (issue 17). A cluster of real processes — a head, spot node agents
// (one worker each) and an on-demand node for the coordinator — each spot node watching its own
// cloud's metadata server (a MetadataSimulator: real HTTP on loopback, AWS IMDSv2 or GCE) or
// SIGTERM; a `troupe train --head` job runs on it, and the test gives the notice once the job has
// committed a few steps. Final weights are compared with a fault-free embedded run's CRC32C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "job_harness.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/metadata_sim.h"

namespace {

using std::chrono::milliseconds;
using troupe::runtime::LocalCluster;
using troupe::runtime::MetadataSimulator;
using troupe::testing::FindEvents;
using troupe::testing::JobRun;
using troupe::testing::ReadReport;
using troupe::testing::Slurp;
using troupe::testing::SupervisionEvent;

constexpr int kSpotNodes = 4;
constexpr int kNoticeStep = 6;  // the notice comes once this many steps are committed

struct SpotCluster {
  std::unique_ptr<LocalCluster> local;
  std::vector<std::unique_ptr<MetadataSimulator>> metadata;  // node s<i>'s cloud
  std::string head;                                          // HOST:PORT
};

class SpotJobTest : public troupe::testing::JobTest {
 protected:
  // Notices that come within half a second of each other are handed over together; the job is
  // long enough for that to pass well before its end.
  SpotJobTest() {
    steps_ = 60;
    spec_extra_ = "[timeouts]\nnotice_window = \"500ms\"\n";
  }
  // Spot nodes s0..s<n-1> watching `source` ("aws", "gce": each its own metadata server;
  // "sigterm"), and the on-demand node "od" unless `on_demand` is false; returns once every
  // worker is alive. Ranks follow worker ids (od/w0, s0/w0, s1/w0, ...), each one's buddy the
  // next (one host: one failure domain).
  SpotCluster StartCluster(const std::string& source, int spot_nodes = kSpotNodes,
                           bool on_demand = true) {
    SpotCluster c;
    LocalCluster::Options o;
    o.binary = TROUPE_BINARY;
    o.workers = 0;
    o.cluster.log_dir = base_ + "/cluster";
    o.head_store = head_store_;
    auto local = LocalCluster::Start(o);
    EXPECT_TRUE(local.ok()) << local.status();
    if (!local.ok()) return c;
    c.local = std::move(*local);
    c.head = absl::StrCat("127.0.0.1:", c.local->port());
    for (int i = 0; i < spot_nodes; ++i) {
      // A long grace: a noticed node leaves once its ranks are handed over, not at its end.
      std::vector<std::string> args = {"--grace",           "30s", "--preemption_source", source,
                                       "--preemption_poll", "50ms"};
      if (source == "aws" || source == "gce") {
        c.metadata.push_back(std::make_unique<MetadataSimulator>());
        args.insert(args.end(), {"--metadata_endpoint", c.metadata.back()->endpoint()});
      }
      EXPECT_TRUE(c.local->AddNode(absl::StrCat("s", i), 1, "cpu=1", "spot=true", args).ok());
    }
    if (on_demand) {
      EXPECT_TRUE(c.local->AddNode("od", 1, "cpu=1", "", {"--grace", "5s"}).ok());
    }
    const std::string wait =
        absl::StrCat(TROUPE_BINARY, " status --head ", c.head, " --wait_workers ",
                     spot_nodes + (on_demand ? 1 : 0), " >/dev/null 2>&1");
    EXPECT_EQ(std::system(wait.c_str()), 0) << Slurp(base_ + "/cluster/head.err");
    return c;
  }

  // Runs job `name` on `c`; `notice` runs once it has committed `step` steps.
  JobRun RunNoticed(const std::string& name, const SpotCluster& c,
                    const std::function<void()>& notice, int step = kNoticeStep) {
    const std::string dir = base_ + "/" + name;
    const pid_t pid = Start(dir, {"--head", c.head});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (Commits(dir) < step && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    EXPECT_GE(Commits(dir), step) << Slurp(dir + "/out.txt");
    notice();
    notice_at_ = std::chrono::steady_clock::now();
    JobRun r;
    r.exit_code = Wait(pid, milliseconds(240000));
    r.output = Slurp(dir + "/out.txt");
    r.report = ReadReport(dir + "/report");
    return r;
  }

  // Nodes `nodes` (a list) were noticed (each drain names `notice`) and left together at a step
  // boundary; the generation after it restored their state from `source` (memory: "owners" or
  // "mirrors"; "checkpoint" of the committed step, written before they left) and went on with
  // `world` ranks; nothing was lost, and the weights are the fault-free run's.
  void ExpectHandedOver(const std::string& name, const JobRun& r,
                        const std::vector<std::string>& nodes, const std::string& notice,
                        const std::string& want, const std::set<std::string>& sources, int world) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<SupervisionEvent> events = Events(name);
    for (const std::string& node : nodes) {
      const std::vector<SupervisionEvent> drains = FindEvents(events, "drain", {{"node", node}});
      ASSERT_EQ(drains.size(), 1u) << EventLogText(name);
      EXPECT_NE(drains[0].reason.find(notice), std::string::npos) << EventLogText(name);
    }
    const std::vector<SupervisionEvent> gens = FindEvents(
        events, "generation", {{"trigger", "drain"}, {"node", absl::StrJoin(nodes, " ")}});
    ASSERT_EQ(gens.size(), 1u) << "one hand-over for all of them\n" << EventLogText(name);
    EXPECT_GE(std::stoi(gens[0].Field("step")), kNoticeStep);
    EXPECT_TRUE(sources.count(gens[0].Field("source"))) << EventLogText(name);
    EXPECT_EQ(gens[0].Field("steps_lost"), "0");
    EXPECT_EQ(gens[0].Field("world"), absl::StrCat(world));
    EXPECT_EQ(r.report.steps_lost, 0) << r.output;
    EXPECT_EQ(r.report.world, world) << r.output;
    EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
    ExpectExactlyOnce(name);
  }
  // One node noticed: its state from the survivors' memory, no checkpoint read; the on-demand
  // node's rank stays too. The node left as soon as that was done, not at its grace's end.
  void ExpectHandedOverFromMemory(const std::string& name, const JobRun& r, const SpotCluster& c,
                                  const std::string& node, const std::string& notice,
                                  const std::string& want) {
    ExpectHandedOver(name, r, {node}, notice, want, {"owners", "mirrors"}, kSpotNodes);
    const pid_t agent = c.local->nodes().at(node);
    while (Running(agent) &&
           std::chrono::steady_clock::now() - notice_at_ < std::chrono::seconds(15)) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    EXPECT_FALSE(Running(agent)) << "node " << node << " still there 15 s after its notice (its "
                                 << "grace is 30 s: it should have been released)\n"
                                 << Slurp(base_ + "/cluster/head.out");
    EXPECT_NE(Slurp(base_ + "/cluster/head.out").find("node " + node + " released"),
              std::string::npos)
        << Slurp(base_ + "/cluster/head.out");
  }
  // Whether `pid` still runs (a zombie has exited).
  static bool Running(pid_t pid) {
    const std::string stat = Slurp("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
  }
  std::chrono::steady_clock::time_point notice_at_;
  bool head_store_ = false;  // StartCluster: a head that RestartHead restarts from its store
};

class SpotNoticeTest : public SpotJobTest {};

TEST_F(SpotNoticeTest, AwsInstanceActionHandsTheNodeOverAtTheNextStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("aws");
  ASSERT_EQ(c.metadata.size(), static_cast<size_t>(kSpotNodes));
  // The instance-action's time is 20 s away: less than the node's grace (30 s), so the drain's
  // deadline is the cloud's.
  JobRun r = RunNoticed("aws", c, [&] { c.metadata[1]->Preempt(std::chrono::seconds(20)); });
  ExpectHandedOverFromMemory("aws", r, c, "s1", "aws spot instance-action terminate at 20", want);
  EXPECT_GE(c.metadata[1]->token_requests(), 1);
  const std::vector<SupervisionEvent> drains = FindEvents(Events("aws"), "drain", {{"node", "s1"}});
  ASSERT_EQ(drains.size(), 1u);
  std::smatch within;
  const std::string reason = drains[0].reason;
  ASSERT_TRUE(std::regex_search(reason, within, std::regex("leaves within ([0-9]+)ms"))) << reason;
  EXPECT_LE(std::stoi(within[1]), 20000) << reason;
  EXPECT_GT(std::stoi(within[1]), 15000) << reason;
}

TEST_F(SpotNoticeTest, GcePreemptedHandsTheNodeOverAtTheNextStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("gce");
  ASSERT_EQ(c.metadata.size(), static_cast<size_t>(kSpotNodes));
  JobRun r = RunNoticed("gce", c, [&] { c.metadata[2]->Preempt(); });
  ExpectHandedOverFromMemory("gce", r, c, "s2", "gce instance/preempted TRUE", want);
}

TEST_F(SpotNoticeTest, SigtermFromOutsideHandsTheNodeOverAtTheNextStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("sigterm");
  // As Kubernetes does at a pod's deletion: SIGTERM to the agent, then its grace period.
  JobRun r = RunNoticed("sigterm", c, [&] { kill(c.local->nodes().at("s3"), SIGTERM); });
  ExpectHandedOverFromMemory("sigterm", r, c, "s3", "SIGTERM", want);
}

// --preemption_source none: SIGTERM stops the node at once, no notice — its rank is lost as to a
// crash and restored from its buddy's mirror; only the step in flight runs again.
TEST_F(SpotNoticeTest, WithoutANoticeSourceSigtermStopsTheNodeAndItsRankIsRecovered) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("none");
  JobRun r = RunNoticed("none", c, [&] { kill(c.local->nodes().at("s2"), SIGTERM); });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(FindEvents(Events("none"), "drain").empty()) << EventLogText("none");
  EXPECT_EQ(FindEvents(Events("none"), "generation",
                       {{"trigger", "worker_down"}, {"down", "s2/w0"}, {"source", "mirrors"}})
                .size(),
            1u)
      << EventLogText("none");
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("none");
}

class SpotHandoverTest : public SpotJobTest {};

// s1's rank's buddy is s2's: with both noticed no survivor holds s1's range, so every rank — the
// noticed ones are still alive — checkpoints the committed step before they go.
TEST_F(SpotHandoverTest, AnOwnerAndItsBuddyNoticedTogetherCheckpointFirstAndLoseNothing) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("aws");
  JobRun r = RunNoticed("pair", c, [&] {
    c.metadata[1]->Preempt();
    c.metadata[2]->Preempt();
  });
  ExpectHandedOver("pair", r, {"s1", "s2"}, "aws spot instance-action", want, {"checkpoint"},
                   kSpotNodes - 1);
  const std::vector<SupervisionEvent> jit =
      FindEvents(Events("pair"), "handover_checkpoint", {{"node", "s1 s2"}});
  ASSERT_EQ(jit.size(), 1u) << EventLogText("pair");
  const std::string step = jit[0].Field("step");
  EXPECT_EQ(FindEvents(Events("pair"), "checkpoint_committed", {{"step", step}}).size(), 1u)
      << EventLogText("pair");
  EXPECT_EQ(FindEvents(Events("pair"), "generation", {{"trigger", "drain"}, {"step", step}}).size(),
            1u)
      << "the generation starts from the step the checkpoint holds\n"
      << EventLogText("pair");
}

// Notices that come together (a cloud reclaims in batches) leave at one step boundary: one
// re-plan, not one per node. s1's and s3's ranks are not each other's buddies: from memory.
TEST_F(SpotHandoverTest, NoticesThatComeTogetherLeaveAtOneStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("gce");
  JobRun r = RunNoticed("batch", c, [&] {
    c.metadata[1]->Preempt();
    c.metadata[3]->Preempt();
  });
  ExpectHandedOver("batch", r, {"s1", "s3"}, "gce instance/preempted TRUE", want,
                   {"owners", "mirrors"}, kSpotNodes - 1);
  EXPECT_TRUE(FindEvents(Events("batch"), "handover_checkpoint").empty()) << EventLogText("batch");
}

// The on-demand node that hosts the coordinator (and a rank) gets a notice (SIGTERM): the
// coordinator moves first — it stops at a step boundary with its record saved and the job
// supervisor restarts it on a spot node — and the restarted one hands the node's rank over.
TEST_F(SpotHandoverTest, ANoticeOnTheCoordinatorsNodeMovesTheCoordinatorFirst) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("sigterm");
  JobRun r = RunNoticed("coord", c, [&] { kill(c.local->nodes().at("od"), SIGTERM); });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<SupervisionEvent> events = Events("coord");
  const std::vector<SupervisionEvent> moving =
      FindEvents(events, "coordinator_moving", {{"node", "od"}});
  ASSERT_EQ(moving.size(), 1u) << EventLogText("coord");
  const std::string step = moving[0].Field("step");
  EXPECT_EQ(FindEvents(events, "coordinator_restarted", {{"step", step}}).size(), 1u)
      << EventLogText("coord");
  const std::vector<SupervisionEvent> gens = FindEvents(events, "generation", {{"step", step}});
  ASSERT_FALSE(gens.empty()) << EventLogText("coord");
  EXPECT_EQ(gens.back().Field("world"), absl::StrCat(kSpotNodes)) << EventLogText("coord");
  EXPECT_EQ(gens.back().Field("workers").find("od/"), std::string::npos) << EventLogText("coord");
  EXPECT_TRUE(gens.back().Field("source") == "owners" || gens.back().Field("source") == "mirrors")
      << EventLogText("coord");
  EXPECT_EQ(r.report.steps_lost, 0) << r.output;
  EXPECT_EQ(r.report.crc, want) << r.output;
  ExpectExactlyOnce("coord");
}

// Every node noticed (no on-demand node): the committed step is checkpointed and `troupe train`
// exits 75 (preempted); run again (here on the embedded cluster), it resumes from that step.
TEST_F(SpotHandoverTest, EveryNodeNoticedCheckpointsExitsAndTheSameCommandResumesBitIdentical) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("aws", 3, /*on_demand=*/false);
  JobRun r = RunNoticed("all", c, [&] {
    for (auto& m : c.metadata) m->Preempt();
  });
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("preempted: every worker got a preemption notice at step"),
            std::string::npos)
      << r.output;
  const std::vector<SupervisionEvent> stopped = FindEvents(Events("all"), "preempted");
  ASSERT_EQ(stopped.size(), 1u) << EventLogText("all");
  EXPECT_EQ(stopped[0].Field("checkpoint_saved"), "true") << EventLogText("all");
  const std::string step = stopped[0].Field("step");
  EXPECT_GE(std::stoi(step), kNoticeStep);
  EXPECT_EQ(FindEvents(Events("all"), "checkpoint_committed", {{"step", step}}).size(), 1u)
      << EventLogText("all");
  ExpectExactlyOnce("all", std::stoi(step));  // the new run starts its records afresh

  JobRun again = Train("all", {"--workers", "3"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(
      FindEvents(Events("all"), "generation", {{"source", "checkpoint"}, {"step", step}}).size(),
      1u)
      << EventLogText("all");
  EXPECT_EQ(again.report.steps_lost, 0) << again.output;
  EXPECT_EQ(again.report.crc, want) << again.output;
}

// A training job through its head's loss (a head with a store; the test restarts it as systemd or
// a Kubernetes Deployment would). Its members keep running meanwhile and rejoin the new head:
// the driver, the coordinator, every node agent and worker.
class HeadFailoverTest : public SpotJobTest {
 protected:
  HeadFailoverTest() { head_store_ = true; }

  // The membership table as "id kind state pid" lines, sorted (the head's order).
  static std::string Members(const std::string& head) {
    troupe::runtime::RuntimeOptions ro;
    ro.network = true;
    ro.log_events = false;
    auto rt = troupe::runtime::Runtime::Create(troupe::runtime::ActorRegistry{}, ro);
    if (!rt.ok()) return rt.status().ToString();
    auto hp = troupe::runtime::ParseHostPort(head);
    auto client = troupe::runtime::ClusterClient::Connect(**rt, hp->first, hp->second);
    if (!client.ok()) return client.status().ToString();
    auto members = client->Members();
    if (!members.ok()) return members.status().ToString();
    std::string out;
    for (const troupe::runtime::MemberInfo& m : *members) {
      absl::StrAppend(&out, m.id, " ", Name(m.kind), " ", Name(m.state), " pid ", m.pid, "\n");
    }
    return out;
  }
};

// kill -9 of the head in the middle of a job; a head started again on its address (from its
// store) 0.5 s later. The job finishes with no step lost and the fault-free run's weights; every
// node and worker is a member again, the same processes as before (same pids: nothing was
// restarted).
TEST_F(HeadFailoverTest, KillDashNineOfTheHeadMidJobLosesNoStepAndEveryMemberRejoins) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("sigterm");
  ASSERT_NE(c.local, nullptr);
  const std::string before = Members(c.head);
  JobRun r = RunNoticed("headkill", c, [&] {
    const pid_t head = c.local->head_pid();
    ASSERT_EQ(kill(head, SIGKILL), 0);
    std::this_thread::sleep_for(milliseconds(500));
    ASSERT_TRUE(c.local->RestartHead().ok());
  });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report.steps, steps_) << r.output;
  EXPECT_LE(r.report.steps_lost, 1) << r.output;
  EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
  const std::vector<SupervisionEvent> events = Events("headkill");
  ASSERT_EQ(FindEvents(events, "head_lost").size(), 1u) << EventLogText("headkill");
  const std::vector<SupervisionEvent> back = FindEvents(events, "head_back");
  ASSERT_EQ(back.size(), 1u) << EventLogText("headkill");
  EXPECT_EQ(FindEvents(events, "lease_lost").size(), 0u) << EventLogText("headkill");
  EXPECT_EQ(FindEvents(events, "coordinator_restarted").size(), 0u) << EventLogText("headkill");
  ExpectExactlyOnce("headkill");
  const std::string after = Members(c.head);
  EXPECT_EQ(after, before) << "membership before the head's loss:\n"
                           << before << "after:\n"
                           << after;
  std::cout << "membership before the head's loss:\n"
            << before << "after (the restarted head's table):\n"
            << after << "head back after " << back[0].Field("after_ms") << " ms" << std::endl;
}

// The head killed and not replaced: the job waits its --head_grace (3 s) for one, then fails
// naming the head — not at once, and not after the job's silence limit.
TEST_F(HeadFailoverTest, AJobWhoseHeadIsGoneLongerThanItsGraceFailsNamingIt) {
  SpotCluster c = StartCluster("sigterm", 2, false);
  ASSERT_NE(c.local, nullptr);
  const std::string dir = base_ + "/gone";
  const pid_t pid = Start(dir, {"--head", c.head, "--head_grace", "3s"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Commits(dir) < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_GE(Commits(dir), 3) << Slurp(dir + "/out.txt");
  ASSERT_EQ(kill(c.local->head_pid(), SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(milliseconds(2000));
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), 0) << "the job ended within 2 s of its head's loss\n"
                                               << Slurp(dir + "/out.txt");
  const int rc = Wait(pid, milliseconds(30000));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = Slurp(dir + "/out.txt");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("lost the cluster's head at " + c.head + " and no head took over within 3s"),
            std::string::npos)
      << out;
  EXPECT_GE(s, 3.0) << out;
  EXPECT_LT(s, 10.0) << "exited " << s << " s after the head was killed\n" << out;
}

std::string LastLine(const std::string& text) {
  const size_t end = text.find_last_not_of('\n');
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end - begin);
}

// `troupe sim spot --measure`: the trace run for real on a local cluster of node agents (each
// notice a SIGTERM to its node), calibrated on fault-free runs, and compared with its prediction.
TEST(SimSpotMeasureTest, TheTraceRunForRealIsComparedWithItsPrediction) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("troupe_sim_measure_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/trace.toml") << R"([job]
steps = 120
max_workers = 3
[cluster]
on_demand = 1
spot = 2
[timing]
replan_s = 0.1
join_s = 1.0
[[zone]]
name = "a"
spot_price_per_h = 1.0
on_demand_price_per_h = 3.0
notice_s = 1.0
replace_s = 1.0
[[preemption]]
at_s = 0.3
machine = "s1"
)";
  const std::string cmd = std::string("timeout 240 ") + TROUPE_BINARY + " sim spot --trace " + dir +
                          "/trace.toml --measure --calibration_steps 20 --work_dir " + dir +
                          "/runs >" + dir + "/out.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = Slurp(dir + "/out.txt");
  ASSERT_EQ(rc, 0) << out;
  for (int w = 1; w <= 3; ++w) {
    EXPECT_NE(out.find("calibration: world " + std::to_string(w) + ": "), std::string::npos) << out;
  }
  EXPECT_NE(out.find("measured (od=1 spot=2, this machine): goodput "), std::string::npos) << out;
  EXPECT_TRUE(std::regex_match(
      LastLine(out), std::regex("summary: goodput_steps_per_h=[0-9]+ cost_per_1k_steps=[0-9.]+ "
                                "predicted_err_pct=[0-9]+\\.[0-9]")))
      << out;
  // The measured run's own log: s1 got its notice (SIGTERM) and was handed over.
  std::ifstream events(dir + "/runs/run/logs/events.log");
  std::string line, all;
  bool drained = false;
  while (std::getline(events, line)) {
    all += line + "\n";
    drained |= line.find("event=generation") != std::string::npos &&
               line.find("trigger=drain") != std::string::npos &&
               line.find("node=s1") != std::string::npos;
  }
  EXPECT_TRUE(drained) << all;
  if (!HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
