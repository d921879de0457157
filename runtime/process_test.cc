#include "internal/process.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace troupe::runtime::internal {
namespace {

// A child that sleeps until it is killed.
pid_t Sleeper() {
  pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

// Waits until the child's state letter (field 3 of its stat) is `state`.
bool WaitForState(pid_t pid, char state) {
  for (int i = 0; i < 500; ++i) {
    std::string stat = TailFile("/proc/" + std::to_string(pid) + "/stat", 1);
    size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == state)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(ProcessTest, AlreadyDyingTellsAKilledProcessFromALiveOrStoppedOne) {
  pid_t live = Sleeper();
  ASSERT_GT(live, 0);
  ASSERT_TRUE(WaitForState(live, 'S'));
  EXPECT_FALSE(AlreadyDying(live)) << "a sleeping process";

  // Stopped: silent to everyone, but alive to the kernel — the head fences such a worker.
  ASSERT_EQ(kill(live, SIGSTOP), 0);
  ASSERT_TRUE(WaitForState(live, 'T'));
  EXPECT_FALSE(AlreadyDying(live)) << "a stopped process";

  // Killed and not yet reaped: a zombie.
  ASSERT_EQ(kill(live, SIGKILL), 0);
  ASSERT_TRUE(WaitForState(live, 'Z'));
  EXPECT_TRUE(AlreadyDying(live)) << "a killed process that its parent has not reaped";

  int status = 0;
  ASSERT_EQ(waitpid(live, &status, 0), live);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_FALSE(AlreadyDying(live)) << "a reaped pid is gone, not dying";
  EXPECT_FALSE(AlreadyDying(-1)) << "no such process";
}

// `iptables -S` in this process's network namespace: the rules troupe's chaos added, one per line.
std::vector<std::string> ChaosRules() {
  std::vector<std::string> rules;
  FILE* p = popen("iptables -w -S 2>&1", "r");
  if (p == nullptr) return {"popen failed"};
  char line[512];
  while (fgets(line, sizeof line, p) != nullptr) {
    if (std::strstr(line, "troupe-chaos") != nullptr) rules.emplace_back(line);
  }
  pclose(p);
  return rules;
}

// Runs `body` in a child of its own network namespace (root, as CI is); its failures are the
// child's exit status and stderr.
void InOwnNetworkNamespace(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child == 0) {
    if (unshare(CLONE_NEWNET) != 0) {
      std::perror("unshare(CLONE_NEWNET) (the test needs root)");
      _exit(90);
    }
    _exit(body());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// Waits up to `ms` for the chaos rules to be `count` in number; the last count seen.
size_t WaitForRules(size_t count, int ms) {
  size_t seen = ChaosRules().size();
  for (int i = 0; i < ms / 20 && seen != count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seen = ChaosRules().size();
  }
  return seen;
}

// A one-way partition drops what the host sends, nothing it receives: a rule on OUTPUT only,
// removed when the fault is over.
TEST(NetworkFaultTest, AOneWayPartitionDropsWhatTheHostSendsOnly) {
  InOwnNetworkNamespace([] {
    absl::Status s = StartNetworkFault({NodeFaultKind::kOneWay, 3000});
    if (!s.ok()) return std::fprintf(stderr, "%s\n", std::string(s.message()).c_str()), 1;
    const std::vector<std::string> rules = ChaosRules();
    if (rules.size() != 1 || rules[0].find("-A OUTPUT ! -o lo") == std::string::npos) {
      for (const auto& r : rules) std::fprintf(stderr, "rule: %s", r.c_str());
      return std::fprintf(stderr, "want one OUTPUT rule, got %zu\n", rules.size()), 2;
    }
    if (size_t left = WaitForRules(0, 8000); left != 0) {
      return std::fprintf(stderr, "%zu rules left after the fault\n", left), 3;
    }
    return 0;
  });
}

// A flapping link: both rules in, out, in again, ... every period, and none once it is over.
TEST(NetworkFaultTest, AFlappingLinkIsCutAndRestoredInTurnThenHealed) {
  InOwnNetworkNamespace([] {
    NodeFault f{NodeFaultKind::kFlap, 2500};
    f.period_ms = 400;
    absl::Status s = StartNetworkFault(f);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", std::string(s.message()).c_str()), 1;
    int cut = 0, healed = 0, changes = 0;
    size_t last = 2;
    for (int i = 0; i < 90; ++i) {  // about 1.8 s of the 2.5 s, every 20 ms
      const size_t n = ChaosRules().size();
      if (n > 2) return std::fprintf(stderr, "%zu rules: want at most 2\n", n), 2;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (n == 1) continue;  // between the two commands of a change
      (n == 2 ? cut : healed)++;
      changes += n != last;
      last = n;
    }
    if (cut == 0 || healed == 0 || changes < 2) {
      return std::fprintf(stderr, "cut %d, healed %d, changes %d\n", cut, healed, changes), 3;
    }
    if (size_t left = WaitForRules(0, 8000); left != 0) {
      return std::fprintf(stderr, "%zu rules left after the fault\n", left), 4;
    }
    return 0;
  });
}

}  // namespace
}  // namespace troupe::runtime::internal
