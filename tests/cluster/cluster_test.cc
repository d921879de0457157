// A head, node agents and workers as real processes on loopback (distinct PIDs): remote spawn,
// failure detection (kill -9, SIGSTOP, a hung handler), membership generations, build-id
// refusal, preemption drain, and no orphans when a node agent dies.
#include "troupe/runtime/cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "caf/all.hpp"
#include "troupe/runtime/local_etcd.h"
#include "troupe/runtime/processes.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {
namespace {

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using pid_atom = caf::atom_constant<caf::atom("pid")>;
using hang_atom = caf::atom_constant<caf::atom("hang")>;
using gpus_atom = caf::atom_constant<caf::atom("gpus")>;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using troupe::runtime::testing::LocalEtcd;

struct Seen {
  MembershipEvent event;
  Clock::time_point at;
};

class Events {
 public:
  void Add(const MembershipEvent& e) {
    std::lock_guard<std::mutex> l(mu_);
    seen_.push_back({e, Clock::now()});
    cv_.notify_all();
  }
  // The first event (since the last wait) matching `pred`, or nullopt after `timeout`.
  std::optional<Seen> WaitFor(const std::function<bool(const MembershipEvent&)>& pred,
                              milliseconds timeout = milliseconds(10000)) {
    std::unique_lock<std::mutex> l(mu_);
    std::optional<Seen> found;
    cv_.wait_for(l, timeout, [&] {
      for (const auto& s : seen_) {
        if (pred(s.event)) {
          found = s;
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Seen> seen_;
};

bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Live processes whose command line contains `needle`.
std::vector<pid_t> LiveProcessesWith(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(needle) != std::string::npos && ProcessAlive(pid)) out.push_back(pid);
  }
  closedir(d);
  return out;
}

class ClusterTest : public ::testing::Test {
 protected:
  // A suite's own cluster options, before the cluster starts.
  virtual void Configure(LocalCluster::Options&) {}

  void SetUp() override {
    LocalCluster::Options o;
    o.binary = TROUPE_CLUSTER_APP;
    o.workers = 0;
    o.cluster.heartbeat_interval = milliseconds(50);
    o.cluster.heartbeat_timeout = milliseconds(500);
    o.cluster.hung_timeout = milliseconds(500);
    // One directory per test: CTest runs two at once, and each has its node-a/w0 (one shared
    // directory once let a test's worker truncate another's stderr before it was read).
    o.cluster.log_dir = std::string("/tmp/troupe-cluster-test-logs/") +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    Configure(o);
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    StartClient();
  }

  // This test's own runtime, and a client of the head at the cluster's port.
  void StartClient() {
    if (rt_) caf::anon_send_exit(listener_, caf::exit_reason::kill);
    client_.reset();
    rt_.reset();
    RuntimeOptions ro;
    ro.network = true;
    ro.log_events = true;
    // A runtime whose head died has remote actors it cannot stop: do not wait long for them.
    ro.shutdown_timeout = std::chrono::seconds(1);
    ActorRegistry reg;
    (void)reg.Register<>(
        "echo", [](Actor*) { return caf::behavior{[](echo_atom, int64_t x) { return x; }}; });
    auto rt = Runtime::Create(std::move(reg), ro);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::move(*rt);
    auto client = ClusterClient::Connect(*rt_, "127.0.0.1", cluster_->port(),
                                         std::chrono::seconds(10), std::chrono::seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    client_.emplace(*client);
    // (An argument, because CAF 0.17 dereferences a null pointer when spawning a function
    // actor without any, which UBSan reports.)
    listener_ = rt_->system().spawn(
        [](caf::event_based_actor*, Events* events) -> caf::behavior {
          return {[events](membership_atom, const MembershipEvent& e) { events->Add(e); }};
        },
        &events_);
    client_->Subscribe(listener_);
  }

  void TearDown() override {
    if (rt_) caf::anon_send_exit(listener_, caf::exit_reason::kill);
    client_.reset();
    rt_.reset();
    cluster_.reset();
  }

  void StartNode(const std::string& name, int workers, std::vector<std::string> extra = {}) {
    ASSERT_TRUE(cluster_->AddNode(name, workers, "cpu=2", "zone=a", extra).ok());
    for (int i = 0; i < workers; ++i) {
      std::string id = name + "/w" + std::to_string(i);
      ASSERT_TRUE(events_.WaitFor([&](auto& e) {
        return e.kind == MembershipKind::kWorkerAlive && e.subject == id;
      })) << "worker "
          << id << " did not join";
    }
  }

  MemberInfo Member(const std::string& id) {
    auto members = client_->Members();
    EXPECT_TRUE(members.ok()) << members.status();
    for (const auto& m : members.value_or(std::vector<MemberInfo>{}))
      if (m.id == id) return m;
    return {};
  }

  int64_t Ask(const caf::actor& a, int64_t x) {
    caf::scoped_actor self{rt_->system()};
    int64_t out = -1;
    self->request(a, std::chrono::seconds(5), echo_atom::value, x)
        .receive([&](int64_t y) { out = y; }, [](caf::error&) {});
    return out;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Runtime> rt_;
  std::optional<ClusterClient> client_;
  caf::actor listener_;
  Events events_;
};

// Each worker gets its share of its node's GPUs in CUDA_VISIBLE_DEVICES: ids from the agent's own
// CUDA_VISIBLE_DEVICES where it has one (SLURM, a device plugin, the embedded cluster), else from
// 0.
TEST_F(ClusterTest, WorkersGetTheirShareOfTheNodesGpus) {
  ASSERT_TRUE(
      cluster_->AddNode("given", 2, "cpu=2,gpu=4", "", {}, {{"CUDA_VISIBLE_DEVICES", "3,5,6,7"}})
          .ok());
  ASSERT_TRUE(cluster_->AddNode("counted", 2, "cpu=2,gpu=2").ok());
  ASSERT_TRUE(cluster_->AddNode("none", 1, "cpu=1").ok());
  const std::map<std::string, std::string> want = {{"given/w0", "3,5"},
                                                   {"given/w1", "6,7"},
                                                   {"counted/w0", "0"},
                                                   {"counted/w1", "1"},
                                                   {"none/w0", ""}};
  for (const auto& [worker, gpus] : want) {
    ASSERT_TRUE(events_.WaitFor([&](auto& e) {
      return e.kind == MembershipKind::kWorkerAlive && e.subject == worker;
    })) << "worker "
        << worker << " did not join";
    Placement at;
    at.worker = worker;
    auto ref = client_->Spawn("echo", caf::make_message(),
                              "gpus-" + absl::StrReplaceAll(worker, {{"/", "-"}}), at);
    ASSERT_TRUE(ref.ok()) << ref.status();
    caf::scoped_actor self{rt_->system()};
    std::string got = "<no answer>";
    self->request(ref->handle, std::chrono::seconds(5), gpus_atom::value)
        .receive([&](const std::string& v) { got = v; }, [](caf::error&) {});
    EXPECT_EQ(got, gpus) << worker;
  }
}

TEST_F(ClusterTest, RemoteSpawnOnDistinctProcesses) {
  StartNode("node-a", 2);
  StartNode("node-b", 2);
  std::set<int64_t> pids = {getpid(), cluster_->head_pid()};
  for (auto& [n, pid] : cluster_->nodes()) pids.insert(pid);
  int workers = 0;
  auto members = client_->Members();
  ASSERT_TRUE(members.ok()) << members.status();
  for (const auto& m : *members) {
    if (m.kind != MemberKind::kWorker) continue;
    ++workers;
    EXPECT_EQ(m.state, MemberState::kAlive);
    EXPECT_TRUE(pids.insert(m.pid).second) << "pid " << m.pid << " is not distinct";
  }
  EXPECT_EQ(workers, 4);
  EXPECT_EQ(pids.size(), 8u);  // test, head, 2 node agents, 4 workers
  for (const char* node : {"node-a", "node-b"}) {
    auto ref = client_->Spawn("echo", caf::make_message(), std::string("echo-") + node,
                              std::string("node=") + node);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(Ask(ref->handle, 41), 41);
    auto where = client_->WhereIs(std::string("echo-") + node);
    ASSERT_TRUE(where.ok());
    EXPECT_EQ(where->rfind(std::string(node) + "/w", 0), 0u) << *where;
  }
  auto bad = client_->Spawn("echo", {}, "x", "node=nowhere");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(bad.status().message(),
            "unschedulable (no node could ever fit): x needs nothing; none of the 2 alive nodes "
            "satisfies: troupe.node in {nowhere}")
      << bad.status();
  auto unknown = client_->Spawn("no-such-type", {}, "y");
  EXPECT_NE(unknown.status().message().find("unknown actor type 'no-such-type'"), std::string::npos)
      << unknown.status();
}

TEST_F(ClusterTest, SchedulerExplainsUnschedulableAndSpreadsStrictGroups) {
  StartNode("node-a", 1);
  StartNode("node-b", 1);
  Placement gpu;
  gpu.resources = "gpu=1";
  auto r = client_->Spawn("echo", {}, "needs-gpu", gpu);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("needs-gpu needs resource 'gpu', which no node has"),
            std::string::npos)
      << r.status();
  std::cout << "gpu=1 on a CPU-only cluster: " << r.status().message() << std::endl;
  auto nodes =
      client_->CreatePlacementGroup("pair", {"cpu=1", "cpu=1"}, GroupStrategy::kStrictSpread);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_NE((*nodes)[0], (*nodes)[1]);
  // Actors inside the group's bundles land on the bundles' nodes.
  for (int b = 0; b < 2; ++b) {
    Placement in_bundle;
    in_bundle.group = "pair";
    in_bundle.bundle = b;
    in_bundle.resources = "cpu=1";
    std::string name = "member-" + std::to_string(b);
    ASSERT_TRUE(client_->Spawn("echo", {}, name, in_bundle).ok());
    EXPECT_EQ(client_->WhereIs(name)->rfind((*nodes)[b] + "/w", 0), 0u);
  }
  auto three = client_->CreatePlacementGroup("trio", {"cpu=1", "cpu=1", "cpu=1"},
                                             GroupStrategy::kStrictSpread);
  EXPECT_FALSE(three.ok()) << "3 strictly spread bundles cannot fit on 2 nodes";
  std::cout << "strict_spread of 3 on 2 nodes: " << three.status().message() << std::endl;
  // A resource request the cluster can hold, but not now: waiting may help.
  Placement cpu2;
  cpu2.resources = "cpu=2";
  auto busy = client_->Spawn("echo", {}, "big", cpu2);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kResourceExhausted) << busy.status();
}

int64_t CallValue(const absl::StatusOr<caf::message>& reply) {
  return reply.ok() && reply->match_elements<int64_t>() ? reply->get_as<int64_t>(0) : -1;
}

// Runtime::Call on an ActorRef from the head goes over the hosting worker's direct channel, which
// the head hands out with the ref: it works with the ref's CAF handle cleared, so nothing else
// carried it.
TEST_F(ClusterTest, CallsThroughAnActorRefUseItsWorkersDirectChannel) {
  StartNode("node-a", 1);
  auto ref = client_->Spawn("echo", caf::make_message(), "echo-direct");
  ASSERT_TRUE(ref.ok()) << ref.status();
  MemberInfo w = Member("node-a/w0");
  ASSERT_GT(w.direct_port, 0);
  EXPECT_EQ(ref->direct, absl::StrCat(w.address, ":", w.direct_port));
  EXPECT_EQ(CallValue(rt_->Call(*ref, caf::make_message(echo_atom::value, int64_t{41}))), 41);
  ActorRef bare = *ref;
  bare.handle = caf::actor{};
  EXPECT_EQ(CallValue(rt_->Call(bare, caf::make_message(echo_atom::value, int64_t{42}))), 42);
  auto looked_up = client_->Lookup("echo-direct");
  ASSERT_TRUE(looked_up.ok()) << looked_up.status();
  EXPECT_EQ(looked_up->direct, ref->direct);
  EXPECT_EQ(looked_up->generation, ref->generation);
  // The actor's own error keeps its code; a message it does not handle is refused, not hung on.
  auto unhandled = rt_->Call(*ref, caf::make_message(std::string("what?")));
  EXPECT_FALSE(unhandled.ok());
  EXPECT_NE(unhandled.status().code(), absl::StatusCode::kUnavailable) << unhandled.status();
  // Calls from several threads at once each get their own reply.
  std::vector<std::thread> callers;
  std::atomic<int> right{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int64_t i = 0; i < 200; ++i) {
        int64_t x = t * 1000 + i;
        if (CallValue(rt_->Call(*ref, caf::make_message(echo_atom::value, x))) == x) ++right;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(right.load(), 800);
}

// A ref names one incarnation: once the name is spawned again, a call through the old ref fails
// with NotFound at once (it does not reach the new one), and the name's new ref is called.
TEST_F(ClusterTest, ACallThroughARefToAReplacedIncarnationIsNotFound) {
  StartNode("node-a", 1);
  auto first = client_->Spawn("echo", caf::make_message(), "echo-gen", "worker=node-a/w0");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(CallValue(rt_->Call(*first, caf::make_message(echo_atom::value, int64_t{1}))), 1);
  auto second = client_->Spawn("echo", caf::make_message(), "echo-gen", "worker=node-a/w0");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_NE(second->generation, first->generation);
  auto start = Clock::now();
  auto stale = rt_->Call(*first, caf::make_message(echo_atom::value, int64_t{2}));
  EXPECT_TRUE(absl::IsNotFound(stale.status())) << stale.status();
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_EQ(CallValue(rt_->Call(*second, caf::make_message(echo_atom::value, int64_t{3}))), 3);
  auto again = client_->Lookup("echo-gen");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(CallValue(rt_->Call(*again, caf::make_message(echo_atom::value, int64_t{4}))), 4);
}

// A worker killed with -9 fails the next call through its actor's ref with Unavailable well
// within the call's deadline (the connection is reset; nothing waits it out).
TEST_F(ClusterTest, ACallToAKilledWorkersActorFailsFastWithUnavailable) {
  StartNode("node-a", 1);
  auto ref = client_->Spawn("echo", caf::make_message(), "echo-doomed");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(CallValue(rt_->Call(*ref, caf::make_message(echo_atom::value, int64_t{5}))), 5);
  pid_t victim = static_cast<pid_t>(Member("node-a/w0").pid);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto start = Clock::now();
  auto dead =
      rt_->Call(*ref, caf::make_message(echo_atom::value, int64_t{6}), std::chrono::seconds(10));
  auto took = Clock::now() - start;
  EXPECT_TRUE(absl::IsUnavailable(dead.status())) << dead.status();
  EXPECT_LT(took, milliseconds(1000));
  auto again =
      rt_->Call(*ref, caf::make_message(echo_atom::value, int64_t{7}), std::chrono::seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(again.status())) << again.status();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

// Found by `troupe chaos run` (a coordinator restarted onto a worker killed 30 ms later waited
// the 10 s spawn timeout): a spawn the head forwarded to a worker that dies before answering
// fails as soon as the head declares that worker dead, naming it.
TEST_F(ClusterTest, ASpawnOnAWorkerThatDiesFailsAtItsDeathNotAtTheSpawnTimeout) {
  StartNode("node-a", 1);
  const pid_t victim = static_cast<pid_t>(Member("node-a/w0").pid);
  ASSERT_GT(victim, 0);
  // It never answers (every thread stopped before the spawn is sent); missed heartbeats fence it
  // (500 ms).
  ASSERT_TRUE(testing::StopAndWait(victim));
  const auto start = Clock::now();
  auto ref = client_->Spawn("echo", caf::make_message(), "doomed", "node=node-a");
  const auto took = Clock::now() - start;
  kill(victim, SIGKILL);
  ASSERT_FALSE(ref.ok());
  EXPECT_EQ(ref.status().code(), absl::StatusCode::kUnavailable) << ref.status();
  EXPECT_NE(ref.status().message().find("died while spawning"), std::string::npos) << ref.status();
  EXPECT_LT(took, milliseconds(5000)) << "the spawn timeout is 10 s";
}

TEST_F(ClusterTest, KillDashNineGivesDownEventWithSignalAndStderrAndRestartElsewhere) {
  StartNode("node-a", 2);
  StartNode("node-b", 2);
  SupervisorSpec spec{"svc-sup", Strategy::kOneForOne, /*intensity=*/{}, /*children=*/{}};
  ChildSpec child = ChildSpec::Actor("svc", "echo");
  child.placement = Placement{};
  child.backoff.initial = milliseconds(1);
  spec.children.push_back(child);
  ASSERT_TRUE(rt_->StartSupervisor(spec).ok());
  std::string before;
  for (int i = 0; i < 500 && before.empty(); ++i) {
    if (auto w = client_->WhereIs("svc"); w.ok())
      before = *w;
    else
      std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_FALSE(before.empty()) << "svc was never placed";
  pid_t victim = static_cast<pid_t>(Member(before).pid);
  ASSERT_GT(victim, 0);
  // A worker is placeable as soon as the head registered it, a moment before it writes its
  // "joined" line; the stderr tail checked below must have that line to carry.
  const std::string err_log =
      cluster_->LogDir() + "/" + absl::StrReplaceAll(before, {{"/w", "-w"}}) + ".err";
  for (int i = 0; i < 500; ++i) {
    std::ifstream in(err_log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("joined") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(2));
  }
  auto killed_at = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto down = events_.WaitFor(
      [&](auto& e) { return e.kind == MembershipKind::kWorkerDown && e.subject == before; });
  ASSERT_TRUE(down) << "no down event for " << before;
  auto latency = std::chrono::duration_cast<milliseconds>(down->at - killed_at).count();
  std::cout << "kill -9 -> worker_down: " << latency << " ms" << std::endl;
  EXPECT_NE(down->event.detail.find("killed by signal 9"), std::string::npos)
      << down->event.DebugString();
  EXPECT_NE(down->event.stderr_tail.find("joined"), std::string::npos) << down->event.DebugString();
  EXPECT_EQ(down->event.pid, victim);
  EXPECT_LT(latency, 2000);
  std::string after;
  for (int i = 0; i < 500; ++i) {
    if (auto w = client_->WhereIs("svc"); w.ok() && *w != before) {
      after = *w;
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_FALSE(after.empty()) << "svc was not restarted on another worker";
  auto ref = client_->Lookup("svc");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(Ask(ref->handle, 7), 7);
}

TEST_F(ClusterTest, StoppedWorkerIsDeclaredDeadAfterHeartbeatTimeoutAndFenced) {
  StartNode("node-a", 1);
  pid_t pid = static_cast<pid_t>(Member("node-a/w0").pid);
  ASSERT_GT(pid, 0);
  auto stopped_at = Clock::now();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  auto down = events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kWorkerDown && e.subject == "node-a/w0"; });
  ASSERT_TRUE(down);
  auto ms = std::chrono::duration_cast<milliseconds>(down->at - stopped_at).count();
  std::cout << "SIGSTOP -> dead verdict: " << ms << " ms (timeout 500 ms, interval 50 ms)"
            << std::endl;
  EXPECT_NE(down->event.detail.find("no heartbeat"), std::string::npos)
      << down->event.DebugString();
  EXPECT_GE(ms, 450);
  EXPECT_LT(ms, 1500);
  for (int i = 0; i < 200 && ProcessAlive(pid); ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(ProcessAlive(pid)) << "the stopped worker was not fenced";
}

TEST_F(ClusterTest, ActorStuckInHandlerIsReportedHung) {
  StartNode("node-a", 1);
  auto ref = client_->Spawn("echo", {}, "stuck");
  ASSERT_TRUE(ref.ok()) << ref.status();
  caf::anon_send(ref->handle, hang_atom::value);
  auto hung = events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kActorHung && e.subject == "stuck"; });
  ASSERT_TRUE(hung);
  EXPECT_NE(hung->event.detail.find("on worker node-a/w0"), std::string::npos);
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(Member("node-a/w0").state, MemberState::kAlive)
      << "its process still answers heartbeats";
}

TEST_F(ClusterTest, NodeThatLeavesAndRejoinsBumpsGenerationTwice) {
  StartNode("node-c", 0);
  ASSERT_TRUE(events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kNodeAlive && e.subject == "node-c"; }));
  uint64_t g0 = *client_->Generation();
  cluster_->SignalNode("node-c", SIGKILL);
  ASSERT_TRUE(events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kNodeDead && e.subject == "node-c"; }));
  StartNode("node-c", 0);
  ASSERT_TRUE(events_.WaitFor([&](auto& e) {
    return e.kind == MembershipKind::kNodeAlive && e.subject == "node-c" && e.generation > g0;
  }));
  EXPECT_EQ(*client_->Generation(), g0 + 2);
  EXPECT_EQ(Member("node-c").state, MemberState::kAlive);
}

TEST_F(ClusterTest, NodeWithAnotherBuildIdIsRefused) {
  auto pid = cluster_->AddNode("node-x", 0, "cpu=1", "", {"--build_id", "bogus"});
  ASSERT_TRUE(pid.ok());
  auto refused = events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kRefused && e.subject == "node-x"; });
  ASSERT_TRUE(refused);
  EXPECT_NE(refused->event.detail.find("build id bogus differs from the head's"), std::string::npos)
      << refused->event.DebugString();
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3);
  EXPECT_EQ(Member("node-x").id, "") << "a refused node is never a member";
}

