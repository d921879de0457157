#include "troupe/collectives/bootstrap.h"

#include <gtest/gtest.h>

#include <thread>

#include "troupe/base/clock.h"

namespace troupe::collectives {
namespace {

TEST(TcpBootstrap, LookupWaitsForPublish) {
  auto server = TcpBootstrapServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = TcpBootstrapClient::Connect("127.0.0.1", (*server)->port());
  auto b = TcpBootstrapClient::Connect("127.0.0.1", (*server)->port());
  ASSERT_TRUE(a.ok() && b.ok());
  std::string blob("\0binary\xff", 8);
  std::thread later([&] { ASSERT_TRUE((*a)->Publish("g0/ucx/1", blob).ok()); });
  auto v = (*b)->Lookup("g0/ucx/1", base::MonotonicNow() + absl::Seconds(30));
  later.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, blob);
}

TEST(TcpBootstrap, MissingKeyRunsIntoTheDeadline) {
  auto server = TcpBootstrapServer::Start();
  ASSERT_TRUE(server.ok());
  auto a = TcpBootstrapClient::Connect("127.0.0.1", (*server)->port());
  ASSERT_TRUE(a.ok());
  auto v = (*a)->Lookup("never", base::MonotonicNow() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
  EXPECT_NE(v.status().message().find("never"), absl::string_view::npos);
}

TEST(TcpBootstrap, ServerGoneIsUnavailable) {
  auto server = TcpBootstrapServer::Start();
  ASSERT_TRUE(server.ok());
  auto a = TcpBootstrapClient::Connect("127.0.0.1", (*server)->port());
  ASSERT_TRUE(a.ok());
  server->reset();
  auto v = (*a)->Lookup("k", base::MonotonicNow() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
}

}  // namespace
}  // namespace troupe::collectives
