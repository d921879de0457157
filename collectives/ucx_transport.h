// Private: the UCX backend's Transport — one UCP worker per lane, tag-matched messages, the
// shared-memory mailboxes and cross-memory attach between ranks of one host. The Engine runs the
// collective algorithms over it.
//
// Its two halves live in two files:
//   ucx_communicator.cc  set-up and tear-down: Init, Open a lane, Address, Connect the endpoints,
//                        ProbeLocalPeers (single copy, mailboxes), Describe, the destructor —
//                        and CreateUcxCommunicator, which runs the bootstrap rounds around them;
//   ucx_transport.cc     the operations: Post*, WaitAll, Test, CancelAll, ReadPeer, Scratch, the
//                        request table and the progress loop.
//
// Lifecycle (set-up calls in CreateUcxCommunicator's order; any failure ends it):
//
//   constructed ──Init──> local lane open ──[Open(kRemote)]──> lanes open
//        ──Connect──> endpoints ──ProbeLocalPeers──> running ──(1)──> failed ──(2)──> destroyed
//   (1) a request fails, a deadline passes, or Fail() (the liveness monitor): sticky, every later
//       call returns that status; CancelAll reaps what is in flight.
//   (2) healthy: endpoints flushed and closed, workers destroyed; after a failure with requests in
//       flight the workers are leaked on purpose (see the destructor).
//
// Threads: everything but Fail() runs on the engine's executor thread (or the creating thread,
// before the engine exists); Fail() may come from any thread (the liveness monitor).
#ifndef TROUPE_COLLECTIVES_UCX_TRANSPORT_H_
#define TROUPE_COLLECTIVES_UCX_TRANSPORT_H_

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "mailbox.h"
#include "transport.h"
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/ucx_communicator.h"

