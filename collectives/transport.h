// Private: the point-to-point transport every algorithm is written against. A backend (in-process
// threads, UCX) implements it; the Engine runs the collective algorithms over it.
// Thread model: Post*/WaitAll/Scratch are called only under the engine's execution lock; Fail()
// and Wake() may be called from any thread, and wake a blocked WaitAll or BlockForEvents.
#ifndef TROUPE_COLLECTIVES_TRANSPORT_H_
#define TROUPE_COLLECTIVES_TRANSPORT_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace troupe::collectives {

// 48-bit message tags: bit 47 marks user point-to-point traffic, bits 46..24 the operation's
// sequence number (wrapping), bits 23..0 a sub-tag inside the operation (step, piece).
constexpr uint64_t kTagBits = 48;
constexpr uint64_t kTagMask = (uint64_t{1} << kTagBits) - 1;
inline uint64_t OpTag(uint64_t seq, uint32_t sub) {
  return ((seq & 0x7fffff) << 24) | (sub & 0xffffff);
}
inline uint64_t UserTag(uint32_t tag) { return (uint64_t{1} << 47) | (tag & 0x7fffffffu); }

using ReqId = uint64_t;

// Adds `n` to a counter that one thread at a time writes (the writers are serialized by a lock
// the caller holds) and any thread reads: a plain load and store, no locked instruction.
inline void AddOneWriter(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

class Mailboxes;

// How a thread that found nothing to do waits before it looks again (WaitAll, Engine::Help, the
// executor's polls of pending point-to-point operations): after a few yields, naps from 20 µs,
// doubling every fourth one up to `max_nap`. A host that runs more ranks than it has vCPUs makes
// the naps longer (UcxTransport: 50 µs per rank per vCPU, at most 1 ms): there a nap shorter than
// the peers' turns on the vCPUs finds nothing new and takes the vCPU from the rank being waited
// for — 32 ranks on 2 vCPUs made 250,000 context switches a second and steps of 0.3–3 s.
constexpr int kYieldsBeforeNap = 4;
inline absl::Duration IdleNap(int naps, absl::Duration max_nap) {
  return std::min(max_nap,
                  absl::Microseconds(20) * (int64_t{1} << std::min(std::max(naps, 0) / 4, 10)));
}
class Transport;
// The longest a waiter blocks on a transport's events before it looks again (deadlines, failures;
// a wake-up the transport missed costs at most this).
constexpr absl::Duration kEventWait = absl::Milliseconds(1);
// After `idle` looks in a row found nothing: yield; then block on the transport's events
// (Transport::ArmForEvents, BlockForEvents) where it has them, else nap (IdleNap).
void IdleWait(int idle, Transport& t);

class Transport {
 public:
  // The longest nap of an idle waiter on this transport (IdleNap).
  virtual absl::Duration max_nap() const { return absl::Microseconds(20); }

  // Waiting on events instead of polling. A thread that found nothing to progress arms the
  // transport (ArmForEvents, under the engine's execution lock: false when something arrived
  // meanwhile or the transport has no events to wait on) and then blocks without the lock
  // (BlockForEvents) until a message arrives or can go on, Wake() is called (any thread), or
  // `max` passes. HasEvents: whether it can (fixed once set up). Polling with naps took the vCPU
  // 20,000 to 50,000 times a second a rank while a step's exchange was in flight — on a host whose
  // vCPUs the ranks share, a fifth of its CPU time.
  virtual bool HasEvents() const { return false; }
  virtual bool ArmForEvents() { return false; }
  virtual void BlockForEvents(absl::Duration /*max*/) {}
  virtual void Wake() {}
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Post a non-blocking send/receive of `bytes` bytes. The buffer must stay valid until a
  // WaitAll covering the request returns (successfully or not).
  [[nodiscard]] virtual absl::StatusOr<ReqId> PostSend(int peer, uint64_t tag, const void* buf,
                                                       size_t bytes) = 0;
  [[nodiscard]] virtual absl::StatusOr<ReqId> PostRecv(int peer, uint64_t tag, void* buf,
                                                       size_t bytes) = 0;
  // Waits for all `reqs` until `deadline` (base::MonotonicNow()'s clock). On failure (transport
  // failed, deadline) every outstanding request of this transport is cancelled before returning,
  // so no buffer is touched afterwards.
  [[nodiscard]] virtual absl::Status WaitAll(absl::Span<const ReqId> reqs, absl::Time deadline) = 0;

  // Non-blocking check of one request (progressing the transport): true and reaped when done,
  // false while pending, an error once the transport failed.
  [[nodiscard]] virtual absl::StatusOr<bool> Test(ReqId req) = 0;

  // Cancels and reaps every outstanding request (executor thread only; after a failed op).
  virtual void CancelAll() = 0;

  // Marks the transport failed with `status` (first one wins) and wakes WaitAll.
  virtual void Fail(absl::Status status) = 0;

  // Single-copy access to the peers' memory: true when the backend can read every peer's
  // address space (kSingleCopy). ReadPeer copies `bytes` from `remote`, an address in `peer`'s
  // process, into `local`; executor thread only; Unavailable naming the peer if it is gone.
  virtual bool CanReadPeers() const { return false; }
  [[nodiscard]] virtual absl::Status ReadPeer(int /*peer*/, uint64_t /*remote*/, void* /*local*/,
                                              size_t /*bytes*/) {
    return absl::UnimplementedError("collectives: this transport cannot read peers' memory");
  }

  // The shared-memory segments of the ranks, when every rank is on this host and each has mapped
  // every other's (StagedAllReduce); null otherwise.
  virtual Mailboxes* HostShared() { return nullptr; }
  // Polls `ready` until it holds (executor thread only), with WaitAll's idle policy; fails like
  // WaitAll when the transport failed or the deadline passed.
  [[nodiscard]] virtual absl::Status WaitUntil(absl::FunctionRef<bool()> /*ready*/,
                                               absl::Time /*deadline*/) {
    return absl::UnimplementedError("collectives: this transport has no shared segments");
  }

  // A reusable scratch area of at least `bytes` (registered with the NIC where that matters).
  // `slot` selects one of several independent areas. Valid until the next call with that slot.
  virtual void* Scratch(int slot, size_t bytes) = 0;

  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  uint64_t messages_sent() const { return messages_sent_.load(std::memory_order_relaxed); }

  // Counted by the transport's own Post*/ReadPeer, and by algorithms that move data through
  // shared memory themselves. One writer at a time: the backend serializes them (the engine's
  // execution lock; the in-process group's lock), so no locked instruction per message. Any
  // thread may read.
  void CountSend(size_t n) {
    AddOneWriter(bytes_sent_, n);
    AddOneWriter(messages_sent_, 1);
  }
  void CountRecv(size_t n) { AddOneWriter(bytes_received_, n); }

 private:
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0}, messages_sent_{0};
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_TRANSPORT_H_