// The join handshake's first message carries the protocol version: a member of another version is
// refused, both versions named, before it can register.
TEST_F(ClusterTest, AMemberOfAnotherProtocolVersionIsRefusedNamingBothVersions) {
  caf::scoped_actor self{rt_->system()};
  absl::Status refusal;
  self->request(client_->head(), std::chrono::seconds(10), cluster_hello_atom::value,
                kClusterProtocolVersion + 1, BuildId(), std::string("node"),
                std::string("node-future"))
      .receive([&](uint32_t) { refusal = absl::InternalError("accepted"); },
               [&](caf::error& e) { refusal = ErrorToStatus(e, "head"); });
  EXPECT_TRUE(absl::IsFailedPrecondition(refusal)) << refusal;
  EXPECT_NE(
      refusal.message().find(absl::StrCat("node 'node-future' refused: it speaks cluster "
                                          "protocol version ",
                                          kClusterProtocolVersion + 1,
                                          ", this head speaks version ", kClusterProtocolVersion)),
      std::string::npos)
      << refusal;
  auto refused = events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kRefused && e.subject == "node-future"; });
  ASSERT_TRUE(refused);
  EXPECT_EQ(Member("node-future").id, "") << "a refused node is never a member";
}

TEST_F(ClusterTest, SigtermDrainsNodeThenItLeavesAtTheDeadline) {
  StartNode("node-d", 1, {"--grace", "400ms"});
  auto sent = Clock::now();
  kill(cluster_->nodes().at("node-d"), SIGTERM);
  ASSERT_TRUE(events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kNodeDraining && e.subject == "node-d"; }));
  auto refused = client_->Spawn("echo", {}, "late", "node=node-d");
  EXPECT_FALSE(refused.ok()) << "a draining node takes no work";
  auto dead = events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kNodeDead && e.subject == "node-d"; });
  ASSERT_TRUE(dead);
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(dead->at - sent).count(), 380);
  EXPECT_TRUE(events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kWorkerDown && e.subject == "node-d/w0"; }));
}