namespace troupe::collectives {

// UCX's return code as a Status (OK for UCS_OK), naming the call, for TROUPE_RETURN_IF_ERROR.
#define TROUPE_UCX_CALL(expr) \
  ::troupe::collectives::UcxCallStatus((expr), #expr, __FILE__, __LINE__)
inline absl::Status UcxCallStatus(ucs_status_t s, const char* what, const char* file, int line) {
  if (s == UCS_OK) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", what, " failed: ", ucs_status_string(s)));
}

// One message in flight: a UCX request, or a mailbox message waiting for a slot or its data.
struct UcxRequest {
  bool live = false;  // handed out and not yet reaped
  bool done = false;
  bool recv = false;
  ucs_status_t status = UCS_OK;
  void* ucx = nullptr;  // UCX request, freed when reaped
  void* buf = nullptr;  // mailbox request: the user's buffer
  int peer = 0;
  size_t bytes = 0;
  uint64_t tag = 0;                 // the 48-bit message tag
  uint64_t* completions = nullptr;  // its transport's count of completed UCX requests
};

class UcxTransport : public Transport {
 public:
  // The lanes: shared memory for the ranks of this host, UCX's network transports for the others
  // (two UCP contexts, since with tcp in one context UCX 1.13 moves large messages between ranks
  // of one host over tcp/lo).
  enum LaneKind { kLocal = 0, kRemote = 1 };

  UcxTransport(int rank, int size);
  ~UcxTransport() override;

  // --- set-up (ucx_communicator.cc) ---
  // Opens the local lane (UcxOptions.transports) and sizes the idle policy to the usable vCPUs.
  [[nodiscard]] absl::Status Init(const UcxOptions& o);
  // Opens a lane: a UCP context over `tls` (restricted to `devices` when not empty) and its
  // worker; with `wakeup`, one whose waiters can block on its events (HasEvents).
  [[nodiscard]] absl::Status Open(LaneKind kind, const std::string& tls, const std::string& devices,
                                  bool wakeup = false);
  // The lane's worker address, for the peers to connect to.
  [[nodiscard]] absl::StatusOr<std::string> Address(LaneKind kind);
  // addrs[j]: peer j's worker address on lane lanes[j].
  [[nodiscard]] absl::Status Connect(const std::vector<std::string>& addrs,
                                     const std::vector<LaneKind>& lanes);
  // The ranks of this host agree on single copy and mailboxes (see the definition).
  [[nodiscard]] absl::Status ProbeLocalPeers(Bootstrap* boot, const std::string& prefix,
                                             bool want_single_copy, bool want_mailboxes,
                                             absl::Time deadline);
  // What DescribeUcxTransports prints: the paths in use and each endpoint's UCX lanes.
  std::string Describe();

  // --- Transport (ucx_transport.cc) ---
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::StatusOr<ReqId> PostSend(int peer, uint64_t tag, const void* buf, size_t bytes) override;
  absl::StatusOr<ReqId> PostRecv(int peer, uint64_t tag, void* buf, size_t bytes) override;
  absl::Status WaitAll(absl::Span<const ReqId> ids, absl::Time deadline) override;
  absl::StatusOr<bool> Test(ReqId id) override;
  void CancelAll() override;
  void Fail(absl::Status status) override;
  bool CanReadPeers() const override { return single_copy_; }
  absl::Duration max_nap() const override { return max_nap_; }
  // Events: only while the network lane is the only one in use (shared memory and the mailboxes
  // have no file descriptor to wait on); the lane's worker fd (UCP_FEATURE_WAKEUP).
  bool HasEvents() const override { return events_.load(std::memory_order_relaxed); }
  bool ArmForEvents() override;
  void BlockForEvents(absl::Duration max) override;
  void Wake() override;
  Mailboxes* HostShared() override { return all_local_ ? boxes_.get() : nullptr; }
  absl::Status WaitUntil(absl::FunctionRef<bool()> ready, absl::Time deadline) override;
  absl::Status ReadPeer(int peer, uint64_t remote, void* local, size_t bytes) override;
  void* Scratch(int slot, size_t bytes) override;

 private:
  struct Region {
    ucp_mem_h memh = nullptr;
    void* ptr = nullptr;
    size_t size = 0;
    std::vector<uint8_t> heap;
  };
  struct Lane {
    ucp_context_h context = nullptr;
    ucp_worker_h worker = nullptr;
    bool used = false;  // some peer is reached through it
    int efd = -1;       // its worker's event fd (the network lane's), -1: none
  };

  // --- set-up helpers (ucx_communicator.cc) ---
  static const std::string& BootId();

  // --- operations' helpers (ucx_transport.cc) ---
  // process_vm_readv until all `bytes` arrived; false (errno set) if the peer is gone or
  // unreadable (also ProbeLocalPeers' test of whether a peer's memory is readable).
  static bool ReadFrom(pid_t pid, uint64_t remote, void* local, size_t bytes);
  // Declared inline and defined in ucx_transport.cc only, where the operations call them: the
  // compiler inlines them into the per-message path as it did when they were defined in the
  // class (under -fPIC it never inlines a plain member function, which another library could
  // interpose), and a use from another file fails the build ("used but never defined").
  inline absl::Status failure();
  inline absl::Status FailWith(absl::Status st);
  inline std::string DescribePending(absl::Span<const ReqId> ids);
  inline absl::Status PeerError(const UcxRequest* r);
  inline std::pair<ReqId, UcxRequest*> NewReq(int peer, uint64_t tag, size_t bytes, bool recv);
  inline absl::StatusOr<ReqId> Track(ReqId id, void* r, const char* what, int peer);
  inline void Reap(ReqId id);
  inline bool ViaBox(int peer, uint64_t tag, size_t bytes) const;
  inline unsigned ProgressBoxes();
  inline void IdleWait(int idle);
  inline bool Napping(int idle) const;
  bool MoveOffSharedCpu();
  inline unsigned ProgressUcx();
  inline unsigned Progress();

  const int rank_, size_;
  bool peer_errors_ = false;
  bool dirty_ = false;  // an operation failed with requests in flight
  Lane lanes_[2];
  std::vector<LaneKind> lane_of_;  // by peer rank
  std::vector<ucp_ep_h> eps_;
  // Requests by id, reused once reaped (free_ids_). Pointers are stable: UCX's callbacks hold
  // them. kCompleted (id 0) is what a request that completed as it was posted gets: a mailbox
  // message that went or came at once takes no entry (it is done, never live, never reaped).
  static constexpr ReqId kCompleted = 0;
  std::vector<std::unique_ptr<UcxRequest>> reqs_;
  std::vector<ReqId> free_ids_;
  std::list<std::unique_ptr<UcxRequest>> abandoned_;
  int live_ucx_ = 0;  // requests handed to UCX and not yet reaped
  unsigned ucx_skips_ = 0;
  // Shared-memory mailboxes to the ranks of this host (null: off); requests waiting on them.
  std::unique_ptr<Mailboxes> boxes_;
  std::vector<ReqId> box_sends_, box_recvs_;
  std::vector<int> box_queued_;  // by peer: sends in box_sends_
  std::vector<int> blocked_;     // ProgressBoxes: peers whose oldest queued send is still waiting
  bool single_copy_ = false;
  bool all_local_ = false;       // every rank is on this host
  std::vector<pid_t> pids_;      // peers' pids, for ReadPeer
  uint64_t cookie_[2] = {0, 0};  // random words the peers read back (ProbeLocalPeers)
  // Idle progress polls before WaitAll yields the CPU: spin while every rank may have a vCPU of
  // its own (a yield is a system call that delays the next poll), for ~2 ms (65536 polls; with
  // 2048 or 16384 polls one launch in four ran 8-byte all-reduces 2-8x slower); yield at every
  // idle poll when ranks outnumber the vCPUs this process may use (the peer being waited for may
  // need this one) — OpenMPI's yield-when-idle rule — or while a peer of this host last waited
  // on this rank's vCPU (shares_cpu_, looked at every 64 idle polls, and at every one while
  // it is set; IdleWait).
  int spins_before_yield_ = 64;
  bool shares_cpu_ = false;
  absl::Time next_move_ = absl::InfinitePast();  // MoveOffSharedCpu: not before
  int spun_ = 64;  // idle polls the current wait spins before it yields (IdleWait)
  // The current wait is for messages of at most kLatencyBoundBytes (WaitAll): its time is the
  // hand-overs', not the copies' (MoveOffSharedCpu).
  static constexpr size_t kLatencyBoundBytes = 512;
  bool latency_bound_ = false;
  absl::Duration max_nap_ = absl::Microseconds(20);  // IdleNap's cap: ProbeLocalPeers
  int usable_cpus_ = 1;
  std::atomic<bool> events_{false};  // HasEvents: set by Connect, off if arming fails
  uint64_t completions_ = 0, completions_seen_ = 0;  // ArmForEvents
  std::vector<Region> scratch_;
  std::mutex fail_mu_;
  absl::Status failed_;
  std::atomic<bool> has_failed_{false};
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_UCX_TRANSPORT_H_
