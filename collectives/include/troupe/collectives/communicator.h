// troupe/collectives/communicator.h — the one interface every collectives backend implements.
//
// A Communicator is a fixed group of `size` ranks at one `generation`. Every rank issues the same
// collective operations in the same order; each call returns at once with a Work handle whose
// Wait() yields the operation's absl::Status. Failures are typed and fast:
//   * Unavailable   — a peer died or its endpoint broke; the message names the peer rank.
//   * Aborted       — the group's generation changed (Abort with an Aborted status).
//   * DeadlineExceeded — the per-operation deadline passed; a last resort, never the mechanism.
// After a failure every pending and later operation fails with the same status: destroy the
// communicator and build a new one over the new rank set (with a new generation). As with
// ncclCommAbort, the buffers of operations that failed must stay valid until the communicator
// is destroyed (a transfer from a peer that was mid-message may still land in them).
//
// Example:
//   std::vector<float> grad(n);
//   Work w = comm->AllReduce(Buffer::F32(grad), Buffer::F32(grad), ReduceOp::kSum, {});
//   absl::Status s = w.Wait();   // in place: input and output are the same buffer
//   if (absl::IsUnavailable(s)) { /* rebuild over the survivors */ }
#ifndef TROUPE_COLLECTIVES_COMMUNICATOR_H_
#define TROUPE_COLLECTIVES_COMMUNICATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace troupe::collectives {

// Element types. bf16 is stored as the upper 16 bits of an IEEE f32 and accumulated in f32.
enum class DType : uint8_t { kF32 = 0, kBF16 = 1 };
size_t DTypeSize(DType t);

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2 };

// Which algorithm runs a reduction. kAuto picks by size (count × 4 bytes, the f32 working size):
// recursive doubling at or below `CollectiveOptions::small_bytes` (`same_host_small_bytes` where
// the ranks stage through shared segments), kSingleCopy above where it can run, else kRing.
// kOrdered is the deterministic mode: each element is reduced by the canonical tree over
// contribution intervals (docs/ARCHITECTURE.md, "Determinism"), bit-exact for any group size.
// kSingleCopy (AllReduce, ReduceScatter), the same-host algorithm: every rank reduces its segment
// reading the other ranks' data in memory they share, then takes their reduced segments — no
// message queues in between. UCX with every rank on one host: piece by piece through the ranks'
// shared staging segments (mailboxes on), or reading the peers' buffers directly (Linux
// cross-memory attach, probed at creation); where both can run, whichever the ranks measured
// faster for that size (they agree on it); in-process: the peers' buffers. Elsewhere it runs
// kRing.
enum class Algorithm : uint8_t {
  kAuto = 0,
  kRing = 1,
  kRecursiveDoubling = 2,
  kOrdered = 3,
  kSingleCopy = 4,
};

// Per-operation compression for AllReduce (sum/avg), each with error feedback: what was not sent
// this step is kept in `CompressionState::residual` and added to the next step's input.
enum class Compression : uint8_t { kNone = 0, kTopK = 1, kInt8 = 2 };

// Caller-owned error-feedback state, one per tensor being reduced repeatedly.
struct CompressionState {
  std::vector<float> residual;
};

// A non-owning view of a contiguous host (or, for NCCL, device) buffer.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::kF32;

  size_t bytes() const { return count * DTypeSize(dtype); }
  static Buffer F32(float* p, size_t n) { return {p, n, DType::kF32}; }
  template <class V>
  static Buffer F32(V& v) {
    return {v.data(), v.size(), DType::kF32};
  }
  static Buffer BF16(uint16_t* p, size_t n) { return {p, n, DType::kBF16}; }
  template <class V>
  static Buffer BF16(V& v) {
    return {v.data(), v.size(), DType::kBF16};
  }
};

struct CollectiveOptions {
  // Relative deadline for the whole operation; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Seconds(60);
  Algorithm algorithm = Algorithm::kAuto;
  // kAuto: recursive doubling at or below this size, where the ranks do not stage through shared
  // segments (where they do, `same_host_small_bytes` applies instead).
  size_t small_bytes = 64 * 1024;
  // kAuto where every rank shares this host's staging segments (UCX, mailboxes on): recursive
  // doubling at or below this size, kSingleCopy (staged) above. Staging hands pieces over with
  // counters in shared memory; recursive doubling above one mailbox message (8 KiB) goes through
  // UCX's rendezvous, several wake-ups a message. 2 ranks on a 2-vCPU Zen 4 VM, medians of 12
  // launches (worst launch): 8-64 KiB 2.2-13.8 us (3.9-17.5) staged against 2.9-15.4 (7.8-54)
  // recursive doubling; 4 ranks on its 2 vCPUs 46-118 us against 50-198. At 4 KiB and below one
  // mailbox exchange is faster (1.7 us against 2.0 at 4 KiB).
  size_t same_host_small_bytes = 4 * 1024;
  // kOrdered only: rank r holds the partial sum of contributions [interval_lo, interval_hi),
  // a power-of-two-aligned block (a whole subtree of the canonical tree). Unset (lo == hi):
  // rank r holds contribution [r, r + 1).
  uint64_t interval_lo = 0, interval_hi = 0;
  Compression compression = Compression::kNone;
  double topk_fraction = 0.01;                    // kTopK: fraction of elements sent
  CompressionState* compression_state = nullptr;  // required when compression != kNone
};

