// troupe/runtime/sim_cluster.h (test support) — cluster members that speak the real protocol to a
// real head, many per process (issue 45: 1,000 node agents and 8,192 workers cannot each be a
// process on one machine). Each member is a CAF actor with its own identity: it says hello,
// registers (nodes first, then each node's workers), heartbeats on its own clock (a delta with
// nothing busy, a full one when the head asks), answers spawns (with itself), and rejoins a
// head that took over at the same address. The members of one process share its connection to the
// head (CAF 0.17 keeps one per pair of processes); the head's work per member is the real one.
//
// Deaths: Exit ends a member's actor, which the head sees as it sees a process exit (its monitor
// of the member's handle fires); Silence stops its heartbeats, which only the heartbeat timeout
// reveals. A subscriber in the process records when the head's event of each death arrived.
#ifndef TROUPE_RUNTIME_SIM_CLUSTER_H_
#define TROUPE_RUNTIME_SIM_CLUSTER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::runtime::testing {

struct SimClusterOptions {
  std::string head_host = "127.0.0.1";
  uint16_t head_port = 0;
  std::string build_id;      // the head's (its --build_id)
  std::string prefix = "s";  // nodes <prefix><i>, workers <prefix><i>/w<j>
  int first_node = 0, nodes = 0, workers_per_node = 0;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::seconds join_timeout{120};
  // A node kills a worker the head fenced, as a node agent does; false: it has no handler for
  // the fence at all (a member that cannot handle one of the head's messages).
  bool nodes_kill_fenced = true;
};

class SimCluster {
 public:
  // Joins every member; returns once all are registered (or the first refusal, or the timeout).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SimCluster>> Start(SimClusterOptions o);
  ~SimCluster();
  // Monotonic (steady clock) nanoseconds.
  int64_t started_ns() const;
  int64_t joined_ns() const;                    // when the last member's registration was answered
  std::vector<std::string> member_ids() const;  // nodes, then workers
  // Ends member `id`'s actor; when it did.
  int64_t Exit(const std::string& id);
  // Stops member `id`'s heartbeats; when it did.
  int64_t Silence(const std::string& id);
  // When the head's event of `id`'s death (worker_down, node_dead) reached this process.
  std::optional<int64_t> DeathSeen(const std::string& id) const;
  // After the head was lost (at `since_ns` or later): waits until every member still alive
  // registered again with a head at the same address; when the last did.
  [[nodiscard]] absl::StatusOr<int64_t> AwaitRejoined(int64_t since_ns,
                                                      std::chrono::seconds timeout);
  int64_t spawns_served() const;

  struct State;

 private:
  SimCluster() = default;
  std::shared_ptr<State> st_;
};

}  // namespace troupe::runtime::testing

#endif  // TROUPE_RUNTIME_SIM_CLUSTER_H_
