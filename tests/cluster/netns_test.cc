// Two "hosts": the head on this network namespace, a node agent (and its worker) in another
// one joined by a veth pair. The node joins the head over the veth link and hosts an actor
// that answers. Needs root, as CI has: if `ip netns add` fails the test fails with its error (a
// skipped test would count as failed anyway).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "caf/all.hpp"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime {
namespace {

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using pid_atom = caf::atom_constant<caf::atom("pid")>;

// Runs a shell command; returns its exit status and (in *out) what it printed.
int Sh(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[512];
  std::string text;
  while (fgets(buf, sizeof buf, p)) text += buf;
  int rc = pclose(p);
  if (out) *out = text;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A run killed before its TearDown leaves its namespace and veth behind: removes those whose
// test process is gone.
void RemoveStaleNamespaces() {
  std::string list;
  Sh("ip netns list", &list);
  for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
    absl::string_view name = line.substr(0, line.find(' '));
    int pid = 0;
    if (!absl::ConsumePrefix(&name, "troupe-t") || !absl::SimpleAtoi(name, &pid)) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    Sh(absl::StrCat("ip link del trh", pid % 100000));
    Sh(absl::StrCat("ip netns del troupe-t", pid));
  }
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RemoveStaleNamespaces();
    int id = getpid() % 250;
    ns_ = absl::StrCat("troupe-t", getpid());
    host_if_ = absl::StrCat("trh", getpid() % 100000);
    ns_if_ = absl::StrCat("trn", getpid() % 100000);
    host_ip_ = absl::StrCat("10.123.", id, ".1");
    ns_ip_ = absl::StrCat("10.123.", id, ".2");
    std::string err;
    if (Sh("ip netns add " + ns_, &err) != 0) {
      FAIL() << "ip netns add " << ns_ << " failed (needs root and network namespaces): " << err;
    }
    created_ = true;
    for (const std::string& c :
         {absl::StrCat("ip link add ", host_if_, " type veth peer name ", ns_if_),
          absl::StrCat("ip link set ", ns_if_, " netns ", ns_),
          absl::StrCat("ip addr add ", host_ip_, "/24 dev ", host_if_),
          absl::StrCat("ip link set ", host_if_, " up"),
          absl::StrCat("ip netns exec ", ns_, " ip addr add ", ns_ip_, "/24 dev ", ns_if_),
          absl::StrCat("ip netns exec ", ns_, " ip link set ", ns_if_, " up"),
          absl::StrCat("ip netns exec ", ns_, " ip link set lo up")}) {
      ASSERT_EQ(Sh(c, &err), 0) << c << ": " << err;
    }
  }

  void TearDown() override {
    if (node_pid_ > 0) {
      kill(node_pid_, SIGKILL);
      waitpid(node_pid_, nullptr, 0);
    }
    client_.reset();
    rt_.reset();
    cluster_.reset();
    if (created_) {
      Sh("ip link del " + host_if_);
      Sh("ip netns del " + ns_);
    }
  }

  std::string ns_, host_if_, ns_if_, host_ip_, ns_ip_;
  bool created_ = false;
  pid_t node_pid_ = 0;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Runtime> rt_;
  std::optional<ClusterClient> client_;
};

TEST_F(NetnsTest, NodeInAnotherNamespaceJoinsAndHostsAnActor) {
  LocalCluster::Options o;
  o.binary = TROUPE_CLUSTER_APP;
  o.workers = 0;
  o.head_args = {"--host", host_ip_};
  auto c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  cluster_ = std::move(*c);
  // The node agent runs inside the other namespace; its worker inherits it.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string head = absl::StrCat(host_ip_, ":", cluster_->port());
    execlp("ip", "ip", "netns", "exec", ns_.c_str(), TROUPE_CLUSTER_APP, "node", "--head",
           head.c_str(), "--name", "far", "--workers", "1", "--log_dir",
           "/tmp/troupe-netns-test-logs", static_cast<char*>(nullptr));
    _exit(127);
  }
  node_pid_ = pid;
  RuntimeOptions ro;
  ro.network = true;
  auto rt = Runtime::Create(ActorRegistry{}, ro);
  ASSERT_TRUE(rt.ok()) << rt.status();
  rt_ = std::move(*rt);
  auto client = ClusterClient::Connect(*rt_, host_ip_, cluster_->port());
  ASSERT_TRUE(client.ok()) << client.status();
  client_.emplace(*client);
  bool joined = false;
  for (int i = 0; i < 500 && !joined; ++i) {
    auto members = client_->Members();
    for (const auto& m : members.value_or(std::vector<MemberInfo>{}))
      joined |= m.id == "far/w0" && m.state == MemberState::kAlive;
    if (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(joined) << "the node in namespace " << ns_ << " did not join";
  auto ref = client_->Spawn("echo", {}, "far-echo", "node=far");
  ASSERT_TRUE(ref.ok()) << ref.status();
  caf::scoped_actor self{rt_->system()};
  int64_t got = -1;
  self->request(ref->handle, std::chrono::seconds(5), echo_atom::value, int64_t{5})
      .receive([&](int64_t y) { got = y; },
               [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  EXPECT_EQ(got, 5);
  // The worker really lives in the other namespace.
  int64_t worker_pid = 0;
  self->request(ref->handle, std::chrono::seconds(5), pid_atom::value)
      .receive([&](int64_t p) { worker_pid = p; }, [](caf::error&) {});
  ASSERT_GT(worker_pid, 0);
  std::string ns_of_worker;
  Sh(absl::StrCat("ip netns identify ", worker_pid), &ns_of_worker);
  EXPECT_NE(ns_of_worker.find(ns_), std::string::npos) << ns_of_worker;
}

}  // namespace
}  // namespace troupe::runtime
