// internal/roles.h — the process roles RunMain dispatches to, and what they share.
#ifndef TROUPE_RUNTIME_INTERNAL_ROLES_H_
#define TROUPE_RUNTIME_INTERNAL_ROLES_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "caf/message.hpp"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

int HeadMain(const std::vector<std::string>& args, ActorRegistry registry);
int NodeMain(const std::vector<std::string>& args, ActorRegistry registry);
int WorkerMain(const std::vector<std::string>& args, ActorRegistry registry);
int UpMain(const std::vector<std::string>& args);
int CertsMain(const std::vector<std::string>& args);
int StatusMain(const std::vector<std::string>& args);
int RelayMain(const std::vector<std::string>& args);  // relay.cc

// Sends heartbeats (this process's tracked actors) to the head until stopped; to the new one
// after SetHead (a head that took over).
class HeartbeatSender {
 public:
  HeartbeatSender(Runtime& runtime, caf::actor head, std::string id, Duration interval);
  ~HeartbeatSender();
  void SetHead(caf::actor head);

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  caf::actor head_;
  bool new_head_ = false;
  std::thread thread_;
};

// The boot every member of a cluster (node agent, worker) shares, written once:
//   auto m = StartMember(head_addr, runtime_options, registry);     // runtime + head connection
//   auto gen = JoinCluster(m->runtime->system(), m->head, co, "node", name,
//                          caf::make_message(reg_node_atom::value, ...));  // hello, then register
//   if (!gen.ok()) ExitRole("node", name, gen.status());
struct ClusterMember {
  std::unique_ptr<Runtime> runtime;
  caf::actor head;
};
// A networked runtime connected to the head at `head_addr` (HOST:PORT), trying for up to
// `join_timeout` while nothing listens there (a head still starting, as when every pod of a job
// starts at once). InvalidArgument for a bad address or option, Unavailable when the head cannot be
// reached.
[[nodiscard]] absl::StatusOr<ClusterMember> StartMember(const std::string& head_addr,
                                                        RuntimeOptions options,
                                                        ActorRegistry registry,
                                                        Duration join_timeout);
// The join handshake: (cluster_hello_atom, kClusterProtocolVersion, build id, kind, name) — the
// head refuses another protocol version or build with FailedPrecondition — then `registration`
// (reg_node_atom or reg_worker_atom, internal/cluster_protocol.h). Returns the cluster generation.
[[nodiscard]] absl::StatusOr<uint64_t> JoinCluster(caf::actor_system& sys, const caf::actor& head,
                                                   const ClusterOptions& options,
                                                   const std::string& kind, const std::string& name,
                                                   const caf::message& registration);
// After the head was lost: connects again to `head_addr` (the head restarted, or a standby that
// took over that address) and joins it with the same registration, retrying until
// `options.head_grace` has passed — the member's processes and actors keep running meanwhile. On
// success the runtime's head is the new one. Unavailable naming the address and the grace after
// it; an error the head answers with other than "not yet" (this member refused) at once.
[[nodiscard]] absl::StatusOr<caf::actor> RejoinHead(Runtime& runtime, const std::string& head_addr,
                                                    const ClusterOptions& options,
                                                    const std::string& kind,
                                                    const std::string& name,
                                                    const caf::message& registration);
// Prints "troupe <role> <name>: <status>" and exits the process at once (hosted actors may be
// stuck; nothing is awaited) with 2 for a bad option, 3 when the head refused this member (another
// protocol version or build, a duplicate name), 1 otherwise (the head unreachable or lost).
[[noreturn]] void ExitRole(const std::string& role, const std::string& name,
                           const absl::Status& status);

// This host's name (gethostname).
std::string HostName();
// The IPv4 address of this host on the route to `head_addr` (HOST:PORT): the address a node
// advertises by default (127.0.0.1 for a head on loopback). InvalidArgument for a bad address,
// Unavailable when no route leads there.
[[nodiscard]] absl::StatusOr<std::string> AddressTowards(const std::string& head_addr);

// Blocks SIGTERM, SIGINT and SIGCHLD in this thread (and in threads created afterwards), so a
// role's main thread can wait for them with sigtimedwait.
void BlockRoleSignals();

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_ROLES_H_
