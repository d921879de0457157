// Private: small blocking-socket helpers (IPv4 TCP) for the bootstrap and liveness channel.
// Every deadline is on base::MonotonicNow()'s clock (troupe/base/clock.h).
#ifndef TROUPE_COLLECTIVES_NET_H_
#define TROUPE_COLLECTIVES_NET_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace troupe::collectives::net {

// Listens on address:port (an IPv4 address; port 0: any free port); returns the fd and sets
// *bound_port.
[[nodiscard]] absl::StatusOr<int> Listen(const std::string& address, int port, int* bound_port);
// Connects to host:port (an IPv4 address), retrying refused connections until `deadline`; an
// unanswered connection attempt (a peer behind a partition) also ends at `deadline`.
[[nodiscard]] absl::StatusOr<int> Connect(const std::string& host, int port, absl::Time deadline);
// Waits for a connection until `deadline`.
[[nodiscard]] absl::StatusOr<int> Accept(int listen_fd, absl::Time deadline);
// Reads exactly n bytes. Unavailable on EOF or error, DeadlineExceeded after `deadline`.
[[nodiscard]] absl::Status ReadFull(int fd, void* buf, size_t n, absl::Time deadline);
[[nodiscard]] absl::Status WriteFull(int fd, const void* buf, size_t n);
void SetNoDelay(int fd);
// The IPv4 address of the first interface that is up and not loopback; NotFound if none.
[[nodiscard]] absl::StatusOr<std::string> FirstExternalAddress();
// The name of the interface that holds IPv4 `address` ("eth0"); NotFound if none does.
[[nodiscard]] absl::StatusOr<std::string> InterfaceOf(const std::string& address);
// Where shared memory reaches: processes with the same boot id and IPC and mount namespaces share
// System V and POSIX shared memory (UCX's own reachability test compares the same). Two node
// agents of one machine are one host here; two containers or lab hosts are not.
std::string HostKey();

}  // namespace troupe::collectives::net

#endif  // TROUPE_COLLECTIVES_NET_H_
