// internal/roles.h — the process roles RunMain dispatches to, and what they share.
#ifndef TROUPE_RUNTIME_INTERNAL_ROLES_H_
#define TROUPE_RUNTIME_INTERNAL_ROLES_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

int HeadMain(const std::vector<std::string>& args, ActorRegistry registry);
int NodeMain(const std::vector<std::string>& args, ActorRegistry registry);
int WorkerMain(const std::vector<std::string>& args, ActorRegistry registry);
int UpMain(const std::vector<std::string>& args);
int CertsMain(const std::vector<std::string>& args);

// Sends heartbeats (this process's tracked actors) to the head until stopped.
class HeartbeatSender {
 public:
  HeartbeatSender(Runtime& runtime, caf::actor head, std::string id, Duration interval);
  ~HeartbeatSender();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Blocks SIGTERM, SIGINT and SIGCHLD in this thread (and in threads created afterwards), so a
// role's main thread can wait for them with sigtimedwait.
void BlockRoleSignals();

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_ROLES_H_
