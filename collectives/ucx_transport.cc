// The UCX transport's operations: posting, waiting, cancelling, reading a peer's memory, the
// request table and the progress loop (ucx_transport.h; its set-up is in ucx_communicator.cc).
#include "ucx_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/uio.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"

namespace troupe::collectives {
namespace {

void OnSend(void* /*request*/, ucs_status_t status, void* user) {
  auto* r = static_cast<UcxRequest*>(user);
  r->status = status;
  r->done = true;
  ++*r->completions;
}

void OnRecv(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* /*info*/,
            void* user) {
  auto* r = static_cast<UcxRequest*>(user);
  r->status = status;
  r->done = true;
  ++*r->completions;
}

// UCX tag: source rank in the top 16 bits, the 48-bit message tag below.
uint64_t WireTag(int src, uint64_t tag) { return (uint64_t(src) << kTagBits) | (tag & kTagMask); }

}  // namespace

UcxTransport::UcxTransport(int rank, int size) : rank_(rank), size_(size) {
  reqs_.push_back(std::make_unique<UcxRequest>());  // kCompleted
  reqs_[kCompleted]->done = true;
}

absl::StatusOr<ReqId> UcxTransport::PostSend(int peer, uint64_t tag, const void* buf,
                                             size_t bytes) {
  TROUPE_RETURN_IF_ERROR(failure());
  if (ViaBox(peer, tag, bytes)) {
    CountSend(bytes);
    // In order per peer: behind any send to it still waiting for a slot.
    if (box_queued_[peer] == 0 && boxes_->TrySend(peer, tag, buf, bytes)) return kCompleted;
    auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/false);
    req->buf = const_cast<void*>(buf);
    ++box_queued_[peer];
    box_sends_.push_back(id);
    return id;
  }
  auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/false);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = OnSend;
  p.user_data = req;
  CountSend(bytes);
  void* r = ucp_tag_send_nbx(eps_[peer], buf, bytes, WireTag(rank_, tag), &p);
  return Track(id, r, "send", peer);
}

absl::StatusOr<ReqId> UcxTransport::PostRecv(int peer, uint64_t tag, void* buf, size_t bytes) {
  TROUPE_RETURN_IF_ERROR(failure());
  if (ViaBox(peer, tag, bytes)) {
    absl::StatusOr<bool> got = boxes_->TryRecv(peer, tag, buf, bytes);
    if (!got.ok()) return FailWith(got.status());
    if (*got) {
      CountRecv(bytes);
      return kCompleted;
    }
    auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/true);
    req->buf = buf;
    box_recvs_.push_back(id);
    return id;
  }
  auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/true);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv = OnRecv;
  p.user_data = req;
  void* r = ucp_tag_recv_nbx(lanes_[lane_of_[peer]].worker, buf, bytes, WireTag(peer, tag),
                             ~uint64_t{0}, &p);
  return Track(id, r, "recv", peer);
}

absl::Status UcxTransport::WaitAll(absl::Span<const ReqId> ids, absl::Time deadline) {
  int idle = 0;
  latency_bound_ = std::all_of(ids.begin(), ids.end(),
                               [&](ReqId id) { return reqs_[id]->bytes <= kLatencyBoundBytes; });
  for (uint64_t iter = 0;; ++iter) {
    bool all = true;
    for (ReqId id : ids) {
      const UcxRequest* r = reqs_[id].get();
      if (!r->done) {
        all = false;
        break;
      }
      if (r->status != UCS_OK) return FailWith(PeerError(r));
    }
    if (all) break;
    TROUPE_RETURN_IF_ERROR(failure());
    if (((iter & 255) == 255 || Napping(idle)) && base::MonotonicNow() > deadline) {
      return FailWith(absl::DeadlineExceededError(
          absl::StrCat("collectives: rank ", rank_, " operation deadline passed; ",
                       DescribePending(ids), "; ", iter, " polls, ",
                       spins_before_yield_ == 0 ? "yielding at every idle poll"
                       : shares_cpu_            ? "yielding (a peer shares this vCPU)"
                                                : "spinning",
                       " (", size_, " ranks, ", usable_cpus_, " usable vCPUs)")));
    }
    idle = Progress() != 0 ? 0 : idle + 1;
    IdleWait(idle);
  }
  for (ReqId id : ids) Reap(id);
  return absl::OkStatus();
}

