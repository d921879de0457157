#include "internal/preemption.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "troupe/runtime/metadata_sim.h"

namespace troupe::runtime::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using troupe::runtime::MetadataSimulator;

// Collects the one notice a watcher gives.
struct Heard {
  absl::Notification got;
  PreemptionNotice notice;
  std::function<void(const PreemptionNotice&)> Callback() {
    return [this](const PreemptionNotice& n) {
      notice = n;
      got.Notify();
    };
  }
};

double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

TEST(PreemptionWatcherTest, SourcesParseByNameAndAnythingElseIsAnError) {
  EXPECT_EQ(*ParsePreemptionSource("aws"), PreemptionSource::kAws);
  EXPECT_EQ(*ParsePreemptionSource("gce"), PreemptionSource::kGce);
  EXPECT_EQ(*ParsePreemptionSource("sigterm"), PreemptionSource::kSigterm);
  EXPECT_EQ(*ParsePreemptionSource("none"), PreemptionSource::kNone);
  EXPECT_EQ(ParsePreemptionSource("azure").status().message(),
            "--preemption_source: expected none, sigterm, aws or gce, got 'azure'");
  for (const char* bad : {"169.254.169.254", "ftp://x", "http://", "http://:80"}) {
    auto w = PreemptionWatcher::Start({PreemptionSource::kAws, bad, milliseconds(50)},
                                      [](const PreemptionNotice&) {});
    ASSERT_FALSE(w.ok()) << bad;
    EXPECT_EQ(w.status().message(),
              std::string("--metadata_endpoint: expected http://HOST[:PORT], got '") + bad + "'");
  }
}

TEST(PreemptionWatcherTest, AwsInstanceActionIsHeardWithTheCloudsDeadline) {
  MetadataSimulator server;
  Heard heard;
  auto w = PreemptionWatcher::Start({PreemptionSource::kAws, server.endpoint(), milliseconds(20)},
                                    heard.Callback());
  ASSERT_TRUE(w.ok()) << w.status();
  // 404s while there is no notice: polled, never taken for one.
  while (server.notice_requests() < 5) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_FALSE(heard.got.HasBeenNotified());
  EXPECT_EQ(server.token_requests(), 1) << "one IMDSv2 session token serves every poll";
  const auto t0 = std::chrono::steady_clock::now();
  server.Preempt(seconds(90));
  ASSERT_TRUE(heard.got.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(Seconds(std::chrono::steady_clock::now() - t0), 1.0);
  EXPECT_NE(heard.notice.detail.find("aws spot instance-action terminate at 20"), std::string::npos)
      << heard.notice.detail;
  // The document's time has whole seconds: 89..90 s left.
  EXPECT_GT(Seconds(heard.notice.left), 88.0);
  EXPECT_LE(Seconds(heard.notice.left), 90.0);
}

TEST(PreemptionWatcherTest, AwsRenewsARefusedSessionToken) {
  MetadataSimulator server;
  Heard heard;
  auto w = PreemptionWatcher::Start({PreemptionSource::kAws, server.endpoint(), milliseconds(20)},
                                    heard.Callback());
  ASSERT_TRUE(w.ok()) << w.status();
  while (server.notice_requests() < 2) std::this_thread::sleep_for(milliseconds(5));
  server.ExpireTokens();  // every GET with the old token is refused (401) from now on
  server.Preempt();
  ASSERT_TRUE(heard.got.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(server.token_requests(), 2);
}

TEST(PreemptionWatcherTest, GceHangingGetAnswersWhenPreemptedNotAtTheNextPoll) {
  MetadataSimulator server;
  Heard heard;
  // Waits of up to 30 s: a notice heard within a second came from the hanging GET.
  auto w = PreemptionWatcher::Start({PreemptionSource::kGce, server.endpoint(), seconds(30)},
                                    heard.Callback());
  ASSERT_TRUE(w.ok()) << w.status();
  while (server.notice_requests() < 1) std::this_thread::sleep_for(milliseconds(5));
  std::this_thread::sleep_for(milliseconds(100));  // the wait_for_change GET is in
  const auto t0 = std::chrono::steady_clock::now();
  server.Preempt();
  ASSERT_TRUE(heard.got.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(Seconds(std::chrono::steady_clock::now() - t0), 1.0);
  EXPECT_EQ(heard.notice.detail, "gce instance/preempted TRUE");
  EXPECT_EQ(Seconds(heard.notice.left), 30.0);
  EXPECT_EQ(server.notice_requests(), 2) << "one read, then one wait that the flip answered";
}

TEST(PreemptionWatcherTest, StoppingCutsOffAWaitInFlightAndAnUnreachableEndpointIsRetried) {
  {
    MetadataSimulator server;
    auto w = PreemptionWatcher::Start({PreemptionSource::kGce, server.endpoint(), seconds(30)},
                                      [](const PreemptionNotice&) {});
    ASSERT_TRUE(w.ok()) << w.status();
    while (server.notice_requests() < 1) std::this_thread::sleep_for(milliseconds(5));
    std::this_thread::sleep_for(milliseconds(100));
    const auto t0 = std::chrono::steady_clock::now();
    w->reset();
    EXPECT_LT(Seconds(std::chrono::steady_clock::now() - t0), 2.0);
  }
  // Nothing listens on the port any more: the watcher keeps trying, and stops when asked.
  std::string gone;
  {
    MetadataSimulator server;
    gone = server.endpoint();
  }
  auto w = PreemptionWatcher::Start({PreemptionSource::kAws, gone, milliseconds(20)},
                                    [](const PreemptionNotice&) { ADD_FAILURE(); });
  ASSERT_TRUE(w.ok()) << w.status();
  std::this_thread::sleep_for(milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  w->reset();
  EXPECT_LT(Seconds(std::chrono::steady_clock::now() - t0), 2.0);
}

}  // namespace
}  // namespace troupe::runtime::internal
