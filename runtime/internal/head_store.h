// internal/head_store.h — where the head keeps what must outlive its process: its epoch, the
// membership generation, the members it knew, the named-actor directory and the jobs. One
// interface; SQLite (Debian's libsqlite3-dev) is the embedded implementation (`troupe head --store
// FILE`); etcd
// (`--store etcd://HOST:PORT[/PREFIX]`) the one for a standby head on another machine.
//
// Fencing: opening a store claims it with an epoch one above every claim before; every write
// checks, in its transaction, that no later claim has been made, and is refused otherwise
// (FailedPrecondition naming both epochs) — a head that was paused while another took over can
// never overwrite its successor's state.
#ifndef TROUPE_RUNTIME_INTERNAL_HEAD_STORE_H_
#define TROUPE_RUNTIME_INTERNAL_HEAD_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

struct StoredActor {
  std::string name, worker;
  uint64_t generation = 0;
  bool operator==(const StoredActor& o) const {
    return name == o.name && worker == o.worker && generation == o.generation;
  }
};

class HeadStore {
 public:
  virtual ~HeadStore() = default;

  // This head's claim on the store.
  virtual uint64_t epoch() const = 0;

  struct State {
    uint64_t generation = 0;          // the newest membership generation written
    std::vector<MemberInfo> members;  // by id
    std::vector<StoredActor> actors;  // by name
    // Jobs (runtime/internal/jobs.h): each one's record as JSON text, by id.
    std::vector<std::pair<std::string, std::string>> jobs;
  };
  [[nodiscard]] virtual absl::StatusOr<State> Load() = 0;

  // Membership changes: the newest generation and the records of the members they changed (each
  // id once). The head groups the changes that arrive together (head.cc), so a join of thousands
  // is a few writes, not one round trip each: SQLite writes them in one transaction; etcd in
  // transactions of at most kEtcdMembersPerTxn members, the generation with the last.
  [[nodiscard]] virtual absl::Status PutMembership(uint64_t generation,
                                                   const std::vector<MemberInfo>& members) = 0;
  [[nodiscard]] virtual absl::Status PutActor(const StoredActor& actor) = 0;
  [[nodiscard]] virtual absl::Status RemoveActor(const std::string& name) = 0;
  [[nodiscard]] virtual absl::Status PutJob(const std::string& id, const std::string& record) = 0;
};

// Opens (creating) the SQLite store at `path` and claims it. An unreadable or foreign file is an
// error naming it.
[[nodiscard]] absl::StatusOr<std::unique_ptr<HeadStore>> OpenSqliteHeadStore(
    const std::string& path);

// The store on etcd (runtime/etcd_store.cc), for heads on several machines: one leads, the others
// stand by. Opening it waits until no other head's leader lease holds it (a standby waits here),
// then claims it and keeps the lease alive; `on_lost` runs once if the leadership ends (the lease
// ran out, or a write was refused by a later epoch: this head was stopped or cut off meanwhile).
// etcd refuses a transaction of more than --max-txn-ops (128 by default) operations.
inline constexpr size_t kEtcdMembersPerTxn = 100;
struct EtcdStoreOptions {
  std::string endpoint;            // "http://HOST:PORT": an etcd client URL
  std::string prefix = "/troupe";  // the cluster's keys
  std::string address;             // this head's, written as the leader's
  Duration leader_ttl = std::chrono::seconds(5);
  std::function<void(const absl::Status&)> on_lost;
};
[[nodiscard]] absl::StatusOr<std::unique_ptr<HeadStore>> OpenEtcdHeadStore(
    EtcdStoreOptions options);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_HEAD_STORE_H_
