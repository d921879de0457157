// Liveness on the wire: a monitor of rank 0 in a world of 3, its two peers played by this test
// over real TCP connections, so the order of what the peers send is the test's to choose.
#include "liveness.h"

#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "net.h"
#include "troupe/base/clock.h"

namespace troupe::collectives {
namespace {

// The bootstrap store, in memory.
class MapBootstrap : public Bootstrap {
 public:
  absl::Status Publish(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    cv_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Lookup(const std::string& key, absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    while (values_.count(key) == 0) {
      if (cv_.wait_for(lock, std::chrono::milliseconds(10)) == std::cv_status::timeout &&
          base::MonotonicNow() > deadline) {
        return absl::DeadlineExceededError(key);
      }
    }
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// What rank 0's on_dead was told, in order.
struct Deaths {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, std::string>> seen;
  bool WaitFor(int rank, absl::Duration limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, absl::ToChronoMilliseconds(limit), [&] {
      for (const auto& d : seen) {
        if (d.first == rank) return true;
      }
      return false;
    });
  }
};

class LivenessTest : public ::testing::Test {
 protected:
  // Rank 0's monitor (silence timeout 60 s: no peer is reported for silence here) and the
  // connections of ranks 1 and 2 to it, each introduced by its hello (rank, pid).
  void SetUp() override {
    Liveness::Options options;
    options.interval = absl::Milliseconds(20);
    options.timeout = absl::Seconds(60);
    const absl::Time deadline = base::MonotonicNow() + absl::Seconds(20);
    std::thread peers([&] {
      auto published = boot_.Lookup("t/live/0", deadline);
      ASSERT_TRUE(published.ok()) << published.status();
      char address[64] = {};
      int port = 0, pid = 0;
      ASSERT_EQ(std::sscanf(published->c_str(), "%63s %d %d", address, &port, &pid), 3);
      for (int r : {1, 2}) {
        auto fd = net::Connect(address, port, deadline);
        ASSERT_TRUE(fd.ok()) << fd.status();
        fd_[r] = *fd;
        const int32_t hello[2] = {r, 1000 + r};
        ASSERT_TRUE(net::WriteFull(fd_[r], hello, sizeof(hello)).ok());
      }
    });
    auto live = Liveness::Start(
        &boot_, "t", 0, 3, "127.0.0.1", options,
        [this](int rank, const std::string& why) {
          std::lock_guard<std::mutex> lock(deaths_.mu);
          deaths_.seen.emplace_back(rank, why);
          deaths_.cv.notify_all();
        },
        deadline);
    peers.join();
    ASSERT_TRUE(live.ok()) << live.status();
    live_ = std::move(*live);
  }
  void TearDown() override {
    live_.reset();
    for (int fd : fd_) {
      if (fd >= 0) close(fd);
    }
  }
  void Send(int from, const std::string& bytes) {
    ASSERT_EQ(send(fd_[from], bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  MapBootstrap boot_;
  Deaths deaths_;
  std::unique_ptr<Liveness> live_;
  int fd_[3] = {-1, -1, -1};
};

// A rank that saw a death may say goodbye before its notice is on the wire (its monitor reports
// while its main thread shuts the communicator down). The notice must still be read: rank 0
// learns of rank 2's death only through rank 1 here. Before the fix, a goodbye stopped the
// reading of that peer, and a rank whose informants all said goodbye first waited out its
// operation's deadline (Chaos.SigstopOfOneOfEight..., once, 60 s).
TEST_F(LivenessTest, ADeathNoticeThatFollowsAPeersGoodbyeIsStillRead) {
  Send(1, "B");
  absl::SleepFor(absl::Milliseconds(200));  // ten of the monitor's rounds read the goodbye alone
  Send(1, "D2 4242;");
  ASSERT_TRUE(deaths_.WaitFor(2, absl::Seconds(10))) << "rank 0 never learned of rank 2's death";
  std::lock_guard<std::mutex> lock(deaths_.mu);
  ASSERT_EQ(deaths_.seen.size(), 1u);
  EXPECT_TRUE(absl::StrContains(deaths_.seen[0].second, "pid 4242")) << deaths_.seen[0].second;
  EXPECT_TRUE(absl::StrContains(deaths_.seen[0].second, "rank 1 saw it die"))
      << deaths_.seen[0].second;
}

// A goodbye, then EOF: a clean departure, never a death.
TEST_F(LivenessTest, AGoodbyeFollowedByEofIsNotADeath) {
  Send(1, "B");
  absl::SleepFor(absl::Milliseconds(100));
  close(fd_[1]);
  fd_[1] = -1;
  EXPECT_FALSE(deaths_.WaitFor(1, absl::Milliseconds(500)));
  // EOF without a goodbye is one (kill -9, exit): the channel still reports it.
  close(fd_[2]);
  fd_[2] = -1;
  ASSERT_TRUE(deaths_.WaitFor(2, absl::Seconds(10)));
  std::lock_guard<std::mutex> lock(deaths_.mu);
  ASSERT_EQ(deaths_.seen.size(), 1u);
  EXPECT_TRUE(absl::StrContains(deaths_.seen[0].second, "connection closed"))
      << deaths_.seen[0].second;
}

}  // namespace
}  // namespace troupe::collectives
