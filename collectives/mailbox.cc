#include "mailbox.h"

#include <sched.h>
#include <sys/ipc.h>
#include <sys/shm.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace troupe::collectives {

struct alignas(64) Mailboxes::Slot {
  std::atomic<uint64_t> seq;
  uint64_t tag;
  uint64_t bytes;
  uint8_t payload[kPayloadBytes];
};

namespace {
// Segment layout: the counters' page (the counters, then the vCPU and move words), the staging
// slots, then one channel per sender.
constexpr size_t kCountersBytes = 4096;
constexpr size_t kChannelsOffset = kCountersBytes + Mailboxes::kStageSlots * Mailboxes::kStageBytes;
// Staging slots start 64-byte aligned in a page-aligned segment (StreamCopy's stores need 16).
static_assert(kCountersBytes % 64 == 0 && Mailboxes::kStageBytes % 64 == 0);
static_assert(Mailboxes::kSlots <= 64, "recv_done_ is a 64-bit mask");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "seq is shared between processes");
}  // namespace

absl::StatusOr<std::unique_ptr<Mailboxes>> Mailboxes::Create(int rank,
                                                             const std::vector<int>& local_ranks) {
  static_assert(sizeof(Slot) == kSlotBytes);
  auto m = std::unique_ptr<Mailboxes>(new Mailboxes());
  m->rank_ = rank;
  int top = rank;
  for (int r : local_ranks) top = std::max(top, r);
  m->local_index_.assign(top + 1, -1);
  for (size_t i = 0; i < local_ranks.size(); ++i) m->local_index_[local_ranks[i]] = i;
  if (m->local_index_[rank] < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mailboxes: rank ", rank, " missing from its own host's ranks"));
  }
  m->my_index_ = m->local_index_[rank];
  m->outboxes_.assign(top + 1, nullptr);
  m->send_seq_.assign(top + 1, 1);
  m->recv_head_.assign(top + 1, 1);
  m->recv_done_.assign(top + 1, 0);
  m->local_count_ = local_ranks.size();
  m->acked_.assign(top + 1, 1);
  // Channels, then each channel's head (on a cache line of its own).
  const size_t bytes = kChannelsOffset + local_ranks.size() * (kSlots * kSlotBytes + 64);
  m->inbox_id_ = shmget(IPC_PRIVATE, bytes, IPC_CREAT | 0600);
  if (m->inbox_id_ < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Mailboxes: shmget of ", bytes, " bytes failed: ", std::strerror(errno)));
  }
  void* p = shmat(m->inbox_id_, nullptr, 0);
  const int err = errno;
  // Removed at once: the segment lives while attached, and goes with the last process to detach.
  shmctl(m->inbox_id_, IPC_RMID, nullptr);
  if (p == reinterpret_cast<void*>(-1)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Mailboxes: shmat of this rank's inbox failed: ", std::strerror(err)));
  }
  m->inbox_ = p;  // zero-filled by the kernel: no slot holds a message (they are numbered from 1)
  return m;
}

Mailboxes::~Mailboxes() {
  for (void* p : outboxes_) {
    if (p != nullptr) shmdt(p);
  }
  if (inbox_ != nullptr) shmdt(inbox_);
}

absl::Status Mailboxes::Attach(int rank, int shm_id) {
  if (rank < 0 || rank >= static_cast<int>(local_index_.size()) || local_index_[rank] < 0 ||
      rank == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mailboxes: rank ", rank, " is not another rank of this host"));
  }
  void* p = shmat(shm_id, nullptr, 0);
  if (p == reinterpret_cast<void*>(-1)) {
    return absl::UnavailableError(absl::StrCat("Mailboxes: attaching rank ", rank,
                                               "'s inbox (shm id ", shm_id,
                                               ") failed: ", std::strerror(errno)));
  }
  outboxes_[rank] = p;
  return absl::OkStatus();
}

Mailboxes::Slot* Mailboxes::SendSlot(int peer, uint64_t seq) const {
  auto* channel = reinterpret_cast<Slot*>(segment(peer) + kChannelsOffset) + my_index_ * kSlots;
  return channel + seq % kSlots;
}

Mailboxes::Slot* Mailboxes::RecvSlot(int peer, uint64_t seq) const {
  auto* channel =
      reinterpret_cast<Slot*>(segment(rank_) + kChannelsOffset) + local_index_[peer] * kSlots;
  return channel + seq % kSlots;
}

uint8_t* Mailboxes::stage(int rank, int slot) const {
  return segment(rank) + kCountersBytes + slot * kStageBytes;
}

