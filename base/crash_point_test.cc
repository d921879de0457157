// A crash point kills the process at its armed hit, and only there.
#include "troupe/base/crash_point.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace troupe::base {
namespace {

TEST(CrashPointTest, KillsTheProcessAtTheArmedHitOnly) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ArmCrashPoint("ckpt.rename", 2);
    CrashPoint("ckpt.write");   // another point: nothing
    CrashPoint("ckpt.rename");  // first hit: nothing
    CrashPoint("ckpt.rename");  // second hit: SIGKILL
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  pid = fork();
  if (pid == 0) {
    ArmCrashPoint("x", 1);
    ArmCrashPoint("");  // disarmed
    CrashPoint("x");
    _exit(7);
  }
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << status;
}

}  // namespace
}  // namespace troupe::base