// Completion handle of one operation. Copyable; every copy observes the same completion.
class Work {
 public:
  // Backends may let the waiting thread run queued work itself (no thread hand-off).
  struct Helper {
    virtual ~Helper() = default;
    virtual void Help(const void* state) = 0;
  };
  // A one-shot completion flag: one atomic word, slept on with a futex only when a thread must
  // wait for another (most waiters ran the operation themselves). Not absl::Notification (its
  // absl::Mutex costs a deadlock-graph update per construction in Debian's Abseil) nor a mutex
  // and condition variable (constructed and destroyed with every operation).
  class Flag {
   public:
    void Notify();
    bool HasBeenNotified() const { return word_.load(std::memory_order_acquire) == kSet; }
    void WaitForNotification();
    // False if not notified within about `timeout` (a signal may end it early, scheduling late).
    bool WaitForNotificationWithTimeout(absl::Duration timeout);

   private:
    static constexpr uint32_t kUnset = 0, kSet = 1, kSleeping = 2;
    std::atomic<uint32_t> word_{kUnset};
  };
  struct State {
    Flag done;
    absl::Status status;
    std::shared_ptr<Helper> helper;
  };
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}
  static Work Done(absl::Status s);

  // Blocks until the operation finished; returns its status.
  [[nodiscard]] absl::Status Wait() const;
  bool IsDone() const { return state_ == nullptr || state_->done.HasBeenNotified(); }

 private:
  std::shared_ptr<State> state_;
};

// Counters a backend keeps (bytes handed to the transport's send calls, etc.).
struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t ops_completed = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual uint64_t generation() const = 0;

  // output.count == input.count; input and output may be the same buffer (in place).
  virtual Work AllReduce(Buffer input, Buffer output, ReduceOp op,
                         const CollectiveOptions& opts) = 0;
  // input.count == size() * output.count; rank r receives block r of the reduction.
  virtual Work ReduceScatter(Buffer input, Buffer output, ReduceOp op,
                             const CollectiveOptions& opts) = 0;
  // output.count == size() * input.count; block r of the output is rank r's input.
  virtual Work AllGather(Buffer input, Buffer output, const CollectiveOptions& opts) = 0;
  // `buffer` of rank `root` is copied into `buffer` of every rank.
  virtual Work Broadcast(Buffer buffer, int root, const CollectiveOptions& opts) = 0;
  virtual Work Send(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& opts) = 0;
  virtual Work Recv(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& opts) = 0;
  virtual Work Barrier(const CollectiveOptions& opts) = 0;

  // Sends and receives posted together, one Work each, in order: none waits for another to
  // start, so a ring whose ranks each send to the next and receive from the previous cannot
  // deadlock on a backend whose point-to-point calls queue behind each other (NCCL runs the batch
  // as one group). The default posts each through Send and Recv.
  struct PointToPoint {
    enum class Kind : uint8_t { kSend, kRecv };
    Kind kind = Kind::kSend;
    Buffer buffer;
    int peer = 0;
    uint32_t tag = 0;
  };
  virtual std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                             const CollectiveOptions& opts);

  // Fails every pending and future operation with `status` (e.g. Aborted for a generation change,
  // Unavailable when the control plane saw a peer die). Idempotent: the first status wins.
  virtual void Abort(absl::Status status) = 0;
  // Convenience: Abort(Aborted("generation G superseded by N")).
  void AbortForGeneration(uint64_t new_generation);

  virtual CommStats stats() const = 0;
  virtual std::string DebugString() const = 0;
  // Every peer reads this rank's memory at memory speed (one host: shared memory, or one address
  // space), so fewer, larger messages cost less than on a network. The same answer on every rank
  // of the group (callers size messages both sides must agree on by it). Default: false.
  virtual bool PeersShareHost() const { return false; }
  // A receive takes the one send of its peer and tag, whatever the order both sides posted their
  // operations in. False where point-to-point messages between two ranks match in posting order
  // (NCCL): both must then post theirs in one order. Default: true.
  virtual bool MatchesByTag() const { return true; }
};

// A failure that one peer is to blame for, as this rank saw it first hand (its liveness heartbeats
// stopped, a connection to it failed, a transfer with it failed) carries that peer's rank as a
// payload of its Status — not a bootstrap key it never published, which a rank stuck on a third
// one would leave unpublished too: whoever sees the failure (the elastic
// coordinator) learns which peer without parsing the message. Payloads survive copies; a caller
// that rewrites the message must carry them over.
[[nodiscard]] absl::Status BlamePeer(absl::Status status, int rank);
std::optional<int> BlamedPeer(const absl::Status& status);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_COMMUNICATOR_H_