std::atomic<uint64_t>& Mailboxes::Head(uint8_t* segment, int sender) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(
      segment + kChannelsOffset + local_count_ * kSlots * kSlotBytes + sender * 64);
}

std::atomic<uint64_t>& Mailboxes::counter(int rank, Counter which) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(segment(rank) + which * 64);
}

std::atomic<uint64_t>& Mailboxes::CpuWord(int rank) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(segment(rank) + (kCopiedOut + 1) * 64);
}

std::atomic<uint64_t>& Mailboxes::MovesWord(int rank, int word) const {
  return reinterpret_cast<std::atomic<uint64_t>*>(segment(rank) + (kCopiedOut + 2) * 64)[word];
}

void Mailboxes::NoteMoved(int64_t now_ns) {
  MovesWord(rank_, 0).fetch_add(1, std::memory_order_relaxed);
  MovesWord(rank_, 1).store(static_cast<uint64_t>(now_ns), std::memory_order_relaxed);
}

bool Mailboxes::AnyRankMovedSince(int64_t since_ns) const {
  for (size_t r = 0; r < outboxes_.size(); ++r) {
    if ((static_cast<int>(r) == rank_ || outboxes_[r] != nullptr) &&
        static_cast<int64_t>(MovesWord(static_cast<int>(r), 1).load(std::memory_order_relaxed)) >
            since_ns) {
      return true;
    }
  }
  return false;
}

bool Mailboxes::PeerSharesMyCpu() {
  // The vCPU plus one: the segment starts zeroed, and 0 means none published yet.
  const uint64_t cpu = static_cast<uint64_t>(sched_getcpu() + 1);
  std::atomic<uint64_t>& mine = CpuWord(rank_);
  if (mine.load(std::memory_order_relaxed) != cpu) mine.store(cpu, std::memory_order_relaxed);
  if (cpu == 0) return false;
  for (size_t r = 0; r < outboxes_.size(); ++r) {
    if (outboxes_[r] != nullptr &&
        CpuWord(static_cast<int>(r)).load(std::memory_order_relaxed) == cpu) {
      return true;
    }
  }
  return false;
}

void Mailboxes::AddPeerCpus(cpu_set_t* set) const {
  for (size_t r = 0; r < outboxes_.size(); ++r) {
    if (outboxes_[r] == nullptr) continue;
    const uint64_t cpu = CpuWord(static_cast<int>(r)).load(std::memory_order_relaxed);
    if (cpu > 0 && cpu <= CPU_SETSIZE) CPU_SET(static_cast<int>(cpu - 1), set);
  }
}

bool Mailboxes::TrySend(int peer, uint64_t tag, const void* buf, size_t bytes) {
  const uint64_t seq = send_seq_[peer];
  if (seq - acked_[peer] >= kSlots) {  // the slot's previous message may not be copied out yet
    acked_[peer] = Head(segment(peer), my_index_).load(std::memory_order_acquire);
    if (seq - acked_[peer] >= kSlots) return false;
  }
  Slot* s = SendSlot(peer, seq);
  s->tag = tag;
  s->bytes = bytes;
  std::memcpy(s->payload, buf, bytes);
  s->seq.store(seq, std::memory_order_release);
  send_seq_[peer] = seq + 1;
  return true;
}

absl::StatusOr<bool> Mailboxes::TryRecv(int peer, uint64_t tag, void* buf, size_t bytes) {
  const uint64_t head = recv_head_[peer];
  uint64_t& done = recv_done_[peer];
  for (int k = 0; k < kSlots; ++k) {
    if (done >> k & 1) continue;  // received out of order already
    Slot* s = RecvSlot(peer, head + k);
    // The sender fills a channel's slots in order: the first one without its message (it holds
    // an older one) ends what has arrived.
    if (s->seq.load(std::memory_order_acquire) != head + k) return false;
    if (s->tag != tag) continue;
    if (s->bytes != bytes) {
      return absl::InternalError(absl::StrCat("collectives: rank ", rank_, " expected a ", bytes,
                                              "-byte message from rank ", peer, " (tag ", tag,
                                              "), got ", s->bytes, " bytes"));
    }
    std::memcpy(buf, s->payload, bytes);
    done |= uint64_t{1} << k;
    if (done & 1) {  // advance past the prefix received, and let the sender reuse those slots
      while (done & 1) {
        done >>= 1;
        ++recv_head_[peer];
      }
      Head(segment(rank_), local_index_[peer]).store(recv_head_[peer], std::memory_order_release);
    }
    return true;
  }
  return false;
}

}  // namespace troupe::collectives
