// troupe/collectives/ucx_communicator.h — the UCX backend for host buffers across processes.
//
// One UCP worker per rank; worker addresses are exchanged through a Bootstrap (no listener, so
// shared-memory transports work and UCX_TLS needs no tcp). Messages use UCX tag matching; the
// algorithms' scratch buffers are allocated once with ucp_mem_map and reused across calls.
//
// Large all-reduces between ranks on one host read the peers' buffers directly (Linux
// cross-memory attach): one copy per byte instead of two through shared-memory queues.
//
// Failure detection does not rely on UCX: UCP_ERR_HANDLING_MODE_PEER would drop the
// shared-memory transports (STACK.md). Instead every pair of ranks keeps a loopback TCP
// liveness connection with heartbeats: EOF (a process that exited or was killed -9) fails every
// pending operation at once with Unavailable naming the rank; silence beyond
// `liveness_timeout` (SIGSTOP, a hung host) does the same. Pending UCX requests are cancelled
// by the communicator itself.
//
// Example:
//   auto boot = TcpBootstrapClient::Connect("127.0.0.1", port);
//   UcxOptions o;  o.rank = r;  o.size = n;  o.generation = g;  o.key_prefix = "job7";
//   absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateUcxCommunicator(boot->get(), o);
//   (*comm)->AllReduce(Buffer::F32(grad), Buffer::F32(grad), ReduceOp::kAvg, {}).Wait();
#ifndef TROUPE_COLLECTIVES_UCX_COMMUNICATOR_H_
#define TROUPE_COLLECTIVES_UCX_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

struct UcxOptions {
  int rank = 0;
  int size = 1;
  uint64_t generation = 0;
  // Bootstrap keys are "<key_prefix>/g<generation>/{ucx,live}/<rank>".
  std::string key_prefix = "troupe";
  absl::Duration connect_timeout = absl::Seconds(60);
  // Heartbeats on the liveness channel; a peer silent for `liveness_timeout` is declared dead.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration liveness_timeout = absl::Seconds(5);
  // Also ask UCX for peer error handling (UCP_ERR_HANDLING_MODE_PEER). Off by default: it
  // disables the shared-memory transports, and the liveness channel already detects deaths.
  bool ucx_peer_error_handling = false;
  // UCX transports (UCX_TLS syntax). Empty: the UCX_TLS environment variable if set, else
  // kDefaultUcxTransports. Without peer error handling a transport error is fatal inside UCX
  // 1.13, and cma (process_vm_readv from a peer that was just killed) raises one: the default
  // therefore leaves cma out and keeps the copy-through-shared-memory transports.
  std::string transports;
  // Single-copy all-reduce / reduce-scatter (Algorithm::kSingleCopy) between ranks on this host
  // whose memory this process may read (process_vm_readv; probed at creation, off where the
  // ptrace policy forbids it). A peer killed in the middle of a read is an Unavailable error.
  bool single_copy = true;
};

// Same-host shared memory only: with tcp present UCX 1.13 picks tcp/lo for the rendezvous lane
// (~1 GB/s). For ranks on several hosts set `transports` (e.g. "self,sysv,posix,tcp").
inline constexpr char kDefaultUcxTransports[] = "self,sysv,posix";

[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(
    Bootstrap* bootstrap, const UcxOptions& options);

// The UCX transports the endpoints of a UCX communicator selected (ucp_ep_print_info lanes),
// e.g. "rank 0 -> 1: posix/memory cma/memory". Empty for other communicators.
std::string DescribeUcxTransports(Communicator* comm);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_UCX_COMMUNICATOR_H_
