// A cluster with mutual TLS: members with the cluster's certificates join; a node with another
// CA's certificate, or none, is refused; raw TCP garbage and a frame claiming 4 GiB are cut off
// within 1 s, cost the head less than 64 MiB, and the head keeps serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "caf/all.hpp"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime {
namespace {

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<std::string> Tls(const std::string& dir, const std::string& who) {
  return {"--tls_ca",  dir + "/ca.pem",         "--tls_cert", dir + "/" + who + ".pem",
          "--tls_key", dir + "/" + who + ".key"};
}

int64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  int64_t kib = -1;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> kib;
      break;
    }
  }
  return kib;
}

// Connects to 127.0.0.1:port, sends `bytes`, and returns how long until the head closes the
// connection (or 5 s if it never does).
milliseconds TimeToCutOff(uint16_t port, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto start = Clock::now();
  (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  char buf[4096];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR)) break;  // closed, reset, or timed out
  }
  close(fd);
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = "/tmp/troupe-security-" + std::to_string(getpid());
    absl::Status a =
        GenerateClusterCertificates(dir_ + "/a", {"head", "node", "driver", "elsewhere=10.1.2.3"});
    ASSERT_TRUE(a.ok()) << a;
    absl::Status b = GenerateClusterCertificates(dir_ + "/b", {"node"});
    ASSERT_TRUE(b.ok()) << b;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void SetUp() override {
    LocalCluster::Options o;
    o.binary = TROUPE_CLUSTER_APP;
    o.workers = 0;
    o.head_args = Tls(dir_ + "/a", "head");
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->AddNode("node-a", 1, "cpu=1", "", Tls(dir_ + "/a", "node")).ok());
    RuntimeOptions ro;
    ro.network = true;
    ro.tls_ca = dir_ + "/a/ca.pem";
    ro.tls_cert = dir_ + "/a/driver.pem";
    ro.tls_key = dir_ + "/a/driver.key";
    ActorRegistry reg;
    auto rt = Runtime::Create(std::move(reg), ro);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::move(*rt);
    auto client = ClusterClient::Connect(*rt_, "127.0.0.1", cluster_->port());
    ASSERT_TRUE(client.ok()) << client.status();
    client_.emplace(*client);
    for (int i = 0; i < 500 && !WorkerAlive(); ++i) std::this_thread::sleep_for(milliseconds(10));
    ASSERT_TRUE(WorkerAlive()) << "node-a/w0 did not join over TLS";
  }

  void TearDown() override {
    client_.reset();
    rt_.reset();
    cluster_.reset();
  }

  bool WorkerAlive() {
    auto m = client_->Members();
    if (!m.ok()) return false;
    for (const auto& x : *m)
      if (x.id == "node-a/w0" && x.state == MemberState::kAlive) return true;
    return false;
  }

  bool IsMember(const std::string& id) {
    auto m = client_->Members();
    EXPECT_TRUE(m.ok());
    for (const auto& x : m.value_or(std::vector<MemberInfo>{}))
      if (x.id == id) return true;
    return false;
  }

  void ExpectHeadServes() {
    static int n = 0;
    auto ref = client_->Spawn("echo", {}, "echo-" + std::to_string(++n));
    ASSERT_TRUE(ref.ok()) << ref.status();
    caf::scoped_actor self{rt_->system()};
    int64_t got = -1;
    self->request(ref->handle, std::chrono::seconds(5), echo_atom::value, int64_t{99})
        .receive([&](int64_t y) { got = y; }, [](caf::error&) {});
    EXPECT_EQ(got, 99);
  }

  static std::string dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Runtime> rt_;
  std::optional<ClusterClient> client_;
};

std::string SecurityTest::dir_;

TEST_F(SecurityTest, MembersWithTheClusterCertificateJoinAndServe) { ExpectHeadServes(); }

TEST_F(SecurityTest, NodeWithAnotherClustersCertificateIsRefused) {
  auto pid = cluster_->AddNode("node-b", 0, "cpu=1", "", Tls(dir_ + "/b", "node"));
  ASSERT_TRUE(pid.ok());
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_FALSE(IsMember("node-b"));
  ExpectHeadServes();
}