TEST_F(ClusterTest, KillingNodeAgentLeavesNoWorkerBehind) {
  StartNode("node-e", 2);
  std::vector<pid_t> workers = {static_cast<pid_t>(Member("node-e/w0").pid),
                                static_cast<pid_t>(Member("node-e/w1").pid)};
  ASSERT_EQ(LiveProcessesWith("--node node-e").size(), 2u);
  cluster_->SignalNode("node-e", SIGKILL);
  // A process that is exiting loses its command line before it turns into a zombie (ASan's
  // shadow memory takes a while to unmap), so wait for both.
  auto any_left = [&] {
    if (!LiveProcessesWith("--node node-e").empty()) return true;
    for (pid_t p : workers) {
      if (ProcessAlive(p)) return true;
    }
    return false;
  };
  for (int i = 0; i < 500 && any_left(); ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(LiveProcessesWith("--node node-e").empty()) << "orphaned workers of node-e";
  for (pid_t p : workers) EXPECT_FALSE(ProcessAlive(p)) << p;
  EXPECT_TRUE(events_.WaitFor(
      [](auto& e) { return e.kind == MembershipKind::kNodeDead && e.subject == "node-e"; }));
}

// ---- a head that survives its own process (issue 17) --------------------------------------

// The head keeps its state in a store (SQLite) and is restarted on its port, as a supervisor
// would; node agents and workers keep running while they rejoin it.
class HeadFailoverTest : public ClusterTest {
 protected:
  void Configure(LocalCluster::Options& o) override { o.head_store = true; }

  // Alive members by id, with their pids, once `count` of them are (or what there is after 15 s).
  std::map<std::string, int64_t> AliveMembers(size_t count) {
    std::map<std::string, int64_t> out;
    const auto deadline = Clock::now() + std::chrono::seconds(15);
    do {
      out.clear();
      auto members = client_->Members();
      for (const auto& m : members.value_or(std::vector<MemberInfo>{})) {
        if (m.state == MemberState::kAlive) out[m.id] = m.pid;
      }
      if (out.size() >= count) break;
      std::this_thread::sleep_for(milliseconds(20));
    } while (Clock::now() < deadline);
    return out;
  }

 public:
  // `pid` once it has exited (its wait status in *status), or 0 after `timeout`.
  static pid_t WaitForExit(pid_t pid, int* status, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    pid_t done = 0;
    while ((done = waitpid(pid, status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return done;
  }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

TEST_F(HeadFailoverTest, AKilledHeadsSuccessorFindsEveryNodeWorkerAndNamedActorAgain) {
  StartNode("a", 2);
  StartNode("b", 1);
  uint64_t kept_generation = 0;
  {
    Placement at;
    at.worker = "a/w1";
    auto kept = client_->Spawn("echo", caf::make_message(), "kept", at);
    ASSERT_TRUE(kept.ok()) << kept.status();
    ASSERT_EQ(Ask(kept->handle, 7), 7);
    kept_generation = kept->generation;
  }
  const std::map<std::string, int64_t> before = AliveMembers(5);
  ASSERT_EQ(before.size(), 5u);
  const uint64_t generation_before = client_->Generation().value_or(0);

  ASSERT_EQ(kill(cluster_->head_pid(), SIGKILL), 0);
  const absl::Status restarted = cluster_->RestartHead();
  ASSERT_TRUE(restarted.ok()) << restarted;
  // A client that comes after (as `troupe status` would). This process's own proxies of the
  // workers' actors died with the route through the old head: CAF 0.17 keeps such a dead proxy
  // for a node it reached through another (BASP routes through the head unless members connect
  // directly), so a handle received again resolves to it; see the issue 17 note.
  StartClient();
  // Every node agent and worker process went on and joined the new head: the same ids, the same
  // pids.
  const std::map<std::string, int64_t> after = AliveMembers(5);
  EXPECT_EQ(after, before);
  for (const auto& [id, pid] : after) {
    std::cout << "member " << id << ": pid " << before.at(id) << " before the head's kill, " << pid
              << " after its successor took over" << std::endl;
  }
  EXPECT_GT(client_->Generation().value_or(0), generation_before)
      << "the membership generation goes on from the store, never back";
  EXPECT_NE(Slurp(cluster_->LogDir() + "/head.out").find("store epoch 2: generation"),
            std::string::npos)
      << Slurp(cluster_->LogDir() + "/head.out");
  // The named actor is found through the new head, where it always was, and answers.
  absl::StatusOr<ActorRef> found;
  for (int i = 0; i < 500; ++i) {
    found = client_->Lookup("kept");
    if (found.ok()) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->generation, kept_generation);
  {
    caf::scoped_actor self{rt_->system()};
    std::string err;
    self->request(found->handle, std::chrono::seconds(5), echo_atom::value, int64_t{8})
        .receive([&](int64_t y) { err = std::to_string(y); },
                 [&](caf::error& e) { err = rt_->system().render(e); });
    EXPECT_EQ(err, "8");
  }
  EXPECT_EQ(client_->WhereIs("kept").value_or(""), "a/w1");
}

// A head paused (SIGSTOP) while a successor claimed the store resumes to find its writes refused:
// it stops rather than serve a cluster it can no longer record.
TEST_F(HeadFailoverTest, AStaleHeadIsFencedByItsSuccessorsEpoch) {
  const std::string dir = cluster_->LogDir() + "/fence";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto head = [&](const std::string& name) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string out = dir + "/" + name + ".out";
      freopen(out.c_str(), "w", stdout);
      freopen((dir + "/" + name + ".err").c_str(), "w", stderr);
      execl(TROUPE_CLUSTER_APP, TROUPE_CLUSTER_APP, "head", "--port", "0", "--port_file",
            (dir + "/" + name + ".port").c_str(), "--store", (dir + "/head.db").c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 1000 && Slurp(dir + "/" + name + ".port").empty(); ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return pid;
  };
  const pid_t old_head = head("old");
  ASSERT_FALSE(Slurp(dir + "/old.port").empty()) << Slurp(dir + "/old.err");
  ASSERT_EQ(kill(old_head, SIGSTOP), 0);
  const pid_t new_head = head("new");
  ASSERT_FALSE(Slurp(dir + "/new.port").empty()) << Slurp(dir + "/new.err");
  EXPECT_NE(Slurp(dir + "/new.out").find("epoch 2"), std::string::npos) << Slurp(dir + "/new.out");
  ASSERT_EQ(kill(old_head, SIGCONT), 0);
  // A node joins the old head: its first membership write is refused, and it stops.
  const pid_t node = fork();
  if (node == 0) {
    freopen((dir + "/node.err").c_str(), "w", stderr);
    freopen((dir + "/node.out").c_str(), "w", stdout);
    const std::string address = "127.0.0.1:" + std::to_string(std::stoi(Slurp(dir + "/old.port")));
    execl(TROUPE_CLUSTER_APP, TROUPE_CLUSTER_APP, "node", "--head", address.c_str(), "--name",
          "late", "--workers", "0", "--head_grace", "1s", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  const pid_t done = WaitForExit(old_head, &status, milliseconds(10000));
  ASSERT_EQ(done, old_head) << "the stale head still runs\n" << Slurp(dir + "/old.err");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  EXPECT_NE(Slurp(dir + "/old.err")
                .find("this head's epoch 1 was fenced: a head of epoch 2 has "
                      "claimed the store since"),
            std::string::npos)
      << Slurp(dir + "/old.err");
  kill(node, SIGKILL);
  waitpid(node, nullptr, 0);
  EXPECT_EQ(waitpid(new_head, &status, WNOHANG), 0) << "the new head goes on";
  kill(new_head, SIGKILL);
  waitpid(new_head, nullptr, 0);
}

// A process of the cluster binary with `args`, its output in <dir>/<name>.{out,err}.
pid_t StartRole(const std::string& dir, const std::string& name, std::vector<std::string> args) {
  const pid_t pid = fork();
  if (pid == 0) {
    freopen((dir + "/" + name + ".out").c_str(), "w", stdout);
    freopen((dir + "/" + name + ".err").c_str(), "w", stderr);
    std::vector<char*> argv = {const_cast<char*>(TROUPE_CLUSTER_APP)};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(TROUPE_CLUSTER_APP, argv.data());
    _exit(127);
  }
  return pid;
}

// Polls <dir>/<file> for `text` for up to `timeout`.
bool WaitForText(const std::string& path, const std::string& text,
                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (HeadFailoverTest::Slurp(path).find(text) == std::string::npos) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// Two heads on one etcd store and one address (as behind a Kubernetes Service that routes to the
// one listening): the leader listens, the standby waits. kill -9 of the leader: the standby
// leads within its 1 s leader lease (plus a poll), listens on the address, and the node and its
// workers rejoin it — the same processes.
TEST_F(HeadFailoverTest, WithEtcdAStandbyLeadsWithinTheLeaderLeaseOfTheLeadersKillDashNine) {
  const std::string dir = cluster_->LogDir() + "/etcd-kill";
  std::filesystem::remove_all(dir);  // a file of an earlier run would satisfy WaitForText
  std::filesystem::create_directories(dir);
  LocalEtcd etcd(dir);
  ASSERT_TRUE(etcd.ready()) << etcd.log();
  const std::string port = std::to_string(LocalEtcd::FreePort());
  const std::string head = "127.0.0.1:" + port;
  auto start_head = [&](const std::string& name) {
    return StartRole(
        dir, name, {"head", "--port", port, "--store", etcd.store("/kill"), "--leader_ttl", "1s"});
  };
  const pid_t leader = start_head("a");
  ASSERT_TRUE(WaitForText(dir + "/a.out", "troupe head: listening", milliseconds(10000)))
      << Slurp(dir + "/a.err");
  const pid_t standby = start_head("b");
  ASSERT_TRUE(WaitForText(dir + "/b.err", "standby: ", milliseconds(10000)))
      << Slurp(dir + "/b.err");
  const pid_t node = StartRole(dir, "node",
                               {"node", "--head", head, "--name", "n", "--workers", "2",
                                "--log_dir", dir, "--head_grace", "10s"});
  const std::string status = std::string(TROUPE_CLUSTER_APP) + " status --head " + head +
                             " --wait_workers 2 --timeout 20s >" + dir + "/status.txt 2>&1";
  ASSERT_EQ(std::system(status.c_str()), 0) << Slurp(dir + "/status.txt");
  const std::string before = Slurp(dir + "/status.txt");
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(leader, SIGKILL), 0);
  waitpid(leader, nullptr, 0);
  ASSERT_TRUE(WaitForText(dir + "/b.out", "troupe head: listening", milliseconds(10000)))
      << Slurp(dir + "/b.err");
  const double lead_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // It went on from the leader's state in etcd: the node and its two workers.
  EXPECT_TRUE(WaitForText(dir + "/b.out", "store epoch 2: generation 3, 3 of 3 known members",
                          milliseconds(5000)))
      << Slurp(dir + "/b.out");
  EXPECT_LT(lead_s, 2.5) << "the standby took " << lead_s << " s (leader lease 1 s)";
  ASSERT_EQ(std::system(status.c_str()), 0) << Slurp(dir + "/status.txt");
  const double rejoined_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(Slurp(dir + "/status.txt"), before);
  std::cout << "standby leads " << lead_s << " s after the leader's kill -9; node and workers "
            << "rejoined it after " << rejoined_s << " s" << std::endl;
  kill(node, SIGKILL);
  waitpid(node, nullptr, 0);
  kill(standby, SIGKILL);
  waitpid(standby, nullptr, 0);
}

// SIGSTOP of the leading head: its lease runs out and the standby (on another port) leads under
// epoch 2. SIGCONT: the old leader's next write — its fenced leader mark — is refused by epoch,
// and it stops, naming both epochs.
TEST_F(HeadFailoverTest, WithEtcdAStoppedLeaderIsFencedByItsSuccessorsEpoch) {
  const std::string dir = cluster_->LogDir() + "/etcd-stop";
  std::filesystem::remove_all(dir);  // a file of an earlier run would satisfy WaitForText
  std::filesystem::create_directories(dir);
  LocalEtcd etcd(dir);
  ASSERT_TRUE(etcd.ready()) << etcd.log();
  auto start_head = [&](const std::string& name) {
    return StartRole(dir, name,
                     {"head", "--port", "0", "--store", etcd.store("/stop"), "--leader_ttl", "1s"});
  };
  const pid_t old_leader = start_head("old");
  ASSERT_TRUE(WaitForText(dir + "/old.out", "epoch 1", milliseconds(10000)))
      << Slurp(dir + "/old.err");
  const pid_t standby = start_head("new");
  ASSERT_TRUE(WaitForText(dir + "/new.err", "standby: ", milliseconds(10000)))
      << Slurp(dir + "/new.err");
  ASSERT_EQ(kill(old_leader, SIGSTOP), 0);
  ASSERT_TRUE(WaitForText(dir + "/new.out", "epoch 2", milliseconds(10000)))
      << Slurp(dir + "/new.err");
  ASSERT_EQ(kill(old_leader, SIGCONT), 0);
  int status = 0;
  const pid_t done = WaitForExit(old_leader, &status, milliseconds(10000));
  ASSERT_EQ(done, old_leader) << "the stale head still runs\n" << Slurp(dir + "/old.err");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  EXPECT_NE(Slurp(dir + "/old.err")
                .find("this head's epoch 1 was fenced: a head of epoch 2 has claimed the store "
                      "since; its writes are refused"),
            std::string::npos)
      << Slurp(dir + "/old.err");
  EXPECT_EQ(waitpid(standby, &status, WNOHANG), 0) << "the new leader goes on";
  kill(standby, SIGKILL);
  waitpid(standby, nullptr, 0);
}

// Without a head for longer than head_grace, node agents stop their workers and exit, naming why.
TEST_F(HeadFailoverTest, WithoutAHeadPastTheGraceNodesAndWorkersStopNamingIt) {
  StartNode("a", 1, {"--head_grace", "2s"});
  const pid_t agent = cluster_->nodes().at("a");
  const int64_t worker = Member("a/w0").pid;
  ASSERT_GT(worker, 0);
  ASSERT_EQ(kill(cluster_->head_pid(), SIGKILL), 0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_TRUE(ProcessAlive(agent)) << "within the grace the node waits for a head";
  EXPECT_TRUE(ProcessAlive(static_cast<pid_t>(worker)));
  int status = 0;
  const pid_t done = WaitForExit(agent, &status, milliseconds(30000));
  ASSERT_EQ(done, agent) << "the node agent outlived head_grace by 10 s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE(Slurp(cluster_->LogDir() + "/node-a.err").find("no head took over within head_grace"),
            std::string::npos)
      << Slurp(cluster_->LogDir() + "/node-a.err");
  for (int i = 0; i < 300 && ProcessAlive(static_cast<pid_t>(worker)); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(static_cast<pid_t>(worker))) << "its worker went with it";
}

}  // namespace
}  // namespace troupe::runtime
