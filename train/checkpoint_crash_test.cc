// Chaos: a real process writing a checkpoint is SIGKILLed at each file-system operation in turn
// (open, write, fsync, rename, directory fsync, delete); afterwards LATEST must name a complete
// checkpoint and LoadLatestValid must return it, bit for bit.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "gtest/gtest.h"
#include "troupe/train/checkpoint_store.h"

namespace troupe::train {
namespace {

using testing::BitEqual;
using testing::MakeState;
using testing::Meta;
using testing::SplitEven;
using testing::State;

constexpr int64_t kN = 100000;  // 1.2 MB per checkpoint: several chunks per shard file

// Counts mutating operations; SIGKILLs its own process just before operation number kill_at.
class KillingFileSystem : public testing::HookedFileSystem {
 public:
  KillingFileSystem(int64_t kill_at) : HookedFileSystem(PosixFileSystem()), kill_at_(kill_at) {}
  // Write's helper threads write shards at once: each call takes its own number (a plain ++ lost
  // some, so the count could fall short of kill_at and the child exit unkilled).
  absl::Status Before(const std::string& /*op*/) override {
    if (calls_.fetch_add(1) + 1 == kill_at_) ::kill(::getpid(), SIGKILL);
    return absl::OkStatus();
  }
  int64_t calls() const { return calls_.load(); }

 private:
  int64_t kill_at_;
  std::atomic<int64_t> calls_{0};
};

std::unique_ptr<CheckpointStore> OpenStore(const std::string& dir, FileSystem* fs) {
  CheckpointStoreOptions options;
  options.dir = dir;
  options.keep_last = 1;  // the write of step 2 also deletes step 1
  options.fs = fs;
  options.warning = [](const std::string&) {};
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/troupe-ckpt-crash-XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl), nullptr);
  return tmpl;
}

TEST(CheckpointCrashTest, SigkillAtEveryOperationLeavesLatestComplete) {
  const State one = MakeState(kN, 1), two = MakeState(kN, 2);
  // How many operations one write of step 2 (after step 1) makes.
  int64_t calls = 0;
  {
    const std::string root = MakeTempDir();
    KillingFileSystem counter(/*kill_at=*/-1);
    auto store = OpenStore(root + "/ckpt", PosixFileSystem());
    ASSERT_TRUE(store->Write(Meta(kN, 1, 3), SplitEven(one, 3)).ok());
    auto counted = OpenStore(root + "/ckpt", &counter);
    ASSERT_TRUE(counted->Write(Meta(kN, 2, 2), SplitEven(two, 2)).ok());
    calls = counter.calls() - 1;  // minus Open's CreateDir
    std::system(("rm -rf " + root).c_str());
  }
  ASSERT_GT(calls, 20);
  int kept_old = 0, kept_new = 0;
  for (int64_t at = 1; at <= calls; ++at) {
    SCOPED_TRACE("SIGKILL before operation " + std::to_string(at));
    const std::string root = MakeTempDir();
    const std::string dir = root + "/ckpt";
    ASSERT_TRUE(OpenStore(dir, PosixFileSystem())->Write(Meta(kN, 1, 3), SplitEven(one, 3)).ok());
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      KillingFileSystem fs(at + 1);  // + Open's CreateDir
      auto store = OpenStore(dir, &fs);
      (void)store->Write(Meta(kN, 2, 2), SplitEven(two, 2));
      ::_exit(0);  // not reached: the kill comes first
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

    auto store = OpenStore(dir, PosixFileSystem());
    absl::StatusOr<std::string> latest = ReadSmallFile(PosixFileSystem(), dir + "/LATEST", 64);
    ASSERT_TRUE(latest.ok()) << latest.status();
    ASSERT_TRUE(*latest == "step-1\n" || *latest == "step-2\n") << *latest;
    const int64_t named = *latest == "step-2\n" ? 2 : 1;
    absl::StatusOr<Checkpoint> ckpt = store->LoadLatestValid();
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ASSERT_EQ(ckpt->step(), named);
    State got{std::vector<float>(kN), std::vector<float>(kN), std::vector<float>(kN)};
    ASSERT_TRUE(ckpt->ReadRange(0, kN, got.params.data(), got.m.data(), got.v.data()).ok());
    const State& want = named == 2 ? two : one;
    EXPECT_TRUE(BitEqual(got.params, want.params) && BitEqual(got.m, want.m) &&
                BitEqual(got.v, want.v));
    (named == 2 ? kept_new : kept_old)++;
    std::system(("rm -rf " + root).c_str());
  }
  EXPECT_GT(kept_old, 0);
  EXPECT_GT(kept_new, 0);
}

}  // namespace
}  // namespace troupe::train