TEST_F(SecurityTest, NodeWithoutCertificateIsRefused) {
  auto pid = cluster_->AddNode("node-plain", 0, "cpu=1", "");
  ASSERT_TRUE(pid.ok());
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_FALSE(IsMember("node-plain"));
}

// A certificate from the cluster's CA is not enough: it must name the address it is dialed at.
TEST_F(SecurityTest, AHeadWhoseCertificateNamesAnotherAddressIsRefused) {
  LocalCluster::Options o;
  o.binary = TROUPE_CLUSTER_APP;
  o.workers = 0;
  o.head_args = Tls(dir_ + "/a", "elsewhere");  // names 10.1.2.3, listens on 127.0.0.1
  auto other = LocalCluster::Start(o);
  ASSERT_TRUE(other.ok()) << other.status();
  auto client = ClusterClient::Connect(*rt_, "127.0.0.1", (*other)->port());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  ExpectHeadServes();  // the head whose certificate names 127.0.0.1 still serves
}

// Runtime::Call goes over the worker's direct channel, which is mutual TLS too: this driver's
// certificate is accepted; a runtime without TLS, or with another cluster's certificate, gets no
// reply — its call fails, the handshake refused — and the worker goes on serving.
TEST_F(SecurityTest, CallsToAWorkersActorAreMutualTlsAndRefuseOutsiders) {
  auto ref = client_->Spawn("echo", {}, "echo-tls");
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_FALSE(ref->direct.empty());
  auto echo = [&](Runtime& rt) {
    return rt.Call(*ref, caf::make_message(echo_atom::value, int64_t{7}));
  };
  auto reply = echo(*rt_);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->get_as<int64_t>(0), 7);

  RuntimeOptions plain;
  plain.network = true;
  auto outsider = Runtime::Create(ActorRegistry{}, plain);
  ASSERT_TRUE(outsider.ok()) << outsider.status();
  auto refused = echo(**outsider);
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();

  RuntimeOptions foreign = plain;
  foreign.tls_ca = dir_ + "/b/ca.pem";
  foreign.tls_cert = dir_ + "/b/node.pem";
  foreign.tls_key = dir_ + "/b/node.key";
  auto stranger = Runtime::Create(ActorRegistry{}, foreign);
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  auto unauthenticated = echo(**stranger);
  EXPECT_TRUE(absl::IsUnauthenticated(unauthenticated.status())) << unauthenticated.status();

  reply = echo(*rt_);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->get_as<int64_t>(0), 7);
}

TEST(CertificatesTest, MembersAreNamesWithOptionalAddresses) {
  const std::string dir = "/tmp/troupe-certs-" + std::to_string(getpid());
  EXPECT_TRUE(GenerateClusterCertificates(dir, {"n1=10.0.0.1+n1.example.org", "n2"}).ok());
  for (const char* bad : {"", "a b", "n=", "n=10.0.0.1+", "n=x,y"}) {
    absl::Status s = GenerateClusterCertificates(dir, {bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--members"), std::string::npos) << s;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(SecurityTest, GarbageAndHugeLengthClaimsAreCutOffCheaply) {
  int64_t rss_before = RssKiB(cluster_->head_pid());
  ASSERT_GT(rss_before, 0);
  std::mt19937 rng(7);
  std::string garbage(64 * 1024, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  // A length-prefixed frame claiming 4 GiB, and a TLS record header claiming the maximum.
  std::string huge_frame = std::string("\xff\xff\xff\xff", 4) + std::string(1024, 'x');
  std::string huge_record = std::string("\x16\x03\x03\xff\xff", 5) + std::string(1024, 'y');
  for (int round = 0; round < 10; ++round) {
    for (const std::string* bytes : {&garbage, &huge_frame, &huge_record}) {
      milliseconds t = TimeToCutOff(cluster_->port(), *bytes);
      EXPECT_LT(t.count(), 1000) << "round " << round << ": not cut off within 1 s";
    }
  }
  int64_t rss_after = RssKiB(cluster_->head_pid());
  std::cout << "head RSS: " << rss_before << " KiB -> " << rss_after << " KiB" << std::endl;
  EXPECT_LT(rss_after - rss_before, 64 * 1024);
  ExpectHeadServes();
}

}  // namespace
}  // namespace troupe::runtime
