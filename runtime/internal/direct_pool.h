// internal/direct_pool.h — Runtime::Call's idle direct connections (see runtime/call.cc), and
// the errors a call and the direct server (direct.cc) report the same way.
#ifndef TROUPE_RUNTIME_INTERNAL_DIRECT_POOL_H_
#define TROUPE_RUNTIME_INTERNAL_DIRECT_POOL_H_

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "caf/error.hpp"
#include "caf/message.hpp"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/direct.h"

namespace troupe::runtime {
class Runtime;
namespace internal {

// An actor's error reply as the Status its caller gets: its code kept (StatusToError), the actor
// named; an actor gone before it answered is NotFound.
absl::Status ActorErrorToStatus(const caf::error& err, const std::string& actor);
// A call bound to generation `wanted` of `name`, which generation `now` holds: NotFound.
absl::Status GenerationGone(const std::string& name, uint64_t wanted, uint64_t now);

// Idle direct connections by (endpoint, actor, generation). A call takes one (or opens one) and
// gives it back, so calls from several threads run side by side, each on its own socket.
class DirectPool {
 public:
  explicit DirectPool(Runtime& runtime) : runtime_(runtime) {}

  absl::StatusOr<caf::message> Call(const ActorRef& to, const caf::message& request,
                                    Duration timeout) {
    Key key{to.direct, to.name, to.generation};
    std::unique_ptr<DirectClient> client;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = idle_.find(key);
      if (it != idle_.end() && !it->second.empty()) {
        client = std::move(it->second.back());
        it->second.pop_back();
      }
    }
    if (!client) {
      auto where = ParseHostPort(to.direct);
      if (!where.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("ActorRef '", to.name, "': direct is '",
                                                       to.direct, "', expected HOST:PORT"));
      }
      DirectClientOptions o;
      o.generation = to.generation;
      o.connect_timeout = std::min<Duration>(timeout, std::chrono::seconds(2));
      TROUPE_ASSIGN_OR_RETURN(
          auto made, DirectClient::Connect(runtime_, where->first, where->second, to.name, o));
      client = std::move(made);
    }
    absl::StatusOr<caf::message> reply = client->Call(request, timeout);
    std::lock_guard<std::mutex> l(mu_);
    auto& idle = idle_[key];
    if (idle.size() < kMaxIdle) idle.push_back(std::move(client));  // reconnects if it dropped
    return reply;
  }

 private:
  static constexpr size_t kMaxIdle = 16;  // per key: beyond this, a call's connection closes
  using Key = std::tuple<std::string, std::string, uint64_t>;
  Runtime& runtime_;
  std::mutex mu_;
  std::map<Key, std::vector<std::unique_ptr<DirectClient>>> idle_;
};

}  // namespace internal

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_INTERNAL_DIRECT_POOL_H_