absl::StatusOr<bool> UcxTransport::Test(ReqId id) {
  TROUPE_RETURN_IF_ERROR(failure());
  Progress();
  const UcxRequest* r = reqs_[id].get();
  if (!r->done) return false;
  if (r->status != UCS_OK) return FailWith(PeerError(r));
  Reap(id);
  return true;
}

void UcxTransport::CancelAll() {
  dirty_ = true;
  // Mailbox requests are dropped: only this thread ever copies into or out of their buffers.
  box_sends_.clear();
  box_recvs_.clear();
  std::fill(box_queued_.begin(), box_queued_.end(), 0);
  // UCX receives are cancelled; sends to a dead or departed peer cannot be, so they are
  // abandoned (kept alive until the worker goes away; nothing will read them after this).
  for (auto& r : reqs_) {
    if (r->live && !r->done && r->recv && r->ucx != nullptr) {
      ucp_request_cancel(lanes_[lane_of_[r->peer]].worker, r->ucx);
    }
  }
  // A receive already matched to a multi-fragment message cannot be cancelled; after a short
  // grace it is abandoned (the contract in communicator.h keeps its buffer valid until the
  // communicator is destroyed).
  const absl::Time until = base::MonotonicNow() + absl::Milliseconds(20);
  for (;;) {
    bool pending = false;
    for (auto& r : reqs_) pending |= r->live && r->ucx != nullptr && r->recv && !r->done;
    if (!pending || base::MonotonicNow() > until) break;
    ProgressUcx();
  }
  for (ReqId id = 1; id < reqs_.size(); ++id) {
    std::unique_ptr<UcxRequest>& r = reqs_[id];
    if (!r->live) continue;
    if (r->done || r->ucx == nullptr) {
      if (r->ucx != nullptr) ucp_request_free(r->ucx);
      r->live = false;
    } else {
      abandoned_.push_back(std::move(r));
      r = std::make_unique<UcxRequest>();
    }
    free_ids_.push_back(id);
  }
  live_ucx_ = 0;
}

void UcxTransport::Fail(absl::Status status) {
  {
    std::lock_guard<std::mutex> l(fail_mu_);
    if (failed_.ok()) failed_ = std::move(status);
    has_failed_.store(true, std::memory_order_release);
  }
  Wake();
}

