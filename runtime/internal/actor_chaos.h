// internal/actor_chaos.h — the chaos schedule a Runtime reads from its environment
// (TROUPE_CHAOS_ACTORS, TROUPE_CHAOS_LOG, TROUPE_CHAOS_ACTORS_LIST; the format is in
// troupe/runtime/faults.h): its faults fired at their offsets from a thread of its own.
//
//   TROUPE_ASSIGN_OR_RETURN(chaos_, ActorChaos::FromEnvironment(ctx_));   // null: nothing set
//   ...
//   if (chaos_) chaos_->Stop();   // at Shutdown, before the actors are stopped
#ifndef TROUPE_RUNTIME_INTERNAL_ACTOR_CHAOS_H_
#define TROUPE_RUNTIME_INTERNAL_ACTOR_CHAOS_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/runtime/faults.h"

namespace troupe::runtime::internal {

class Context;

class ActorChaos {
 public:
  // From the environment (`getenv`, injectable for tests): null when neither
  // TROUPE_CHAOS_ACTORS nor TROUPE_CHAOS_ACTORS_LIST is set; InvalidArgument naming the
  // variable when the schedule is malformed. The schedule's clock starts now.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ActorChaos>> FromEnvironment(
      std::shared_ptr<Context> ctx,
      const std::function<const char*(const char*)>& getenv = nullptr);
  ~ActorChaos() { Stop(); }
  ActorChaos(const ActorChaos&) = delete;
  ActorChaos& operator=(const ActorChaos&) = delete;

  // Joins the thread (a fault not due yet never fires), then writes the actor list
  // (TROUPE_CHAOS_ACTORS_LIST). Idempotent.
  void Stop();

 private:
  ActorChaos(std::shared_ptr<Context> ctx, std::vector<ActorFault> faults, std::string log_path,
             std::string list_path);
  void Run();
  void Fire(const ActorFault& fault);

  std::shared_ptr<Context> ctx_;
  const std::vector<ActorFault> faults_;
  const std::string log_path_, list_path_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, stopped_ = false;
  std::thread thread_;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_ACTOR_CHAOS_H_
