#include "internal/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace troupe::runtime::internal
