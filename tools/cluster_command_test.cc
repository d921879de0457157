// The stock binary's cluster roles, run as a person would run them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace {

// Runs `cmd` through the shell; returns the exit status, with its output in *out.
int Shell(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  out->clear();
  while (fgets(buf, sizeof buf, p)) *out += buf;
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(ClusterCommandTest, HelpListsEachRolesOptions) {
  std::string out;
  for (const char* role : {"head", "node", "up", "certs"}) {
    EXPECT_EQ(Shell(std::string(TROUPE_BINARY) + " " + role + " --help", &out), 0) << role;
    EXPECT_NE(out.find("usage: troupe " + std::string(role)), std::string::npos) << out;
    const char* option = std::string(role) == "certs" ? "--members" : "--heartbeat_interval";
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
  // Both workers join (the node agent logs each worker's stderr to --log_dir).
  for (int i = 0; i < 500; ++i) {
    Shell("cat /tmp/troupe-up-test-logs/local-w0.err /tmp/troupe-up-test-logs/local-w1.err", &out);
    if (out.find("local/w0: joined") != std::string::npos &&
        out.find("local/w1: joined") != std::string::npos)
      break;
    usleep(20000);
  }
  EXPECT_NE(out.find("local/w1: joined"), std::string::npos) << out;
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
