// Private: shared-memory mailboxes for the small messages between ranks of one host, the path
// every small collective takes (OpenMPI's vader "fast box" plays the same part). A message goes
// from the sender's buffer into a slot of the receiver's inbox and from there into the receive
// buffer: two copies by the two ranks' own threads, a release store and an acquire load, no
// system call and no UCX; a message that fits beside a slot's header travels in one cache line.
//
// Layout: each rank owns a segment (its inbox), a System V segment marked for removal as soon as it
// is created (Linux lets the peers attach it until the last one detaches, so no process death, not
// even the owner's, leaves it behind). The inbox holds one channel per sender of the same host,
// kSlots slots each, and each channel's head. Message k (k = 1, 2, ...) of a channel goes into
// slot k % kSlots; the slot's `seq` word, written last with release order, says which message it
// holds. Only the sender writes a slot, only the receiver the head: the number of the oldest
// message not yet copied out, which the sender reads before it reuses a slot (once per kSlots
// messages) — one cache line crosses between the two cores per message.
//
// Matching: a receive takes the oldest message of its channel whose tag matches (per sender and
// tag the messages are received in the order they were sent), so receives may be posted in any
// order. A sender whose slot is still full gets false and retries later: the caller queues it.
// Both sides must route a message here or elsewhere the same way: by size (<= kPayloadBytes).
//
// Threads: TrySend / TryRecv of one Mailboxes are called by one thread at a time (the engine's
// executor); the peer's process is the only other party to a channel.
#ifndef TROUPE_COLLECTIVES_MAILBOX_H_
#define TROUPE_COLLECTIVES_MAILBOX_H_

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reduce.h"

namespace troupe::collectives {

class Mailboxes {
 public:
  static constexpr int kSlots = 16;
  static constexpr size_t kSlotBytes = 8192 + 64;
  static constexpr size_t kHeaderBytes = 24;  // seq, tag, bytes (+ pad)
  static constexpr size_t kPayloadBytes = kSlotBytes - kHeaderBytes;

  // This rank's inbox, with a channel for each of `local_ranks` (the ranks of this host, by rank,
  // this one included and given none).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Mailboxes>> Create(
      int rank, const std::vector<int>& local_ranks);
  ~Mailboxes();

  // The System V id a peer of this host attaches this inbox by.
  int inbox_id() const { return inbox_id_; }
  // Maps peer `rank`'s inbox (its inbox_id()), to send to it.
  [[nodiscard]] absl::Status Attach(int rank, int shm_id);

  // Copies `bytes` (<= kPayloadBytes) into `peer`'s inbox; false when its slot is still full.
  bool TrySend(int peer, uint64_t tag, const void* buf, size_t bytes);
  // Copies the oldest message from `peer` with `tag` into `buf`: true when one was there, false
  // when none has arrived, an error when it is not `bytes` long (sender and receiver disagree).
  [[nodiscard]] absl::StatusOr<bool> TryRecv(int peer, uint64_t tag, void* buf, size_t bytes);

  // The staging area of the same-host all-reduce (StagedAllReduce in algorithms.h), in the same
  // segment: kStageSlots slots of kStageBytes, and three counters on cache lines of their own,
  // each written by its owner only and read by the peers: chunks staged, reduced, copied out.
  static constexpr int kStageSlots = 4;
  static constexpr size_t kStageBytes = 256 * 1024;
  enum Counter { kStaged = 0, kReduced = 1, kCopiedOut = 2 };
  // Of this rank or an attached peer.
  uint8_t* stage(int rank, int slot) const;
  std::atomic<uint64_t>& counter(int rank, Counter which) const;
  // Which same-host path this rank's operations take, and how it writes what it stages (see
  // StagingCopy).
  StagingCopy& staging_copy() { return staging_copy_; }

  // Publishes the vCPU this rank runs on (a word of its segment beside the counters) and says
  // whether an attached peer last published the same one: a waiter that shares its vCPU with a
  // peer hands it over instead of spinning (UcxTransport::IdleWait). A peer publishes when it
  // waits, so a peer preempted on this vCPU still shows it; one the kernel moved while it was
  // preempted shows its old vCPU until its next wait.
  bool PeerSharesMyCpu();
  // Adds to `set` the vCPUs the attached peers last published.
  void AddPeerCpus(cpu_set_t* set) const;
  // Notes that this rank moved off a vCPU it shared with a peer (UcxTransport::MoveOffSharedCpu)
  // at `now_ns` (CLOCK_MONOTONIC), and says whether any rank of this host did since `since_ns`:
  // this host's vCPUs are wanted by others.
  void NoteMoved(int64_t now_ns);
  bool AnyRankMovedSince(int64_t since_ns) const;
  uint64_t moves() const { return MovesWord(rank_, 0).load(std::memory_order_relaxed); }

 private:
  struct Slot;
  Mailboxes() = default;
  uint8_t* segment(int rank) const {
    return static_cast<uint8_t*>(rank == rank_ ? inbox_ : outboxes_[rank]);
  }
  std::atomic<uint64_t>& Head(uint8_t* segment, int sender) const;
  // PeerSharesMyCpu's word of `rank`'s segment, on a line of its own after the counters.
  std::atomic<uint64_t>& CpuWord(int rank) const;
  // NoteMoved's words of `rank`, on the next line: 0 the count, 1 the last one's time.
  std::atomic<uint64_t>& MovesWord(int rank, int word) const;
  Slot* SendSlot(int peer, uint64_t seq) const;
  Slot* RecvSlot(int peer, uint64_t seq) const;

  int rank_ = 0;
  int inbox_id_ = -1;
  void* inbox_ = nullptr;
  std::vector<int> local_index_;  // by rank: index among local_ranks, -1 elsewhere
  std::vector<void*> outboxes_;   // by rank: the peer's inbox, once attached
  int my_index_ = 0;
  // Per peer rank: the next sequence number to send; the oldest not yet received and a bit mask of
  // the ones after it already received (out of order).
  std::vector<uint64_t> send_seq_, recv_head_, recv_done_;
  std::vector<uint64_t> acked_;  // per peer: its head as last read (no message before it pending)
  size_t local_count_ = 0;
  StagingCopy staging_copy_;
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_MAILBOX_H_
