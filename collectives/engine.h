// Private: the Communicator implementation shared by the host backends. It validates arguments,
// queues operations in issue order, and runs them one at a time on its executor thread over a
// Transport. Failure is sticky:
//
//   healthy --(op fails / Abort(status) / transport fails)--> failed(status)
//
// In the failed state every queued and later operation completes with that status at once.
// Threads: the public methods are thread-safe; algorithms and the transport's Post*/WaitAll run
// on the executor thread only.
#ifndef TROUPE_COLLECTIVES_ENGINE_H_
#define TROUPE_COLLECTIVES_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms.h"
#include "transport.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

// A lock for critical sections of a few instructions: one atomic exchange to take it, a plain
// store to release it (a std::mutex costs two calls and two locked instructions, a tenth of an
// 8-byte all-reduce's engine time here); it yields the CPU when the holder seems preempted.
class SpinLock {
 public:
  void lock() {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 64) {
#if defined(__x86_64__)
          __builtin_ia32_pause();
#endif
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

class Engine : public Communicator {
 public:
  Engine(std::unique_ptr<Transport> transport, uint64_t generation, std::string backend);
  ~Engine() override;

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  uint64_t generation() const override { return generation_; }

  Work AllReduce(Buffer input, Buffer output, ReduceOp op, const CollectiveOptions& o) override;
  Work ReduceScatter(Buffer input, Buffer output, ReduceOp op, const CollectiveOptions& o) override;
  Work AllGather(Buffer input, Buffer output, const CollectiveOptions& o) override;
  Work Broadcast(Buffer buffer, int root, const CollectiveOptions& o) override;
  Work Send(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& o) override;
  Work Recv(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& o) override;
  Work Barrier(const CollectiveOptions& o) override;
  void Abort(absl::Status status) override;
  CommStats stats() const override;
  std::string DebugString() const override;
  bool PeersShareHost() const override { return transport_->CanReadPeers(); }

  Transport* transport() { return transport_.get(); }

 protected:
  // Subclasses that own resources the transport uses call this first in their destructor.
  void Shutdown();

 private:
  // One queued operation, described by value (no closure to allocate per operation).
  enum class Kind : uint8_t {
    kAllReduce,
    kReduceScatter,
    kAllGather,
    kBroadcast,
    kBarrier,
    kSend,
    kRecv
  };
  struct Item {
    Kind kind = Kind::kBarrier;
    Buffer in, out;  // Broadcast / Send / Recv: `in`
    ReduceOp op = ReduceOp::kSum;
    int peer = 0;  // Broadcast: the root; Send / Recv: the peer
    uint32_t tag = 0;
    CollectiveOptions o;
    uint64_t seq = 0;
    uint64_t ticket = 0;  // order of submission, every operation
    absl::Time deadline;
    std::shared_ptr<Work::State> state;
  };
  // Operations in issue order: a vector used as a queue, so that neither a push nor a pop
  // allocates once it has grown (a deque of these items allocated a block every other push).
  class Queue {
   public:
    bool empty() const { return head_ == items_.size(); }
    size_t size() const { return items_.size() - head_; }
    const Item& front() const { return items_[head_]; }
    void push_back(Item item) {
      if (head_ > 32 && head_ * 2 >= items_.size()) {  // never empty for long: drop the popped
        items_.erase(items_.begin(), items_.begin() + head_);
        head_ = 0;
      }
      items_.push_back(std::move(item));
    }
    Item pop_front() {
      Item item = std::move(items_[head_++]);
      if (empty()) items_.clear(), head_ = 0;
      return item;
    }

   private:
    std::vector<Item> items_;
    size_t head_ = 0;
  };
  static bool PointToPoint(Kind k) { return k == Kind::kSend || k == Kind::kRecv; }
  struct HelperImpl;
  Work Submit(Kind kind, Buffer in, Buffer out, ReduceOp op, int peer, uint32_t tag,
              const CollectiveOptions& o);
  // Runs a collective on the calling (executing) thread.
  [[nodiscard]] absl::Status Execute(const OpContext& c, const Item& item);
  // Posts a point-to-point operation; it completes in the background.
  [[nodiscard]] absl::StatusOr<ReqId> Post(const OpContext& c, const Item& item);
  void Run();
  // Runs queued operations in order on the calling thread until `target` completed. Caller holds
  // the execution lock (helper_->mu).
  void Help(const Work::State* target);
  // Executes one queued operation or polls pending point-to-point requests. Caller holds the
  // execution lock.
  enum class Ran : uint8_t {
    kNothing,   // nothing queued, nothing pending
    kIdlePoll,  // polled pending point-to-point requests; none completed
    kProgress,  // ran an operation or completed a request
  };
  Ran RunOne();
  // The executor's wait for pending point-to-point requests on a transport with events (see
  // Transport::ArmForEvents): armed under the execution lock, blocked without it. False when it
  // did not block: a caller holds the lock, or something arrived meanwhile.
  bool BlockOnEvents();
  // Completes finished point-to-point requests; returns true if any completed.
  bool PollPointToPoint();
  void Complete(Item& item, absl::Status st);
  // Tells the executor thread whether point-to-point requests are pending (it polls them); a
  // store only when that changed.
  void PublishP2p() {
    if (has_p2p_.load(std::memory_order_relaxed) == p2p_.empty()) has_p2p_ = !p2p_.empty();
  }
  void FailOp(absl::Status st);
  [[nodiscard]] absl::Status failed_copy() const;
  // The algorithm an AllReduce / ReduceScatter of `count` elements runs.
  Algorithm Choose(const CollectiveOptions& o, size_t count) const;
  [[nodiscard]] absl::Status RunAllReduce(const OpContext& c, Buffer in, Buffer out, ReduceOp op,
                                          const CollectiveOptions& o);
  [[nodiscard]] absl::Status RunReduceScatter(const OpContext& c, Buffer in, Buffer out,
                                              ReduceOp op, const CollectiveOptions& o);
  [[nodiscard]] absl::Status SameHostAllReduce(const OpContext& c, float* w,
                                               const std::vector<size_t>& off, ReduceOp op,
                                               bool gather);
  [[nodiscard]] absl::Status RunAllGather(const OpContext& c, Buffer in, Buffer out);
  [[nodiscard]] absl::Status RunBroadcast(const OpContext& c, Buffer buf, int root,
                                          const CollectiveOptions& o);

  std::unique_ptr<Transport> transport_;
  const uint64_t generation_;
  const std::string backend_;
  mutable SpinLock mu_;  // held for a few loads and stores only
  std::condition_variable_any cv_;
  Queue queue_;
  std::vector<std::pair<ReqId, Item>> p2p_;  // guarded by the execution lock (helper_->mu)
  std::atomic<bool> has_p2p_{false};
  std::atomic<bool> asleep_{false};  // the executor is blocked on the transport's events
  std::shared_ptr<HelperImpl> helper_;
  absl::Status failed_;
  bool stop_ = false;
  uint64_t next_seq_ = 0, next_ticket_ = 0;
  std::atomic<uint64_t> ops_completed_{0};
  std::thread thread_;
};

// Compressed all-reduce (top-k or int8 with error feedback) over Transport; in compression.cc.
[[nodiscard]] absl::Status CompressedAllReduce(const OpContext& c, const float* in, float* out,
                                               size_t count, ReduceOp op,
                                               const CollectiveOptions& o);

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_ENGINE_H_
