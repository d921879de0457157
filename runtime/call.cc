// Runtime::Call (troupe/runtime/runtime.h): an actor of another process over its process's direct
// channel, on a pooled connection; an actor of this one (or of a process without a direct
// channel) through CAF.
#include <future>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "caf/actor_companion.hpp"
#include "caf/all.hpp"
#include "internal/context.h"
#include "internal/direct_pool.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/direct.h"
#include "troupe/runtime/runtime.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {

namespace {

// A request through CAF, answered to a hidden companion whose reply (or error) a promise carries
// to this thread.
absl::StatusOr<caf::message> CallThroughCaf(caf::actor_system& sys, const ActorRef& to,
                                            caf::message request, Duration timeout) {
  auto promise = std::make_shared<std::promise<caf::message>>();
  auto future = promise->get_future();
  auto sink = sys.spawn<caf::actor_companion, caf::hidden>();
  auto* companion = caf::actor_cast<caf::actor_companion*>(sink);
  auto once = std::make_shared<std::once_flag>();
  companion->on_enqueue([promise, once](caf::mailbox_element_ptr ptr) {
    if (!ptr->mid.is_response()) return;
    std::call_once(*once, [&] { promise->set_value(ptr->move_content_to_message()); });
  });
  if (to.generation != 0) {
    request = caf::make_message(to_gen_atom::value, to.generation, std::move(request));
  }
  auto* dest = caf::actor_cast<caf::abstract_actor*>(to.handle);
  dest->enqueue(caf::make_mailbox_element(caf::actor_cast<caf::strong_actor_ptr>(sink),
                                          caf::make_message_id(1), {}, std::move(request)),
                nullptr);
  bool answered = future.wait_for(timeout) == std::future_status::ready;
  companion->on_enqueue(nullptr);
  if (!answered) {
    return absl::UnavailableError(
        absl::StrCat("call to '", to.name, "': no reply within ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(),
                     " ms (its process hung or dead, or the incarnation was replaced)"));
  }
  caf::message reply = future.get();
  if (reply.match_elements<caf::error>()) {
    return internal::ActorErrorToStatus(reply.get_as<caf::error>(0), to.name);
  }
  return reply;
}

}  // namespace

namespace internal {

absl::Status ActorErrorToStatus(const caf::error& err, const std::string& actor) {
  if (err == caf::sec::request_receiver_down) {
    return absl::NotFoundError(absl::StrCat("actor '", actor, "' has exited"));
  }
  absl::Status s = ErrorToStatus(err);
  return absl::Status(s.code(), absl::StrCat("actor '", actor, "' failed: ", s.message()));
}

absl::Status GenerationGone(const std::string& name, uint64_t wanted, uint64_t now) {
  return absl::NotFoundError(absl::StrCat("actor '", name, "' generation ", wanted,
                                          " is gone (the name has generation ", now,
                                          " now): look it up again"));
}

}  // namespace internal

absl::StatusOr<caf::message> Runtime::Call(const ActorRef& to, const caf::message& request,
                                           Duration timeout) {
  if (shut_down_) return absl::FailedPreconditionError("Call: the runtime is shut down");
  if (auto local = ctx_->Lookup(to.name)) {
    if (to.generation != 0 && local->generation != to.generation) {
      return internal::GenerationGone(to.name, to.generation, local->generation);
    }
    if (local->handle == to.handle) return CallThroughCaf(*system_, to, request, timeout);
  }
  if (!to.direct.empty()) return direct_pool_->Call(to, request, timeout);
  if (!to.handle) {
    return absl::InvalidArgumentError(absl::StrCat("Call: ActorRef '", to.name, "' is empty"));
  }
  return CallThroughCaf(*system_, to, request, timeout);
}

}  // namespace troupe::runtime
