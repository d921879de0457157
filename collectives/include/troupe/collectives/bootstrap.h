// troupe/collectives/bootstrap.h — how ranks find each other before any collective runs.
//
// A Bootstrap publishes opaque blobs (UCX worker addresses, liveness endpoints, an NCCL unique
// id) under string keys and looks them up, waiting until they appear. The actors layer
// implements it over the runtime; this module ships a standalone TCP key-value server and
// client for its own tests and benchmarks (loopback only, no authentication).
//
// Example:
//   auto server = TcpBootstrapServer::Start();            // in the launcher
//   auto boot = TcpBootstrapClient::Connect("127.0.0.1", (*server)->port());  // in each rank
//   (*boot)->Publish("job/g0/ucx/3", address_blob);
//   absl::StatusOr<std::string> a =
//       (*boot)->Lookup("job/g0/ucx/1", base::MonotonicNow() + absl::Seconds(30));
//
// Every deadline here is on base::MonotonicNow()'s clock (troupe/base/clock.h), never absl::Now():
// an implementation compares it with base::MonotonicNow().
#ifndef TROUPE_COLLECTIVES_BOOTSTRAP_H_
#define TROUPE_COLLECTIVES_BOOTSTRAP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "troupe/base/clock.h"

namespace troupe::collectives {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  // Publishes `value` under `key` (a later publish of the same key replaces it).
  [[nodiscard]] virtual absl::Status Publish(const std::string& key, const std::string& value) = 0;
  // Returns the value under `key`, waiting until it is published; DeadlineExceeded after
  // `deadline` (base::MonotonicNow()'s clock), Unavailable if the store went away.
  [[nodiscard]] virtual absl::StatusOr<std::string> Lookup(const std::string& key,
                                                           absl::Time deadline) = 0;
  // The values under every key of `keys`, in order, waiting until all are published: a rank's
  // every peer in one round trip where the store can (the coordinator's: O(W) requests per
  // generation instead of O(W²)); here, one Lookup after another.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> LookupAll(
      const std::vector<std::string>& keys, absl::Time deadline);
};

// A key-value server on `address` (one thread per client): 127.0.0.1 for ranks on this host, an
// address the other hosts reach for ranks on several. Limits: keys up to 4 KiB, values up to
// 16 MiB; a client that exceeds them is disconnected.
class TcpBootstrapServer {
 public:
  virtual ~TcpBootstrapServer() = default;
  // port 0 picks a free port.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TcpBootstrapServer>> Start(
      int port = 0, const std::string& address = "127.0.0.1");
  virtual int port() const = 0;
};

class TcpBootstrapClient : public Bootstrap {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TcpBootstrapClient>> Connect(
      const std::string& host, int port,
      absl::Time deadline = base::MonotonicNow() + absl::Seconds(30));
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_BOOTSTRAP_H_
