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
    const auto& err = reply.get_as<caf::error>(0);
    if (err == caf::sec::request_receiver_down) {
      return absl::NotFoundError(absl::StrCat("actor '", to.name, "' has exited"));
    }
    absl::Status s = ErrorToStatus(err);
    return absl::Status(s.code(), absl::StrCat("actor '", to.name, "' failed: ", s.message()));
  }
  return reply;
}

}  // namespace

absl::StatusOr<caf::message> Runtime::Call(const ActorRef& to, const caf::message& request,
                                           Duration timeout) {
  if (shut_down_) return absl::FailedPreconditionError("Call: the runtime is shut down");
  if (auto local = ctx_->Lookup(to.name)) {
    if (to.generation != 0 && local->generation != to.generation) {
      return absl::NotFoundError(absl::StrCat("actor '", to.name, "' generation ", to.generation,
                                              " is gone (the name has generation ",
                                              local->generation, " now): look it up again"));
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
