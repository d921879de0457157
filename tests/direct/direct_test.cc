// The direct channel between real processes: this test process calls the named actor of a
// serving process (direct_app) over loopback. Round trip, unknown actor, unhandled message, the
// actor's own error, garbage and oversized frames (connection cut, server keeps serving), a
// server killed mid-call (Unavailable within 1 s), a stopped server (the deadline holds), and
// the scheduler path (--no-inline) under concurrent callers.
#include "troupe/runtime/direct.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <thread>

#include "caf/all.hpp"
#include "direct_wire.h"
#include "troupe/runtime/processes.h"
#include "troupe/runtime/runtime.h"

extern char** environ;

namespace troupe::runtime {
namespace {

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using pid_atom = caf::atom_constant<caf::atom("pid")>;
using hang_atom = caf::atom_constant<caf::atom("hang")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// direct_app as a child process; killed when this object goes away.
class ServerProcess {
 public:
  explicit ServerProcess(bool run_inline = true) {
    int out[2], in[2];
    EXPECT_EQ(pipe(out), 0);
    EXPECT_EQ(pipe(in), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<char*> argv = {const_cast<char*>(TROUPE_DIRECT_APP)};
    if (!run_inline) argv.push_back(const_cast<char*>("--no-inline"));
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, TROUPE_DIRECT_APP, &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(in[0]);
    stdin_ = in[1];
    std::string line;
    char c;
    pollfd p{out[0], POLLIN, 0};
    while (line.find('\n') == std::string::npos && poll(&p, 1, 10000) > 0 &&
           read(out[0], &c, 1) == 1) {
      line += c;
    }
    close(out[0]);
    EXPECT_EQ(line.rfind("port=", 0), 0u) << "direct_app printed '" << line << "'";
    port_ = static_cast<uint16_t>(atoi(line.c_str() + 5));
  }
  ~ServerProcess() {
    close(stdin_);
    Kill(SIGKILL);
  }
  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    if (sig == SIGKILL) {
      waitpid(pid_, nullptr, 0);
      pid_ = 0;
    }
  }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = 0;
  int stdin_ = -1;
  uint16_t port_ = 0;
};

class DirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RuntimeOptions o;
    o.log_events = false;
    auto rt = Runtime::Create(ActorRegistry{}, o);
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(*rt);
  }
  std::unique_ptr<DirectClient> Connect(const ServerProcess& server, DirectClientOptions o = {}) {
    auto c = DirectClient::Connect(*runtime_, "127.0.0.1", server.port(), "echo-1", o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // A raw socket to the server, for sending bytes a DirectClient never would.
  int RawSocket(const ServerProcess& server) {
    int fd = -1;
    EXPECT_TRUE(direct::Connect("127.0.0.1", server.port(), milliseconds(2000), &fd).ok());
    return fd;
  }
  std::unique_ptr<Runtime> runtime_;
};

int64_t EchoValue(const absl::StatusOr<caf::message>& reply) {
  if (!reply.ok() || !reply->match_elements<int64_t>()) return -1;
  return reply->get_as<int64_t>(0);
}

TEST_F(DirectTest, RoundTripToAnotherProcess) {
  ServerProcess server;
  auto client = Connect(server);
  ASSERT_NE(client, nullptr);
  auto pid = client->Call(caf::make_message(pid_atom::value));
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(EchoValue(pid), server.pid());
  EXPECT_NE(EchoValue(pid), getpid());
  for (int64_t i = 0; i < 200; ++i) {
    ASSERT_EQ(EchoValue(client->Call(caf::make_message(echo_atom::value, i * 31))), i * 31);
  }
}

TEST_F(DirectTest, UnknownActorIsNotFound) {
  ServerProcess server;
  auto c = DirectClient::Connect(*runtime_, "127.0.0.1", server.port(), "no-such-actor");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("no-such-actor"), std::string::npos) << c.status();
}

TEST_F(DirectTest, UnhandledMessageAndActorErrorKeepTheChannel) {
  ServerProcess server;
  auto client = Connect(server);
  ASSERT_NE(client, nullptr);
  auto unhandled = client->Call(caf::make_message(std::string("what")));
  EXPECT_TRUE(absl::IsInvalidArgument(unhandled.status())) << unhandled.status();
  auto failed = client->Call(caf::make_message(fail_atom::value));
  // The actor's Status crosses the channel with its code (runtime/status.h).
  EXPECT_TRUE(absl::IsFailedPrecondition(failed.status())) << failed.status();
  EXPECT_NE(failed.status().message().find("asked to fail"), std::string::npos) << failed.status();
  EXPECT_EQ(EchoValue(client->Call(caf::make_message(echo_atom::value, int64_t{5}))), 5);
}

// Reads until EOF; returns the bytes and whether EOF came within `within`.
std::pair<std::string, bool> ReadUntilClosed(int fd, milliseconds within) {
  std::string got;
  auto deadline = Clock::now() + within;
  for (;;) {
    int left =
        static_cast<int>(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) return {got, false};
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return {got, true};
    got.append(buf, static_cast<size_t>(n));
  }
}

// The reason text of the error frame at the start of `bytes` ("" if there is none).
std::string ErrorText(const std::string& bytes) {
  direct::FrameHeader h;
  if (bytes.size() < direct::kHeaderBytes ||
      !direct::DecodeHeader(bytes.data(), 1 << 16, &h).ok() ||
      h.kind != direct::FrameKind::kError || bytes.size() < direct::kHeaderBytes + h.length) {
    return "";
  }
  return std::string(
      direct::DecodeErrorPayload(bytes.data() + direct::kHeaderBytes, h.length).message());
}

TEST_F(DirectTest, GarbageIsCutOffAndTheServerKeepsServing) {
  ServerProcess server;
  auto client = Connect(server);
  ASSERT_NE(client, nullptr);
  int fd = RawSocket(server);
  const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_GT(write(fd, garbage, sizeof(garbage)), 0);
  auto [bytes, closed] = ReadUntilClosed(fd, milliseconds(1000));
  EXPECT_TRUE(closed);
  EXPECT_NE(ErrorText(bytes).find("magic"), std::string::npos) << ErrorText(bytes);
  close(fd);
  EXPECT_EQ(EchoValue(client->Call(caf::make_message(echo_atom::value, int64_t{9}))), 9);
}

TEST_F(DirectTest, OversizedLengthIsCutOffBeforeAndAfterHello) {
  ServerProcess server;
  char header[direct::kHeaderBytes];
  // A hello claiming 4 GiB.
  int fd = RawSocket(server);
  direct::EncodeHeader({direct::FrameKind::kHello, 0xffffffffu, 0}, header);
  ASSERT_EQ(write(fd, header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  auto [bytes, closed] = ReadUntilClosed(fd, milliseconds(1000));
  EXPECT_TRUE(closed);
  EXPECT_NE(ErrorText(bytes).find("the cap is 4096"), std::string::npos) << ErrorText(bytes);
  close(fd);
  // A proper hello, then a call claiming 4 GiB.
  fd = RawSocket(server);
  std::string hello(direct::kHeaderBytes, '\0');
  direct::EncodeHeader({direct::FrameKind::kHello, 6, 0}, hello.data());
  hello += "echo-1";
  direct::EncodeHeader({direct::FrameKind::kCall, 0xffffffffu, 1}, header);
  hello.append(header, sizeof(header));
  ASSERT_EQ(write(fd, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  auto [bytes2, closed2] = ReadUntilClosed(fd, milliseconds(1000));
  EXPECT_TRUE(closed2);
  ASSERT_GE(bytes2.size(), direct::kHeaderBytes);  // hello-ok first, then the error
  EXPECT_NE(ErrorText(bytes2.substr(direct::kHeaderBytes)).find("4294967295"), std::string::npos);
  close(fd);
  auto client = Connect(server);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(EchoValue(client->Call(caf::make_message(echo_atom::value, int64_t{3}))), 3);
}

// A hello may bind the connection to one incarnation: the right generation is served, another
// is NotFound naming both, and a generation of the wrong length is a protocol error.
TEST_F(DirectTest, AHelloBindsAGenerationAndAMalformedOneIsCutOff) {
  ServerProcess server;
  DirectClientOptions o;
  o.generation = 1;  // echo-1's first and only incarnation
  auto bound = Connect(server, o);
  ASSERT_NE(bound, nullptr);
  EXPECT_EQ(EchoValue(bound->Call(caf::make_message(echo_atom::value, int64_t{5}))), 5);
  o.generation = 99;
  auto stale = DirectClient::Connect(*runtime_, "127.0.0.1", server.port(), "echo-1", o);
  ASSERT_FALSE(stale.ok());
  EXPECT_TRUE(absl::IsNotFound(stale.status())) << stale.status();
  EXPECT_NE(stale.status().message().find("generation 99 is gone"), std::string::npos)
      << stale.status();
  int fd = RawSocket(server);
  std::string hello(direct::kHeaderBytes, '\0');
  const std::string payload = std::string("echo-1") + '\0' + "abc";  // 3 bytes, not 8
  direct::EncodeHeader({direct::FrameKind::kHello, static_cast<uint32_t>(payload.size()), 0},
                       hello.data());
  hello += payload;
  ASSERT_EQ(write(fd, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  auto [bytes, closed] = ReadUntilClosed(fd, milliseconds(1000));
  EXPECT_TRUE(closed);
  EXPECT_NE(ErrorText(bytes).find("8-byte generation"), std::string::npos) << ErrorText(bytes);
  close(fd);
  EXPECT_EQ(EchoValue(bound->Call(caf::make_message(echo_atom::value, int64_t{6}))), 6);
}

// The server's writes time out after 2 s of no progress and the connection is cut.
TEST_F(DirectTest, ClientThatNeverReadsIsCutOff) {
  ServerProcess server;
  // A tiny receive window from the start (set before connect: shrinking it later confuses TCP),
  // so the server's replies back up quickly.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(server.port());
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string hello(direct::kHeaderBytes, '\0');
  direct::EncodeHeader({direct::FrameKind::kHello, 6, 0}, hello.data());
  hello += "echo-1";
  ASSERT_EQ(write(fd, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  // One valid call frame, taken from what a DirectClient would send.
  std::vector<char> body;
  caf::binary_serializer ser{runtime_->system(), body};
  caf::message m = caf::make_message(echo_atom::value, int64_t{1});
  ASSERT_FALSE(ser(m));
  std::string call(direct::kHeaderBytes, '\0');
  direct::EncodeHeader({direct::FrameKind::kCall, static_cast<uint32_t>(body.size()), 1},
                       call.data());
  call.append(body.data(), body.size());
  std::string batch;
  for (int i = 0; i < 256; ++i) batch += call;
  // Pipeline calls without ever reading a reply until the server gives up on this client.
  timeval t{0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
  bool cut = false;
  auto deadline = Clock::now() + std::chrono::seconds(40);
  while (!cut && Clock::now() < deadline) {
    cut =
        send(fd, batch.data(), batch.size(), MSG_NOSIGNAL) < 0 && errno != EAGAIN && errno != EINTR;
  }
  EXPECT_TRUE(cut) << "the server kept a connection whose client never reads";
  close(fd);
  auto client = Connect(server);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(EchoValue(client->Call(caf::make_message(echo_atom::value, int64_t{4}))), 4);
}

TEST_F(DirectTest, MalformedPayloadIsAnErrorReply) {
  ServerProcess server;
  int fd = RawSocket(server);
  std::string frames(direct::kHeaderBytes, '\0');
  direct::EncodeHeader({direct::FrameKind::kHello, 6, 0}, frames.data());
  frames += "echo-1";
  std::string call(direct::kHeaderBytes, '\0');
  std::string junk = "\x05\x00\x00\x00\xff\xff\xff\xff not a caf message";
  direct::EncodeHeader({direct::FrameKind::kCall, static_cast<uint32_t>(junk.size()), 42},
                       call.data());
  frames += call + junk;
  ASSERT_EQ(write(fd, frames.data(), frames.size()), static_cast<ssize_t>(frames.size()));
  char buf[2 * direct::kHeaderBytes + 512];
  direct::FrameHeader h;
  std::vector<char> payload;
  auto deadline = Clock::now() + milliseconds(2000);
  direct::Stream stream(fd);
  ASSERT_TRUE(direct::ReadFrame(stream, 4096, deadline, &h, &payload).ok());
  EXPECT_EQ(h.kind, direct::FrameKind::kHelloOk);
  ASSERT_TRUE(direct::ReadFrame(stream, 4096, deadline, &h, &payload).ok());
  EXPECT_EQ(h.kind, direct::FrameKind::kError);
  EXPECT_EQ(h.call_id, 42u);
  absl::Status s = direct::DecodeErrorPayload(payload.data(), payload.size());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("cannot decode"), std::string::npos) << s;
  (void)buf;
  close(fd);
}

TEST_F(DirectTest, ServerKilledMidCallFailsWithinOneSecond) {
  ServerProcess server;
  DirectClientOptions o;
  o.call_timeout = std::chrono::seconds(30);  // far away: the failure must come from the peer
  auto client = Connect(server, o);
  ASSERT_NE(client, nullptr);
  auto pending = std::async(std::launch::async, [&] {
    auto r = client->Call(caf::make_message(hang_atom::value));
    return std::make_pair(r.status(), Clock::now());
  });
  std::this_thread::sleep_for(milliseconds(200));  // let the call reach the handler
  auto killed_at = Clock::now();
  server.Kill(SIGKILL);
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto [status, failed_at] = pending.get();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_LT(failed_at - killed_at, milliseconds(1000));
  // Later calls fail fast too (connection refused), never hang.
  auto again = client->Call(caf::make_message(echo_atom::value, int64_t{1}));
  EXPECT_TRUE(absl::IsUnavailable(again.status())) << again.status();
}

TEST_F(DirectTest, StoppedServerHitsTheDeadlineThenRecovers) {
  ServerProcess server;
  auto client = Connect(server);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(runtime::testing::StopAndWait(server.pid()));
  auto r = client->Call(caf::make_message(echo_atom::value, int64_t{1}), milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("no reply within 300 ms"), std::string::npos) << r.status();
  server.Kill(SIGCONT);
  EXPECT_EQ(EchoValue(client->Call(caf::make_message(echo_atom::value, int64_t{2}))), 2);
  EXPECT_NE(client->DebugString().find("reconnects=1"), std::string::npos) << client->DebugString();
}

TEST_F(DirectTest, ConcurrentCallersOnBothDispatchPaths) {
  for (bool run_inline : {true, false}) {
    ServerProcess server(run_inline);
    std::vector<std::thread> threads;
    std::atomic<int> wrong{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        auto c = DirectClient::Connect(*runtime_, "127.0.0.1", server.port(), "echo-1");
        if (!c.ok()) {
          wrong += 1000;
          return;
        }
        for (int64_t i = 0; i < 300; ++i) {
          int64_t v = t * 100000 + i;
          if (EchoValue((*c)->Call(caf::make_message(echo_atom::value, v))) != v) ++wrong;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0) << (run_inline ? "inline" : "scheduler");
  }
}

}  // namespace
}  // namespace troupe::runtime
