#include "troupe/runtime/actor.h"

#include <thread>

#include "caf/actor_system.hpp"
#include "caf/exit_reason.hpp"
#include "caf/mailbox_element.hpp"
#include "caf/message_id.hpp"
#include "caf/sec.hpp"
#include "caf/system_messages.hpp"
#include "internal/context.h"
#include "internal/mesh.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {
namespace {

using delayed_atom = caf::atom_constant<caf::atom("tr_delay")>;

// System messages (exits, downs, timeouts, errors) and responses are not "application
// messages": they are not counted and faults never apply to them.
bool IsApplicationMessage(const caf::mailbox_element& x) {
  if (x.mid.is_response()) return false;
  const auto& c = x.content();
  if (c.empty()) return true;
  return !(c.match_element<caf::exit_msg>(0) || c.match_element<caf::down_msg>(0) ||
           c.match_element<caf::timeout_msg>(0) || c.match_element<caf::error>(0));
}

std::string FirstAtom(const caf::mailbox_element& x) {
  const auto& c = x.content();
  if (!c.empty() && c.match_element<caf::atom_value>(0)) {
    return caf::to_string(c.get_as<caf::atom_value>(0));
  }
  return "";
}

}  // namespace

Actor::Actor(caf::actor_config& cfg, std::string name, uint64_t generation,
             std::shared_ptr<internal::Context> ctx)
    : caf::event_based_actor(cfg),
      name_(std::move(name)),
      generation_(generation),
      ctx_(std::move(ctx)),
      stats_(std::make_shared<ActorStats>()) {
  stats_->name = name_;
  stats_->generation = generation_;
  if (!name_.empty()) ctx_->Track(stats_);
}

Actor::~Actor() {
  if (!name_.empty()) ctx_->Untrack(stats_.get());
}

caf::actor Actor::cluster_head() { return ctx_->head(); }

void Actor::ConnectTo(const std::string& worker) { internal::ReachWorker(*ctx_, worker); }

caf::invoke_message_result Actor::ConsumeInner(caf::mailbox_element& x, caf::message inner) {
  auto unwrapped =
      caf::make_mailbox_element(std::move(x.sender), x.mid, std::move(x.stages), std::move(inner));
  return caf::event_based_actor::consume(*unwrapped);
}

caf::invoke_message_result Actor::consume(caf::mailbox_element& x) {
  if (!IsApplicationMessage(x)) return caf::event_based_actor::consume(x);
  const auto& c = x.content();
  // A message the fault injector delayed: deliver now, no second look.
  if (c.size() == 2 && c.match_element<delayed_atom>(0) && c.match_element<caf::message>(1)) {
    return ConsumeInner(x, c.get_as<caf::message>(1));
  }
  // A message addressed to one incarnation.
  if (c.size() == 3 && c.match_element<to_gen_atom>(0) && c.match_element<uint64_t>(1) &&
      c.match_element<caf::message>(2)) {
    uint64_t to = c.get_as<uint64_t>(1);
    if (to != generation_) {
      ctx_->Emit(base::SupervisionEvent{
          {}, "", name_, generation_, "drop", "addressed to generation " + std::to_string(to), ""});
      return caf::invoke_message_result::dropped;
    }
    caf::message inner = c.get_as<caf::message>(2);
    auto unwrapped =
        caf::make_mailbox_element(std::move(x.sender), x.mid, std::move(x.stages), inner);
    return consume(*unwrapped);  // counted and fault-checked as the inner message
  }
  uint64_t index = stats_->progress.fetch_add(1, std::memory_order_relaxed) + 1;
  FaultInjector& faults = ctx_->faults();
  if (faults.armed()) {
    auto d = faults.OnMessage(name_, index, FirstAtom(x));
    switch (d.kind) {
      case FaultInjector::Decision::Kind::kDeliver:
        break;
      case FaultInjector::Decision::Kind::kDrop:
        return caf::invoke_message_result::dropped;
      case FaultInjector::Decision::Kind::kDelay: {
        auto msg = caf::make_message(delayed_atom::value, x.move_content_to_message());
        auto element = caf::make_mailbox_element(std::move(x.sender), x.mid, std::move(x.stages),
                                                 std::move(msg));
        clock().schedule_message(clock().now() + d.delay, caf::strong_actor_ptr{ctrl()},
                                 std::move(element));
        return caf::invoke_message_result::consumed;
      }
      case FaultInjector::Decision::Kind::kHang:
        stats_->busy_since_ns.store(std::chrono::steady_clock::now().time_since_epoch().count() | 1,
                                    std::memory_order_relaxed);
        std::this_thread::sleep_for(d.delay);  // stuck, as far as anyone can tell
        break;
      case FaultInjector::Decision::Kind::kFail:
        quit(StatusToError(absl::InternalError(d.reason)));
        return caf::invoke_message_result::consumed;
    }
  }
  stats_->busy_since_ns.store(
      std::chrono::steady_clock::now().time_since_epoch().count() | 1,  // never 0 while busy
      std::memory_order_relaxed);
  auto result = caf::event_based_actor::consume(x);
  stats_->busy_since_ns.store(0, std::memory_order_relaxed);
  return result;
}

}  // namespace troupe::runtime