absl::Status UcxTransport::WaitUntil(absl::FunctionRef<bool()> ready, absl::Time deadline) {
  int idle = 0;
  latency_bound_ = false;
  for (uint64_t iter = 0; !ready(); ++iter) {
    TROUPE_RETURN_IF_ERROR(failure());
    if (((iter & 255) == 255 || Napping(idle)) && base::MonotonicNow() > deadline) {
      return FailWith(absl::DeadlineExceededError(
          absl::StrCat("collectives: rank ", rank_,
                       " operation deadline passed waiting for the peers' shared segments")));
    }
    IdleWait(++idle);
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::ReadPeer(int peer, uint64_t remote, void* local, size_t bytes) {
  TROUPE_RETURN_IF_ERROR(failure());
  if (!ReadFrom(pids_[peer], remote, local, bytes)) {
    return FailWith(BlamePeer(absl::UnavailableError(absl::StrCat(
                                  "collectives: reading peer rank ", peer, "'s memory (pid ",
                                  pids_[peer], ") failed: ", std::strerror(errno))),
                              peer));
  }
  CountRecv(bytes);
  return absl::OkStatus();
}

void* UcxTransport::Scratch(int slot, size_t bytes) {
  if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1);
  Region& s = scratch_[slot];
  if (s.size >= bytes) return s.ptr;
  if (s.memh != nullptr) ucp_mem_unmap(lanes_[kLocal].context, s.memh);
  s = Region{};
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.length = std::max<size_t>(bytes, size_t{1} << 20);
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  if (ucp_mem_map(lanes_[kLocal].context, &mp, &s.memh) != UCS_OK) {
    s.heap.resize(bytes);  // registration failed: plain memory still works
    s.ptr = s.heap.data();
    s.size = bytes;
    return s.ptr;
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  ucp_mem_query(s.memh, &attr);
  s.ptr = attr.address;
  s.size = attr.length;
  return s.ptr;
}

// process_vm_readv until all `bytes` arrived; false (errno set) if the peer is gone or
// unreadable. Pieces of at most 64 MiB keep each system call short.
bool UcxTransport::ReadFrom(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  auto* dst = static_cast<char*>(local);
  while (bytes > 0) {
    const size_t want = std::min<size_t>(bytes, size_t{64} << 20);
    iovec l{dst, want}, r{reinterpret_cast<void*>(remote), want};
    const ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n == 0) errno = EFAULT;
      return false;
    }
    dst += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

absl::Status UcxTransport::failure() {
  if (!has_failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard<std::mutex> l(fail_mu_);
  return failed_;
}

absl::Status UcxTransport::FailWith(absl::Status st) {
  Fail(st);
  return failure();
}

// Which of `ids` are still pending, with peer, size and the tag's operation / phase / step /
// piece (see OpTag and OpContext::Tag): where a stalled collective waits.
std::string UcxTransport::DescribePending(absl::Span<const ReqId> ids) {
  std::string out;
  int pending = 0;
  for (ReqId id : ids) {
    const UcxRequest* r = reqs_[id].get();
    if (r->done) continue;
    if (++pending > 4) continue;
    const uint64_t sub = r->tag & 0xffffff;
    absl::StrAppend(&out, pending > 1 ? ", " : "", r->recv ? "receive from" : "send to", " rank ",
                    r->peer, " (", r->bytes, " bytes, ");
    if (r->tag >> 47) {
      absl::StrAppend(&out, "user tag ", r->tag & 0x7fffffff, ")");
    } else {
      absl::StrAppend(&out, "op ", (r->tag >> 24) & 0x7fffff, " phase ", sub >> 20, " step ",
                      (sub >> 12) & 0xff, " piece ", sub & 0xfff, ")");
    }
  }
  return absl::StrCat(pending, " of ", ids.size(), " requests pending: ", out,
                      pending > 4 ? ", ..." : "");
}

absl::Status UcxTransport::PeerError(const UcxRequest* r) {
  return BlamePeer(absl::UnavailableError(absl::StrCat(
                       "collectives: ", r->recv ? "receive from" : "send to", " peer rank ",
                       r->peer, " failed: ", ucs_status_string(r->status))),
                   r->peer);
}

// A fresh request and its id (an index into reqs_, reused once reaped: no allocation per
// message once the table has grown to the most requests in flight).
std::pair<ReqId, UcxRequest*> UcxTransport::NewReq(int peer, uint64_t tag, size_t bytes,
                                                   bool recv) {
  ReqId id;
  if (free_ids_.empty()) {
    id = reqs_.size();
    reqs_.push_back(std::make_unique<UcxRequest>());
  } else {
    id = free_ids_.back();
    free_ids_.pop_back();
    *reqs_[id] = UcxRequest{};
  }
  UcxRequest* r = reqs_[id].get();
  r->live = true;
  r->completions = &completions_;
  r->peer = peer;
  r->tag = tag;
  r->bytes = bytes;
  r->recv = recv;
  return {id, r};
}

absl::StatusOr<ReqId> UcxTransport::Track(ReqId id, void* r, const char* what, int peer) {
  UcxRequest* req = reqs_[id].get();
  if (UCS_PTR_IS_ERR(r)) {
    req->live = false;
    free_ids_.push_back(id);
    return FailWith(BlamePeer(
        absl::UnavailableError(absl::StrCat("collectives: ", what, " with peer rank ", peer,
                                            " failed: ", ucs_status_string(UCS_PTR_STATUS(r)))),
        peer));
  }
  if (r == nullptr) {
    req->done = true;
  } else {
    req->ucx = r;
    ++live_ucx_;
  }
  return id;
}

void UcxTransport::Reap(ReqId id) {
  UcxRequest* r = reqs_[id].get();
  if (!r->live) return;
  if (r->recv) CountRecv(r->bytes);  // counted once it has arrived
  if (r->ucx != nullptr) {
    ucp_request_free(r->ucx);
    --live_ucx_;
  }
  r->live = false;
  free_ids_.push_back(id);
}

// Collective messages between ranks of this host small enough for a mailbox slot. User
// point-to-point messages stay on UCX: a receive there may be larger than its message, and
// both sides must route a message the same way.
bool UcxTransport::ViaBox(int peer, uint64_t tag, size_t bytes) const {
  return boxes_ != nullptr && lane_of_[peer] == kLocal && (tag >> 47) == 0 && bytes > 0 &&
         bytes <= Mailboxes::kPayloadBytes;
}

// Moves what can move through the mailboxes: queued sends whose slot freed up (in order per
// peer), receives whose message arrived. The number of requests completed.
unsigned UcxTransport::ProgressBoxes() {
  unsigned n = 0;
  if (!box_sends_.empty()) {
    size_t keep = 0;
    blocked_.clear();
    for (ReqId id : box_sends_) {
      UcxRequest* r = reqs_[id].get();
      const bool behind = std::find(blocked_.begin(), blocked_.end(), r->peer) != blocked_.end();
      if (!behind && boxes_->TrySend(r->peer, r->tag, r->buf, r->bytes)) {
        r->done = true;
        --box_queued_[r->peer];
        ++n;
      } else {
        if (!behind) blocked_.push_back(r->peer);
        box_sends_[keep++] = id;
      }
    }
    box_sends_.resize(keep);
  }
  size_t keep = 0;
  for (ReqId id : box_recvs_) {
    UcxRequest* r = reqs_[id].get();
    absl::StatusOr<bool> got = boxes_->TryRecv(r->peer, r->tag, r->buf, r->bytes);
    if (!got.ok()) {
      (void)FailWith(got.status());
      return n;
    }
    if (*got) {
      r->done = true;
      ++n;
    } else {
      box_recvs_[keep++] = id;
    }
  }
  box_recvs_.resize(keep);
  return n;
}

// After `idle` polls in a row found nothing: spin while this rank has a vCPU to itself; on an
// oversubscribed machine yield, and once a few yields found nothing, nap (collectives::IdleWait).
// sched_yield only yields to tasks of this task group: ranks in other cgroups or autogroups
// (a session each, on a kernel with sched_autogroup) would wait for the CPU a yielding rank
// keeps — 3 to 4 times slower steps on the lab, whose processes run in sessions of their own.
// Napping waits read the clock every time: a nap of up to 1 ms every 256 polls would overshoot a
// deadline by a quarter of a second.
bool UcxTransport::Napping(int idle) const {
  return idle > (shares_cpu_ ? 0 : spun_) + kYieldsBeforeNap;
}

void UcxTransport::IdleWait(int idle) {
  if (idle == 0) return;  // progress was made: look again at once
  if (idle == 1) spun_ = spins_before_yield_;
  // Spinning is for a rank whose peers run elsewhere: the kernel may put two ranks on one vCPU
  // though every rank could have one (another process busy on the other), and a spinning waiter
  // kept its peer off the vCPU for a time slice at every hand-over (2-rank 64 MiB all-reduces 6x
  // slower beside a busy process). Such a waiter backs off at once, as ranks outnumbering the
  // vCPUs do (yields, then naps).
  if (boxes_ != nullptr && spins_before_yield_ > 0 && (shares_cpu_ || idle % 64 == 1)) {
    shares_cpu_ = boxes_->PeerSharesMyCpu() && !(latency_bound_ && MoveOffSharedCpu());
  }
  if (shares_cpu_) return collectives::IdleWait(idle, *this);
  // Where a rank had to move in the last 2 s (MoveOffSharedCpu), a waiter for small messages spins
  // 8x longer (~16 ms): its peer may have been preempted by the busy process beside it for a tick
  // or two (4 ms at HZ=250), and a waiter that naps leaves its vCPU idle, onto which the kernel
  // then pulls that peer — the two share a vCPU again. Checked once, when the usual spin ends
  // (spun_ holds the answer).
  if (idle == spins_before_yield_ + 1 && latency_bound_ && boxes_ != nullptr &&
      boxes_->AnyRankMovedSince(absl::ToUnixNanos(base::MonotonicNow() - absl::Seconds(2)))) {
    spun_ = spins_before_yield_ * 8;
  }
  if (idle <= spun_) {
    // A peer the kernel moved onto this vCPU while it was preempted shows the vCPU it had until
    // it next waits: a spinning waiter yields once in a while all the same.
    if (idle % 4096 == 0) sched_yield();
    return;
  }
  collectives::IdleWait(idle - spun_, *this);
}

// Two ranks on one vCPU hand it over at every message: an 8-byte all-reduce took ~1.2 us beside a
// busy process on the other vCPU, where OpenMPI's spinning ranks, one on each vCPU, took 0.8 (the
// one beside that process gets its time slices, and the other's spinning costs no one). The kernel
// puts them together again and again: a rank that naps wakes on its waker's vCPU when the other is
// busy. So a rank that finds a peer on its vCPU moves, once in a while, to one its affinity allows
// and no rank of this host last waited on — and then spins — leaving its affinity as it was (the
// kernel may move it back; a user's pinning is never widened). False where there is none: ranks
// that outnumber the vCPUs they may use share them and hand them over.
bool UcxTransport::MoveOffSharedCpu() {
  const absl::Time now = base::MonotonicNow();
  if (now < next_move_) return false;
  cpu_set_t allowed, busy, to;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  CPU_ZERO(&busy);
  boxes_->AddPeerCpus(&busy);
  const int here = sched_getcpu();
  if (here >= 0) CPU_SET(here, &busy);
  CPU_ZERO(&to);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && !CPU_ISSET(cpu, &busy)) CPU_SET(cpu, &to);
  }
  if (CPU_COUNT(&to) == 0) return false;  // no attempt: a later wait may find one at once
  next_move_ = now + absl::Milliseconds(100);
  if (sched_setaffinity(0, sizeof(to), &to) != 0) return false;
  // The kernel moved it at the first call. Restored to the mask in force a moment ago: one set in
  // between (taskset -p) is lost, and on Linux >= 6.2 it becomes the thread's requested mask.
  // One that cannot be restored (the cpuset changed in between) leaves the thread on the vCPUs
  // it may use now, and it moves no more.
  if (sched_setaffinity(0, sizeof(allowed), &allowed) != 0) next_move_ = absl::InfiniteFuture();
  if (sched_getcpu() == here) return false;
  (void)boxes_->PeerSharesMyCpu();  // publishes the new vCPU: the peer left behind spins again
  boxes_->NoteMoved(absl::ToUnixNanos(base::MonotonicNow()));
  return true;
}

// UCX's contract: the worker is armed only once progress found nothing (UCS_ERR_BUSY otherwise).
// Nor while a request completed since the last look: progress made for one request may have
// completed another that its waiter tested before — it would sleep with it done.
bool UcxTransport::ArmForEvents() {
  if (!events_ || ProgressUcx() != 0 || completions_ != completions_seen_) {
    completions_seen_ = completions_;
    return false;
  }
  const ucs_status_t s = ucp_worker_arm(lanes_[kRemote].worker);
  if (s != UCS_OK && s != UCS_ERR_BUSY) events_ = false;  // cannot arm: nap from now on
  return s == UCS_OK;
}

void UcxTransport::BlockForEvents(absl::Duration max) {
  pollfd fd{lanes_[kRemote].efd, POLLIN, 0};
  const timespec ts = absl::ToTimespec(max);
  (void)ppoll(&fd, 1, &ts, nullptr);  // EINTR: the caller looks again, as after any wake
}

void UcxTransport::Wake() {
  if (events_) (void)ucp_worker_signal(lanes_[kRemote].worker);
}

unsigned UcxTransport::ProgressUcx() {
  unsigned n = 0;
  for (Lane& lane : lanes_) {
    if (lane.used) n += ucp_worker_progress(lane.worker);
  }
  return n;
}

// Progresses the mailboxes and the UCX lanes in use; the number of events. With no UCX request
// in flight, UCX is progressed only every 256th call (what arrives there waits in its queues).
unsigned UcxTransport::Progress() {
  unsigned n = boxes_ != nullptr ? ProgressBoxes() : 0;
  if (live_ucx_ > 0 || (++ucx_skips_ & 255) == 0) n += ProgressUcx();
  return n;
}

}  // namespace troupe::collectives
