#include "troupe/runtime/status.h"

#include <gtest/gtest.h>

#include "caf/all.hpp"
#include "troupe/runtime/registry.h"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime {
namespace {

constexpr absl::StatusCode kEveryError[] = {
    absl::StatusCode::kCancelled,          absl::StatusCode::kUnknown,
    absl::StatusCode::kInvalidArgument,    absl::StatusCode::kDeadlineExceeded,
    absl::StatusCode::kNotFound,           absl::StatusCode::kAlreadyExists,
    absl::StatusCode::kPermissionDenied,   absl::StatusCode::kResourceExhausted,
    absl::StatusCode::kFailedPrecondition, absl::StatusCode::kAborted,
    absl::StatusCode::kOutOfRange,         absl::StatusCode::kUnimplemented,
    absl::StatusCode::kInternal,           absl::StatusCode::kUnavailable,
    absl::StatusCode::kDataLoss,           absl::StatusCode::kUnauthenticated};

TEST(StatusTest, EveryCodeRoundTripsThroughACafError) {
  for (absl::StatusCode code : kEveryError) {
    absl::Status s(code, "why: node 'a' has 2 GPUs");
    caf::error e = StatusToError(s);
    ASSERT_TRUE(static_cast<bool>(e)) << s;
    EXPECT_EQ(e.category(), kStatusErrorCategory);
    EXPECT_EQ(ErrorToStatus(e), s);
  }
  EXPECT_FALSE(static_cast<bool>(StatusToError(absl::OkStatus())));
  EXPECT_TRUE(ErrorToStatus(caf::error()).ok());
}

TEST(StatusTest, CafsOwnErrorsMapToTheNearestCodeNamingThePeer) {
  absl::Status t = ErrorToStatus(caf::make_error(caf::sec::request_timeout), "head");
  EXPECT_TRUE(absl::IsDeadlineExceeded(t)) << t;
  EXPECT_EQ(t.message().rfind("head: ", 0), 0u) << t;
  EXPECT_TRUE(absl::IsUnavailable(ErrorToStatus(caf::make_error(caf::sec::request_receiver_down))));
  EXPECT_TRUE(absl::IsUnavailable(
      ErrorToStatus(caf::make_error(caf::sec::disconnect_during_handshake), "head")));
  EXPECT_TRUE(
      absl::IsInvalidArgument(ErrorToStatus(caf::make_error(caf::sec::unexpected_message))));
  absl::Status text = ErrorToStatus(caf::make_error(caf::sec::runtime_error, "disk on fire"));
  EXPECT_TRUE(absl::IsUnknown(text)) << text;
  EXPECT_NE(text.message().find("disk on fire"), std::string::npos) << text;
  EXPECT_TRUE(absl::IsUnavailable(ErrorToStatus(caf::make_error(caf::exit_reason::kill))));
}

// The path the head and ClusterClient take: a handler's error reply reaches the asker as the same
// Status, and the system renders it as the Status would print.
caf::behavior Refuser(caf::event_based_actor*, absl::StatusCode code) {
  return {[code](const std::string& why) -> caf::result<int> {
    return StatusToError(absl::Status(code, why));
  }};
}

TEST(StatusTest, CrossesAMailboxAsAnErrorReply) {
  auto rt = Runtime::Create(ActorRegistry{});
  ASSERT_TRUE(rt.ok()) << rt.status();
  caf::actor_system& sys = (*rt)->system();
  auto refuser = sys.spawn(Refuser, absl::StatusCode::kResourceExhausted);
  caf::scoped_actor self{sys};
  absl::Status got;
  self->request(refuser, std::chrono::seconds(10), std::string("no node has 2 GPUs free"))
      .receive([&](int) { got = absl::InternalError("a value, not an error"); },
               [&](caf::error& e) {
                 got = ErrorToStatus(e, "refuser");
                 EXPECT_EQ(sys.render(e), "RESOURCE_EXHAUSTED: no node has 2 GPUs free");
               });
  EXPECT_EQ(got, absl::ResourceExhaustedError("no node has 2 GPUs free"));
  self->send_exit(refuser, caf::exit_reason::user_shutdown);
}

TEST(StatusTest, WireStatusKeepsCodeAndMessage) {
  absl::Status s = absl::DataLossError("shard-00001.bin: crc mismatch");
  EXPECT_EQ(WireStatus::From(s).ToStatus(), s);
  EXPECT_TRUE(WireStatus::From(absl::OkStatus()).ToStatus().ok());
}

}  // namespace
}  // namespace troupe::runtime
