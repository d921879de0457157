// The stock binary's cluster roles, run as a person would run them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "shell_test_util.h"

namespace {

using troupe::tools::Shell;

TEST(ClusterCommandTest, HelpListsEachRolesOptions) {
  std::string out;
  for (const char* role : {"head", "node", "up", "certs", "status"}) {
    EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " " + role + " --help", &out), 0) << role;
    EXPECT_NE(out.find("usage: troupe " + std::string(role)), std::string::npos) << out;
    const std::string r = role;
    const char* option = r == "certs"    ? "--members"
                         : r == "status" ? "--wait_workers"
                                         : "--heartbeat_interval";
    EXPECT_NE(out.find(option), std::string::npos) << role << ": " << out;
  }
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " --help", &out), 0);
  EXPECT_NE(out.find("troupe up [--workers N]"), std::string::npos) << out;
}

TEST(ClusterCommandTest, BadArgumentsNameTheOption) {
  std::string out;
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " node --head nowhere", &out), 2);
  EXPECT_NE(out.find("--head: expected HOST:PORT"), std::string::npos) << out;
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " head --port 70000", &out), 2);
  EXPECT_NE(out.find("option 'port'"), std::string::npos) << out;
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " up --workers many", &out), 2);
  EXPECT_NE(out.find("expected an integer"), std::string::npos) << out;
}

// A head whose port is taken (another job's head on a shared SLURM node) fails at once, exit 1,
// naming why: it never hangs holding its store, nor serves as if it were up.
TEST(ClusterCommandTest, AHeadThatCannotListenExitsOneAtOnce) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  std::string out;
  EXPECT_EQ(
      Shell("timeout 20 " + std::string(TROUPE_BINARY) + " head --host 127.0.0.1 --port " + port,
            &out),
      1)
      << "124 is a head that hung instead of exiting: " << out;
  EXPECT_NE(out.find(port), std::string::npos) << out;
  close(fd);
}

TEST(ClusterCommandTest, UpStartsAClusterAndTearsItDownOnSigterm) {
  std::string log = "/tmp/troupe-up-test-" + std::to_string(getpid()) + ".log";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(log.c_str(), "w", stdout);
    execl(TROUPE_BINARY, TROUPE_BINARY, "up", "--workers", "2", "--log_dir",
          "/tmp/troupe-up-test-logs", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string out;
  for (int i = 0; i < 500 && out.find("troupe up: head at") == std::string::npos; ++i) {
    usleep(20000);
    Shell("cat " + log, &out);
  }
  ASSERT_NE(out.find("node 'local' with 2 workers"), std::string::npos) << out;
  // Both workers join: `troupe status --wait_workers 2` waits for them, then lists every member
  // with its node's advertised address (loopback here: the head is on 127.0.0.1).
  const size_t at = out.find("head at ") + 8;
  const std::string head = out.substr(at, out.find(' ', at) - at);
  ASSERT_EQ(
      Shell(std::string(TROUPE_BINARY) + " status --head " + head + " --wait_workers 2", &out), 0)
      << out;
  EXPECT_NE(out.find("node local alive address=127.0.0.1 host="), std::string::npos) << out;
  EXPECT_NE(out.find(" cpu=0/2 labels=- spot=false\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  worker local/w0 alive pid="), std::string::npos) << out;
  EXPECT_NE(out.find("  worker local/w1 alive pid="), std::string::npos) << out;
  // A third never comes: it says so and fails.
  EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " status --head " + head +
                      " --wait_workers 3 --timeout 300ms",
                  &out),
            1);
  EXPECT_NE(out.find("2 of 3 workers alive after 300ms"), std::string::npos) << out;
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Nothing of it is left running.
  usleep(200000);
  Shell("pgrep -f 'troupe-up-test-log[s]'", &out);
  EXPECT_EQ(out, "") << "leftover processes: " << out;
  unlink(log.c_str());
}

}  // namespace
