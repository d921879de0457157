// troupe/collectives/ucx_communicator.h — the UCX backend for host buffers across processes.
//
// Ranks on one host talk through shared memory, ranks on different hosts through UCX's network
// transports (tcp by default; verbs where `remote_transports` names them): each rank has one UCP
// worker for its own host and, when the world spans hosts, a second over the network. Which
// peers share a host is found at creation (boot id and IPC / mount namespaces, the properties
// shared memory depends on); worker addresses are exchanged through a Bootstrap, so no UCX
// listener is needed. Messages use UCX tag matching; the algorithms' scratch buffers are allocated
// once with ucp_mem_map and reused across calls.
//
// Large all-reduces between ranks that are all on one host read the peers' buffers directly
// (Linux cross-memory attach): one copy per byte instead of two through shared-memory queues.
// Small messages between ranks of one host go through shared-memory mailboxes instead of UCX.
//
// Failure detection does not rely on UCX: UCP_ERR_HANDLING_MODE_PEER would drop the
// shared-memory transports (docs/STACK.md). Instead every pair of ranks keeps a TCP liveness
// connection with heartbeats (to `address`: loopback when the world is on one host): EOF (a
// process that exited or was killed -9) fails every pending operation at once with Unavailable
// naming the rank; silence beyond `liveness_timeout` (SIGSTOP, a hung or cut-off host) does the
// same — silence while the rank's own monitor was not running (a paused VM, a starved host) does
// not count. Pending UCX requests are cancelled by the communicator itself.
//
// Example:
//   auto boot = TcpBootstrapClient::Connect(launcher_address, port);
//   UcxOptions o;  o.rank = r;  o.size = n;  o.generation = g;  o.key_prefix = "job7";
//   o.address = "10.0.0.7";  // this host's address on the network the others reach it by
//   absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateUcxCommunicator(boot->get(), o);
//   (*comm)->AllReduce(Buffer::F32(grad), Buffer::F32(grad), ReduceOp::kAvg, {}).Wait();
#ifndef TROUPE_COLLECTIVES_UCX_COMMUNICATOR_H_
#define TROUPE_COLLECTIVES_UCX_COMMUNICATOR_H_

#include <functional>
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
  // Bootstrap keys are "<key_prefix>/g<generation>/{ucx,ucx-net,live}/<rank>".
  std::string key_prefix = "troupe";
  absl::Duration connect_timeout = absl::Seconds(60);
  // Heartbeats on the liveness channel; a peer silent for `liveness_timeout` is declared dead.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration liveness_timeout = absl::Seconds(5);
  // Also ask UCX for peer error handling (UCP_ERR_HANDLING_MODE_PEER). Off by default: it
  // disables the shared-memory transports, and the liveness channel already detects deaths.
  bool ucx_peer_error_handling = false;
  // The IPv4 address this rank listens on (liveness) and its network lane uses: the address its
  // node advertises. Empty: 127.0.0.1 when every rank is on this host, else the first interface
  // that is up and not loopback.
  std::string address;
  // Transports to the ranks of other hosts (UCX_TLS syntax), on `remote_devices` (UCX_NET_DEVICES
  // syntax; empty: the interface that holds `address`). With InfiniBand or RoCE, e.g.
  // remote_transports = "rc,ud,tcp" and remote_devices = "mlx5_0:1,eth0".
  std::string remote_transports;
  std::string remote_devices;
  // UCX transports between the ranks of this host (UCX_TLS syntax). Empty: the UCX_TLS
  // environment variable if set, else kDefaultUcxTransports. Without peer error handling a
  // transport error is fatal inside UCX 1.13, and cma (process_vm_readv from a peer that was just
  // killed) raises one: the default therefore leaves cma out and keeps the
  // copy-through-shared-memory transports.
  std::string transports;
  // Single-copy all-reduce / reduce-scatter (Algorithm::kSingleCopy) between ranks on this host
  // whose memory this process may read (process_vm_readv; probed at creation, off where the
  // ptrace policy forbids it). A peer killed in the middle of a read is an Unavailable error.
  bool single_copy = true;
  // Small collective messages between ranks of this host (up to 8 KiB) through shared-memory
  // mailboxes (System V segments, gone with the last process that maps them), copied by the
  // ranks' own threads: no UCX on the path of a small all-reduce or barrier. Used only where
  // every rank of the host could attach every other's inbox; off, those messages take UCX.
  bool mailboxes = true;
  // Called on the liveness thread, once per dead peer, with the Unavailable status (blaming the
  // peer) that fails this communicator: e.g. to abort a device (NCCL) communicator of the same
  // group, whose own transport may not notice the death. Must not block.
  std::function<void(const absl::Status&)> on_peer_dead;
};

// Within a host: shared memory only (with tcp in the same context UCX 1.13 picks tcp/lo for the
// rendezvous lane, ~1 GB/s).
inline constexpr char kDefaultUcxTransports[] = "self,sysv,posix";
// Between hosts.
inline constexpr char kDefaultRemoteUcxTransports[] = "tcp";
// Between hosts, messages up to this many bytes go eagerly unless UCX_RNDV_THRESH is set: UCX's
// tcp default (rendezvous from 8 KiB) adds a handshake, a network round trip, to every larger
// message, and every phase of a collective pays it. Over tcp alone (the stock remote lane) every
// message goes eagerly (kTcpRndvThresh): besides the round trip, the rendezvous transfers to one
// peer share its connection at once, so the first message posted arrived with the last — an
// overlapped step's gradient pieces all landed at the end of the exchange, and a 200 Mbit/s link
// sat idle a fifth of the step waiting for them (bench/compare-multihost's capped cell: 127 →
// 161 tokens/s). Eagerly, a connection carries its messages one after another, in posting order;
// the price: a message that arrives before its receive is posted is held whole in UCX's buffers
// and copied once more. Any other transport list (an RDMA lane's zero-copy rendezvous) keeps the
// rendezvous above 1 MiB.
inline constexpr char kDefaultRemoteRndvThresh[] = "1048576";
inline constexpr char kTcpRndvThresh[] = "inf";
// Over tcp, UCX reads a connection in segments of this size unless UCX_TCP_RX_SEG_SIZE is set
// (UCX's default 64 KiB): a step's 135 MB a rank took ~2,000 reads where 512 KiB takes a few
// hundred (bench/compare-multihost's 0 ms 20M cell, six alternating pairs: 1-10 % more tokens/s
// in each, 13 % fewer context switches). The price: receive buffers of that size per connection.
// (Set through ucp_config_modify as "RX_SEG_SIZE": UCX 1.13 accepts "TCP_RX_SEG_SIZE" there and
// ignores it.)
inline constexpr char kTcpRxSegSize[] = "512K";

[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(
    Bootstrap* bootstrap, const UcxOptions& options);

// The UCX transports the endpoints of a UCX communicator selected (ucp_ep_print_info lanes),
// e.g. "rank 0 -> 1 (this host): ... posix/memory ..." or "rank 0 -> 2 (another host): ...
// tcp/eth0 ...". Empty for other communicators.
std::string DescribeUcxTransports(Communicator* comm);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_UCX_COMMUNICATOR_H_
