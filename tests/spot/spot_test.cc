// Spot lifecycle end to end (issue 17). A cluster of real processes — a head, spot node agents
// (one worker each) and an on-demand node for the coordinator — each spot node watching its own
// cloud's metadata server (a FakeMetadataServer: real HTTP on loopback, AWS IMDSv2 or GCE) or
// SIGTERM; a `troupe train --head` job runs on it, and the test gives the notice once the job has
// committed a few steps. Final weights are compared with a fault-free embedded run's CRC32C.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "job_harness.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/fake_metadata.h"

namespace {

using std::chrono::milliseconds;
using troupe::runtime::LocalCluster;
using troupe::runtime::testing::FakeMetadataServer;
using troupe::testing::FindEvents;
using troupe::testing::JobRun;
using troupe::testing::ReadReport;
using troupe::testing::Slurp;
using troupe::testing::SupervisionEvent;

constexpr int kSpotNodes = 4;
constexpr int kNoticeStep = 6;  // the notice comes once this many steps are committed

struct SpotCluster {
  std::unique_ptr<LocalCluster> local;
  std::vector<std::unique_ptr<FakeMetadataServer>> metadata;  // node s<i>'s cloud
  std::string head;                                           // HOST:PORT
};

class SpotJobTest : public troupe::testing::JobTest {
 protected:
  // Spot nodes s0..s<n-1> watching `source` ("aws", "gce": each its own metadata server;
  // "sigterm"), and the on-demand node "od"; returns once every worker is alive.
  SpotCluster StartCluster(const std::string& source, int spot_nodes = kSpotNodes) {
    SpotCluster c;
    LocalCluster::Options o;
    o.binary = TROUPE_BINARY;
    o.workers = 0;
    o.cluster.log_dir = base_ + "/cluster";
    auto local = LocalCluster::Start(o);
    EXPECT_TRUE(local.ok()) << local.status();
    if (!local.ok()) return c;
    c.local = std::move(*local);
    c.head = absl::StrCat("127.0.0.1:", c.local->port());
    for (int i = 0; i < spot_nodes; ++i) {
      std::vector<std::string> args = {"--grace",           "5s",  "--preemption_source", source,
                                       "--preemption_poll", "50ms"};
      if (source == "aws" || source == "gce") {
        c.metadata.push_back(std::make_unique<FakeMetadataServer>());
        args.insert(args.end(), {"--metadata_endpoint", c.metadata.back()->endpoint()});
      }
      EXPECT_TRUE(c.local->AddNode(absl::StrCat("s", i), 1, "cpu=1", "spot=true", args).ok());
    }
    EXPECT_TRUE(c.local->AddNode("od", 1, "cpu=1", "", {"--grace", "5s"}).ok());
    const std::string wait = absl::StrCat(TROUPE_BINARY, " status --head ", c.head,
                                          " --wait_workers ", spot_nodes + 1, " >/dev/null 2>&1");
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
    JobRun r;
    r.exit_code = Wait(pid, milliseconds(240000));
    r.output = Slurp(dir + "/out.txt");
    r.report = ReadReport(dir + "/report");
    return r;
  }

  // Node `node` was noticed (its drain names `notice`) and left at a step boundary: the next
  // generation restored its state from the survivors' memory (no checkpoint read), nothing was
  // lost, and the weights are the fault-free run's.
  void ExpectHandedOver(const std::string& name, const JobRun& r, const std::string& node,
                        const std::string& notice, const std::string& want) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<SupervisionEvent> events = Events(name);
    const std::vector<SupervisionEvent> drains = FindEvents(events, "drain", {{"node", node}});
    ASSERT_EQ(drains.size(), 1u) << EventLogText(name);
    EXPECT_NE(drains[0].reason.find(notice), std::string::npos) << EventLogText(name);
    const std::vector<SupervisionEvent> gens =
        FindEvents(events, "generation", {{"trigger", "drain"}, {"node", node}});
    ASSERT_EQ(gens.size(), 1u) << EventLogText(name);
    EXPECT_GE(std::stoi(gens[0].Field("step")), kNoticeStep);
    EXPECT_NE(gens[0].Field("source"), "checkpoint") << EventLogText(name);
    EXPECT_NE(gens[0].Field("source"), "seed") << EventLogText(name);
    EXPECT_EQ(gens[0].Field("steps_lost"), "0");
    EXPECT_EQ(gens[0].Field("world"), absl::StrCat(kSpotNodes)) << "the on-demand node's rank too";
    EXPECT_EQ(r.report.steps_lost, 0) << r.output;
    EXPECT_EQ(r.report.world, kSpotNodes) << r.output;
    EXPECT_EQ(r.report.crc, want) << "final weights differ from the fault-free run\n" << r.output;
    ExpectExactlyOnce(name);
  }
};

class SpotNoticeTest : public SpotJobTest {};

TEST_F(SpotNoticeTest, AwsInstanceActionHandsTheNodeOverAtTheNextStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("aws");
  ASSERT_EQ(c.metadata.size(), static_cast<size_t>(kSpotNodes));
  JobRun r = RunNoticed("aws", c, [&] { c.metadata[1]->Preempt(std::chrono::seconds(120)); });
  ExpectHandedOver("aws", r, "s1", "aws spot instance-action terminate at 20", want);
  EXPECT_GE(c.metadata[1]->token_requests(), 1);
}

TEST_F(SpotNoticeTest, GcePreemptedHandsTheNodeOverAtTheNextStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("gce");
  ASSERT_EQ(c.metadata.size(), static_cast<size_t>(kSpotNodes));
  JobRun r = RunNoticed("gce", c, [&] { c.metadata[2]->Preempt(); });
  ExpectHandedOver("gce", r, "s2", "gce instance/preempted TRUE", want);
}

TEST_F(SpotNoticeTest, SigtermFromOutsideHandsTheNodeOverAtTheNextStepBoundary) {
  const std::string want = Reference();
  SpotCluster c = StartCluster("sigterm");
  // As Kubernetes does at a pod's deletion: SIGTERM to the agent, then its grace period.
  JobRun r = RunNoticed("sigterm", c, [&] { kill(c.local->nodes().at("s3"), SIGTERM); });
  ExpectHandedOver("sigterm", r, "s3", "SIGTERM", want);
}

}  // namespace
