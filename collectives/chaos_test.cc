// Chaos: a rank dies (kill -9) or stops (SIGSTOP) in the middle of a 64 MiB all-reduce, or of a
// stream of 8-byte ones, on 4 real processes. Every survivor must return Unavailable naming it (in
// the message, and as the blamed peer: BlamedPeer) — within 500 ms of the kill, and within the
// liveness timeout (+500 ms of scheduling slack) of the stop — although the operation's deadline is
// 60 s; then a communicator over the 3 survivors must all-reduce correctly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "process_harness.h"

namespace troupe::collectives {
namespace {

constexpr int kRanks = 4;
constexpr int kVictim = 2;
constexpr int kLivenessMs = 2000;

void RunChaos(int signal, int64_t limit_ms, size_t count = size_t{16} << 20, bool mailboxes = true,
              int world = kRanks) {
  std::vector<std::string> args = {"chaos", std::to_string(kVictim), std::to_string(kLivenessMs),
                                   std::to_string(count)};
  if (!mailboxes) args.push_back("no-mailboxes");
  Ranks ranks(world, args);
  std::string line;
  // Wait until the victim has received at least one chunk of an all-reduce.
  while (line != "PROGRESS") ASSERT_TRUE(ranks[kVictim].ReadLine(&line)) << "victim exited";
  const int64_t t_signal = MonoNs();
  ASSERT_EQ(kill(ranks[kVictim].pid, signal), 0);
  for (int r = 0; r < world; ++r) {
    if (r == kVictim) continue;
    int64_t t_error = 0;
    char code[64] = {0};
    int blamed = -1;
    for (;;) {
      ASSERT_TRUE(ranks[r].ReadLine(&line)) << "rank " << r << ":\n" << ranks[r].Output();
      if (std::sscanf(line.c_str(), "ERROR %ld %63s blamed=%d", &t_error, code, &blamed) == 3)
        break;
    }
    const double ms = static_cast<double>(t_error - t_signal) / 1e6;
    std::printf("rank %d: %s %.1f ms after signal %d: %s\n", r, code, ms, signal, line.c_str());
    EXPECT_STREQ(code, "UNAVAILABLE") << line;
    EXPECT_TRUE(absl::StrContains(line, "rank 2")) << line;
    EXPECT_EQ(blamed, kVictim) << "the status names the dead peer as a payload too: " << line;
    EXPECT_LT(ms, static_cast<double>(limit_ms)) << line;
    int st = ranks[r].Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st << "\n"
                                                       << ranks[r].Output();
    EXPECT_NE(std::find(ranks[r].lines.begin(), ranks[r].lines.end(), "REBUILT OK"),
              ranks[r].lines.end())
        << ranks[r].Output();
  }
  kill(ranks[kVictim].pid, SIGKILL);
}

TEST(Chaos, KillNineDuring64MiBAllReduceIsDetectedWithin500ms) { RunChaos(SIGKILL, 500); }
// Eight ranks: rank 2 is watched by ranks 0, 1, 3 and 6 only (LivenessPeers); ranks 4, 5 and 7
// learn of its death from them, as fast.
TEST(Chaos, KillNineOfOneOfEightIsKnownToTheRanksThatDoNotWatchItWithin500ms) {
  RunChaos(SIGKILL, 500, size_t{1} << 20, true, 8);
}
// The same for a stopped rank: only its watchers see the silence.
TEST(Chaos, SigstopOfOneOfEightIsKnownToTheRanksThatDoNotWatchItWithinLivenessTimeout) {
  RunChaos(SIGSTOP, kLivenessMs + 500, size_t{1} << 20, true, 8);
}
// The same with the shared segments off: the survivors are reading the victim's buffer with
// cross-memory attach when it dies.
TEST(Chaos, KillNineDuring64MiBSingleCopyReadsIsDetectedWithin500ms) {
  RunChaos(SIGKILL, 500, size_t{16} << 20, /*mailboxes=*/false);
}

TEST(Chaos, SigstopDuring64MiBAllReduceIsDetectedWithinLivenessTimeout) {
  RunChaos(SIGSTOP, kLivenessMs + 500);
}

// 8-byte all-reduces, whose messages travel through the shared-memory mailboxes: a survivor
// polling its inbox for the dead rank's message is failed by the liveness channel all the same.
TEST(Chaos, KillNineDuring8ByteAllReducesIsDetectedWithin500ms) { RunChaos(SIGKILL, 500, 2); }
TEST(Chaos, SigstopDuring8ByteAllReducesIsDetectedWithinLivenessTimeout) {
  RunChaos(SIGSTOP, kLivenessMs + 500, 2);
}

// The whole machine paused (a VM descheduled, a starved host): every rank stopped at once for
// longer than the liveness timeout, then continued one by one. Nobody could hear anybody in
// between, and nobody died: each liveness monitor discounts its own pause, so no rank reports a
// peer and the all-reduces go on. (Before the discount, the first monitor to run again reported
// every peer it had not yet heard from.)
TEST(Chaos, EveryRankStoppedTogetherPastTheLivenessTimeoutIsNoDeath) {
  Ranks ranks(kRanks, {"freeze", std::to_string(kLivenessMs), "5"});
  for (int r = 0; r < kRanks; ++r) {
    std::string line;
    while (line != "PROGRESS") ASSERT_TRUE(ranks[r].ReadLine(&line)) << ranks[r].Output();
  }
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(kill(ranks[r].pid, SIGSTOP), 0);
  usleep((kLivenessMs + 1000) * 1000);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(kill(ranks[r].pid, SIGCONT), 0);
    usleep(100 * 1000);
  }
  for (int r = 0; r < kRanks; ++r) {
    const int st = ranks[r].Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r << ":\n"
                                                       << ranks[r].Output();
    EXPECT_TRUE(absl::StrContains(ranks[r].Output(), "FREEZE OK")) << ranks[r].Output();
  }
}

}  // namespace
}  // namespace troupe::collectives
