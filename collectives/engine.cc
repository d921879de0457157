#include "engine.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "mailbox.h"
#include "reduce.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"

namespace troupe::collectives {

namespace {
constexpr char kBlamedPeerUrl[] = "troupe.collectives/blamed_peer";
}  // namespace

absl::Status BlamePeer(absl::Status status, int rank) {
  if (!status.ok()) status.SetPayload(kBlamedPeerUrl, absl::Cord(absl::StrCat(rank)));
  return status;
}

std::optional<int> BlamedPeer(const absl::Status& status) {
  auto payload = status.GetPayload(kBlamedPeerUrl);  // absl::optional in Debian's Abseil
  int rank;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &rank)) return std::nullopt;
  return rank;
}

namespace {
void Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout = nullptr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op | FUTEX_PRIVATE_FLAG, value, timeout,
          nullptr, 0);
}
}  // namespace

void Work::Flag::Notify() {
  if (word_.exchange(kSet, std::memory_order_acq_rel) == kSleeping) {
    Futex(&word_, FUTEX_WAKE, INT32_MAX);
  }
}

void Work::Flag::WaitForNotification() {
  uint32_t w = word_.load(std::memory_order_acquire);
  while (w != kSet) {
    // Announce the sleeper (the notifier then wakes it), unless the flag changed meanwhile.
    if (w == kUnset && !word_.compare_exchange_weak(w, kSleeping, std::memory_order_acq_rel)) {
      continue;
    }
    Futex(&word_, FUTEX_WAIT, kSleeping);  // returns at once unless the word is still kSleeping
    w = word_.load(std::memory_order_acquire);
  }
}

bool Work::Flag::WaitForNotificationWithTimeout(absl::Duration timeout) {
  uint32_t w = word_.load(std::memory_order_acquire);
  // Announce the sleeper; a failed exchange leaves in `w` what the word became meanwhile.
  if (w == kUnset) word_.compare_exchange_strong(w, kSleeping, std::memory_order_acq_rel);
  if (w == kSet) return true;
  const timespec ts = absl::ToTimespec(timeout);
  Futex(&word_, FUTEX_WAIT, kSleeping, &ts);  // relative; a signal or a wake ends it early
  return HasBeenNotified();
}

absl::Status Work::Wait() const {
  if (state_ == nullptr) return absl::OkStatus();
  if (!state_->done.HasBeenNotified() && state_->helper) state_->helper->Help(state_.get());
  state_->done.WaitForNotification();
  return state_->status;
}

Work Work::Done(absl::Status s) {
  auto st = std::make_shared<State>();
  st->status = std::move(s);
  st->done.Notify();
  return Work(std::move(st));
}

std::vector<Work> Communicator::PostPointToPoint(const std::vector<PointToPoint>& ops,
                                                 const CollectiveOptions& opts) {
  std::vector<Work> works;
  works.reserve(ops.size());
  for (const PointToPoint& op : ops) {
    works.push_back(op.kind == PointToPoint::Kind::kSend ? Send(op.buffer, op.peer, op.tag, opts)
                                                         : Recv(op.buffer, op.peer, op.tag, opts));
  }
  return works;
}

void Communicator::AbortForGeneration(uint64_t new_generation) {
  Abort(absl::AbortedError(absl::StrCat("collectives: generation ", generation(),
                                        " superseded by generation ", new_generation)));
}

namespace {

constexpr auto kExecutorPoll = std::chrono::milliseconds(1);

// `timeout` from now on a clock a few milliseconds coarse (a timeout is seconds), read without the
// cost of a precise clock read at every operation; converted once per tick of that clock.
// CLOCK_MONOTONIC_COARSE is CLOCK_MONOTONIC at a tick's resolution: the deadline is on
// base::MonotonicNow()'s timeline (absl::UnixEpoch() + the monotonic reading), as its waits are.
absl::Time CoarseDeadline(absl::Duration timeout) {
  thread_local timespec tick{-1, 0};
  thread_local absl::Duration tick_timeout;
  thread_local absl::Time tick_deadline;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  if (ts.tv_nsec != tick.tv_nsec || ts.tv_sec != tick.tv_sec || timeout != tick_timeout) {
    tick = ts;
    tick_timeout = timeout;
    tick_deadline = absl::UnixEpoch() + absl::DurationFromTimespec(ts) + timeout;
  }
  return tick_deadline;
}

// Argument checks: the test inline, the message built out of line (only when it fails), so that a
// valid call costs a few compares.
[[gnu::noinline, gnu::cold]] absl::Status NullBuffer(const char* op, const char* name,
                                                     size_t count) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, ".data is null with count ", count));
}

inline absl::Status CheckBuffer(const char* op, const char* name, const Buffer& b) {
  if (b.count > 0 && b.data == nullptr) return NullBuffer(op, name, b.count);
  return absl::OkStatus();
}

[[gnu::noinline, gnu::cold]] absl::Status WrongCount(const char* op, const char* what,
                                                     size_t expected, size_t got) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", what, " expected ", expected, ", got ", got));
}

inline absl::Status CheckCount(const char* op, const char* what, size_t expected, size_t got) {
  if (expected == got) return absl::OkStatus();
  return WrongCount(op, what, expected, got);
}

[[gnu::noinline, gnu::cold]] absl::Status WrongDType(const char* op, DType in, DType out) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": output.dtype expected ",
                                                 static_cast<int>(in), " (input.dtype), got ",
                                                 static_cast<int>(out)));
}

inline absl::Status CheckSameDType(const char* op, const Buffer& in, const Buffer& out) {
  if (in.dtype == out.dtype) return absl::OkStatus();
  return WrongDType(op, in.dtype, out.dtype);
}

// Widens `b` into a reusable f32 work area (slot 2); f32 input is copied.
float* ToWork(Transport* t, const Buffer& b, size_t count) {
  float* w = static_cast<float*>(t->Scratch(2, std::max<size_t>(count, 1) * sizeof(float)));
  if (b.dtype == DType::kF32) {
    std::memcpy(w, b.data, count * sizeof(float));
  } else {
    Bf16ToF32(static_cast<const uint16_t*>(b.data), w, count);
  }
  return w;
}

void FromWork(const float* w, const Buffer& out, size_t count) {
  if (out.dtype == DType::kF32) {
    if (out.data != w) std::memmove(out.data, w, count * sizeof(float));
  } else {
    F32ToBf16(w, static_cast<uint16_t*>(out.data), count);
  }
}

}  // namespace

// What a waiting caller helps through. Its mutex is the engine's execution lock (held by whoever
// runs operations), so that destroying the engine waits for helping threads to leave.
//
// A caller that finds the lock taken does not queue on it: between operations the holder polls
// every pending point-to-point operation, this caller's too, and completes those that are done —
// where this caller's may be what lets the holder's own complete (its peer sends only after it
// saw this caller return). Blocked on the lock, both waited until a deadline; so the caller
// sleeps on its own operation instead and tries the lock again 50 µs to 1 ms apart, for when the
// holder left with this operation still queued or pending. Not covered: a holder blocked inside
// a collective polls nothing until it returns.
struct Engine::HelperImpl : Work::Helper {
  std::mutex mu;
  Engine* engine = nullptr;
  void Help(const void* state) override {
    auto* target = const_cast<Work::State*>(static_cast<const Work::State*>(state));
    absl::Duration nap = absl::Microseconds(50);
    while (!target->done.HasBeenNotified()) {
      std::unique_lock<std::mutex> l(mu, std::try_to_lock);
      if (l.owns_lock()) {
        if (engine != nullptr) engine->Help(target);
        return;
      }
      if (target->done.WaitForNotificationWithTimeout(nap)) return;
      nap = std::min(2 * nap, absl::Milliseconds(1));
    }
  }
};

Engine::Engine(std::unique_ptr<Transport> transport, uint64_t generation, std::string backend)
    : transport_(std::move(transport)), generation_(generation), backend_(std::move(backend)) {
  helper_ = std::make_shared<HelperImpl>();
  helper_->engine = this;
  thread_ = std::thread([this] { Run(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  if (!thread_.joinable()) return;
  Abort(absl::CancelledError("collectives: communicator destroyed"));
  {
    std::lock_guard<std::mutex> l(helper_->mu);  // waits for helping threads to leave
    helper_->engine = nullptr;
  }
  {
    std::lock_guard<SpinLock> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  transport_->Wake();
  thread_.join();
}

absl::Status Engine::failed_copy() const {
  std::lock_guard<SpinLock> l(mu_);
  return failed_;
}

void Engine::Abort(absl::Status status) {
  {
    std::lock_guard<SpinLock> l(mu_);
    if (failed_.ok()) failed_ = status;
  }
  transport_->Fail(std::move(status));
  cv_.notify_all();
}

Work Engine::Submit(Kind kind, Buffer in, Buffer out, ReduceOp op, int peer, uint32_t tag,
                    const CollectiveOptions& o) {
  auto state = std::make_shared<Work::State>();
  state->helper = helper_;
  const absl::Time deadline = CoarseDeadline(o.timeout);
  {
    std::lock_guard<SpinLock> l(mu_);
    if (!failed_.ok()) return Work::Done(failed_);
    // Only collectives take a sequence number (their message tags derive from it): ranks issue
    // different point-to-point operations, and counting those would shift every later collective's
    // tags on some ranks only.
    queue_.push_back(Item{kind, in, out, op, peer, tag, o, PointToPoint(kind) ? 0 : next_seq_++,
                          next_ticket_++, deadline, state});
  }
  // No notify: a caller that waits runs the operation itself (a thread hand-off costs tens of
  // microseconds on a busy 2-vCPU host); the executor thread polls the queue every
  // kExecutorPoll and runs operations nobody has come to wait for since (asynchronous progress).
  // Only an executor blocked on the transport's events is woken for a point-to-point operation:
  // it would not look at the queue before the next message arrived.
  if (PointToPoint(kind) && asleep_.exchange(false)) transport_->Wake();
  return Work(std::move(state));
}

void Engine::Complete(Item& item, absl::Status st) {
  AddOneWriter(ops_completed_, 1);  // under the execution lock
  item.state->status = std::move(st);
  item.state->done.Notify();
}

void Engine::FailOp(absl::Status st) {
  transport_->CancelAll();
  absl::Status sticky;
  {
    std::lock_guard<SpinLock> l(mu_);
    if (failed_.ok()) failed_ = st;
    sticky = failed_;  // a concurrent Abort's status names the real cause
  }
  transport_->Fail(sticky);
  for (auto& [id, item] : p2p_) Complete(item, sticky);
  p2p_.clear();
  // Nothing is pending now, also for the executor thread: a stale "pending" kept it polling an
  // empty list, and its loop never let Shutdown join it (a point-to-point post that failed while
  // others were in flight hung the communicator's destructor).
  PublishP2p();
}

bool Engine::PollPointToPoint() {
  bool any = false;
  const absl::Time now = base::MonotonicNow();
  for (size_t i = 0; i < p2p_.size();) {
    absl::StatusOr<bool> done = transport_->Test(p2p_[i].first);
    if (done.ok() && !*done && now > p2p_[i].second.deadline) {
      // The peer never sent (or never took) its part: blame it.
      done = BlamePeer(
          absl::DeadlineExceededError(absl::StrCat(
              "collectives: rank ", rank(), " point-to-point ",
              p2p_[i].second.kind == Kind::kSend ? "send to" : "receive from", " rank ",
              p2p_[i].second.peer, " (tag 0x", absl::Hex(p2p_[i].second.tag), ") deadline passed")),
          p2p_[i].second.peer);
    }
    if (!done.ok()) {
      FailOp(done.status());
      return true;
    }
    if (*done) {
      Complete(p2p_[i].second, absl::OkStatus());
      p2p_.erase(p2p_.begin() + i);
      any = true;
    } else {
      ++i;
    }
  }
  return any;
}

Engine::Ran Engine::RunOne() {
  std::unique_lock<SpinLock> l(mu_);
  if (queue_.empty()) {  // nothing queued: progress the pending point-to-point requests
    l.unlock();
    if (p2p_.empty()) return Ran::kNothing;
    const bool any = PollPointToPoint();
    PublishP2p();
    return any ? Ran::kProgress : Ran::kIdlePoll;
  }
  Item item = queue_.pop_front();
  const absl::Status failed = failed_;
  l.unlock();
  if (!failed.ok()) {
    Complete(item, failed);
    return Ran::kProgress;
  }
  OpContext c;
  c.t = transport_.get();
  c.seq = item.seq;
  c.deadline = item.deadline;
  if (PointToPoint(item.kind)) {
    absl::StatusOr<ReqId> id = Post(c, item);
    if (!id.ok()) {
      FailOp(id.status());
      Complete(item, failed_copy());
    } else {
      p2p_.emplace_back(*id, std::move(item));
      has_p2p_ = true;
    }
    return Ran::kProgress;
  }
  absl::Status st = Execute(c, item);
  if (!st.ok()) {
    FailOp(st);
    st = failed_copy();
  }
  Complete(item, st);
  if (!p2p_.empty()) PollPointToPoint();
  PublishP2p();
  return Ran::kProgress;
}

void IdleWait(int idle, Transport& t) {
  if (idle <= kYieldsBeforeNap) {
    sched_yield();
  } else if (t.HasEvents()) {
    if (t.ArmForEvents()) t.BlockForEvents(kEventWait);
  } else {
    absl::SleepFor(IdleNap(idle - kYieldsBeforeNap - 1, t.max_nap()));
  }
}

void Engine::Help(const Work::State* target) {
  // Waiting on peers backs off as the transports' waits do (IdleWait) — a waiter that only
  // yielded would take the vCPU from the ranks it waits for on a busy host.
  int idle = 0;
  while (!target->done.HasBeenNotified()) {
    switch (RunOne()) {
      case Ran::kNothing:
        return;  // the executor thread owns it now; the caller blocks on `done`
      case Ran::kProgress:
        idle = 0;
        break;
      case Ran::kIdlePoll:
        IdleWait(++idle, *transport_);
        break;
    }
  }
}

bool Engine::BlockOnEvents() {
  {
    std::unique_lock<std::mutex> ex(helper_->mu, std::try_to_lock);
    if (!ex.owns_lock() || !transport_->ArmForEvents()) return false;
  }
  asleep_ = true;  // from here a Submit wakes it; one queued before is seen below
  bool look_now;
  {
    std::lock_guard<SpinLock> l(mu_);
    look_now = stop_ || !queue_.empty() || !failed_.ok();
  }
  if (!look_now) transport_->BlockForEvents(kEventWait);
  asleep_ = false;
  return true;
}

void Engine::Run() {
  uint64_t seen = 0;  // tickets below this were queued before the previous poll
  // Pending point-to-point operations are polled every 50 µs, longer while none progresses on an
  // oversubscribed host (IdleNap).
  const absl::Duration max_poll = std::max(absl::Microseconds(50), transport_->max_nap());
  int idle_polls = 0;                // polls in a row that found nothing: at most kMaxIdlePolls
  constexpr int kMaxIdlePolls = 64;  // IdleNap's longest nap long before
  bool caller_runs = false;          // the last look found a caller running the operations
  for (;;) {
    bool stop, stale, woken = false;
    {
      std::unique_lock<SpinLock> l(mu_);
      // With point-to-point operations pending, poll them; an operation queued meanwhile is its
      // caller's. (The wait used to end at once whenever one was queued as well: while a caller
      // ran its operations, this thread spun on the execution lock — a vCPU per rank.)
      // An Abort wakes it (its operations fail at once, not at the next poll). On a transport with
      // events it blocks until a message comes instead; while a caller runs the operations it
      // looks every kExecutorPoll.
      const bool events = transport_->HasEvents();
      if (has_p2p_ && !stop_ && events && !caller_runs) {
        l.unlock();
        woken = BlockOnEvents();
        l.lock();
      } else if (has_p2p_ && !stop_) {
        const absl::Duration poll =
            events ? absl::FromChrono(kExecutorPoll)
                   : std::max(absl::Microseconds(50), IdleNap(idle_polls, max_poll));
        const bool failed_before = !failed_.ok();
        cv_.wait_for(l, absl::ToChronoMicroseconds(poll),
                     [&] { return stop_ || (!failed_before && !failed_.ok()); });
      } else {
        idle_polls = 0;  // the next pending operation is polled at 50 µs first
        cv_.wait_for(l, kExecutorPoll, [&] { return stop_ || has_p2p_.load(); });
      }
      if (stop_ && queue_.empty() && !has_p2p_) break;
      stop = stop_;
      // Only an operation that waited a whole poll is taken: one just queued is the caller's to
      // run when it waits, and taking it would make that caller nap until the lock is free.
      // After a wake from the events, a point-to-point operation queued meanwhile is taken: the
      // wake was for it (Submit).
      stale = !queue_.empty() &&
              (queue_.front().ticket < seen || (woken && PointToPoint(queue_.front().kind)));
      seen = next_ticket_;
    }
    if (!stale && !has_p2p_ && !stop) continue;
    // A caller that holds the execution lock is running operations: nothing to do (blocking here
    // would wake this thread after each of them, on the vCPU a peer rank may be polling on).
    std::unique_lock<std::mutex> ex(helper_->mu, std::defer_lock);
    caller_runs = false;
    if (stop) {
      ex.lock();
    } else if (!ex.try_lock()) {
      // The caller polls the pending operations as it runs: look less often.
      idle_polls = std::min(idle_polls + 1, kMaxIdlePolls);
      caller_runs = true;
      continue;
    }
    for (Ran ran; (ran = RunOne()) != Ran::kNothing;) {
      idle_polls = ran == Ran::kIdlePoll ? std::min(idle_polls + 1, kMaxIdlePolls) : 0;
      std::lock_guard<SpinLock> l(mu_);
      if (queue_.empty()) break;
    }
  }
  std::unique_lock<std::mutex> ex(helper_->mu);
  for (auto& [id, item] : p2p_) Complete(item, failed_copy());
  p2p_.clear();
}

Work Engine::AllReduce(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& o) {
  for (const absl::Status& st :
       {CheckBuffer("AllReduce", "input", in), CheckBuffer("AllReduce", "output", out),
        CheckSameDType("AllReduce", in, out),
        CheckCount("AllReduce", "output.count (= input.count)", in.count, out.count)}) {
    if (!st.ok()) return Work::Done(st);
  }
  if (o.compression != Compression::kNone) {
    if (o.compression_state == nullptr) {
      return Work::Done(absl::InvalidArgumentError(
          "AllReduce: compression_state expected non-null when compression is on, got null"));
    }
    if (op == ReduceOp::kMax) {
      return Work::Done(
          absl::InvalidArgumentError("AllReduce: compression expects op kSum or kAvg, got kMax"));
    }
  }
  return Submit(Kind::kAllReduce, in, out, op, 0, 0, o);
}

absl::Status Engine::Execute(const OpContext& c, const Item& item) {
  switch (item.kind) {
    case Kind::kAllReduce:
      return RunAllReduce(c, item.in, item.out, item.op, item.o);
    case Kind::kReduceScatter:
      return RunReduceScatter(c, item.in, item.out, item.op, item.o);
    case Kind::kAllGather:
      return RunAllGather(c, item.in, item.out);
    case Kind::kBroadcast:
      return RunBroadcast(c, item.in, item.peer, item.o);
    case Kind::kBarrier:
      return DisseminationBarrier(c, 0);
    case Kind::kSend:
    case Kind::kRecv:
      break;
  }
  return absl::InternalError("collectives: a point-to-point operation run as a collective");
}

absl::StatusOr<ReqId> Engine::Post(const OpContext& c, const Item& item) {
  const Buffer& b = item.in;
  return item.kind == Kind::kSend ? c.t->PostSend(item.peer, UserTag(item.tag), b.data, b.bytes())
                                  : c.t->PostRecv(item.peer, UserTag(item.tag), b.data, b.bytes());
}

absl::Status Engine::RunAllReduce(const OpContext& c, Buffer in, Buffer out, ReduceOp op,
                                  const CollectiveOptions& o) {
  const size_t count = in.count;
  const int n = size(), r = rank();
  if (count == 0) return absl::OkStatus();
  float* w;
  if (out.dtype == DType::kF32) {  // work directly in the output buffer
    w = static_cast<float*>(out.data);
    if (in.data != out.data) std::memcpy(w, in.data, count * sizeof(float));
  } else {
    w = ToWork(c.t, in, count);
  }
  float divisor = static_cast<float>(n);
  const Algorithm alg = Choose(o, count);
  absl::Status st;
  if (o.compression != Compression::kNone) {
    st = CompressedAllReduce(c, w, w, count, op, o);
    op = ReduceOp::kSum;  // averaging already done
  } else if (alg == Algorithm::kRecursiveDoubling) {
    st = RecursiveDoublingAllReduce(c, w, count, op, 0);
  } else if (alg == Algorithm::kSingleCopy) {
    st = SameHostAllReduce(c, w, EvenSegments(count, n), op, /*gather=*/true);
  } else if (alg == Algorithm::kRing) {
    std::vector<size_t> off = EvenSegments(count, n);
    st = RingReduceScatter(c, w, off, op, 0);
    if (st.ok()) {
      for (auto& x : off) x *= sizeof(float);
      st = RingAllGather(c, reinterpret_cast<uint8_t*>(w), off, 1);
    }
  } else {
    std::vector<size_t> off = EvenSegments(count, n);
    uint64_t lo = o.interval_lo, hi = o.interval_hi, total = 0;
    if (lo == hi) lo = r, hi = r + 1;
    st = OrderedReduceScatter(c, w, off, lo, hi, op, w + off[r], &total, 0);
    divisor = static_cast<float>(total);
    if (st.ok()) {
      for (auto& x : off) x *= sizeof(float);
      st = AllGatherSegments(c, reinterpret_cast<uint8_t*>(w), off, 2);
    }
  }
  if (!st.ok()) return st;
  if (op == ReduceOp::kAvg) DivideBy(w, count, divisor);
  FromWork(w, out, count);
  return absl::OkStatus();
}

absl::Status Engine::SameHostAllReduce(const OpContext& c, float* w, const std::vector<size_t>& off,
                                       ReduceOp op, bool gather) {
  // Staged through the shared segments where they exist (memory speed, no system call), or
  // reading the peers' buffers: where both can run, whichever the ranks measured faster for this
  // kind of operation (StagingCopy), starting from PreferSingleCopy.
  Mailboxes* m = c.t->HostShared();
  if (m == nullptr) return SingleCopyAllReduce(c, w, off, op, gather, 0);
  size_t segment = 0;
  for (size_t q = 0; q + 1 < off.size(); ++q) segment = std::max(segment, off[q + 1] - off[q]);
  const size_t bytes = off.back() * sizeof(float);
  StagingCopy& how = m->staging_copy();
  const StagingCopy::Choice choice = how.Next(bytes, gather, c.t->CanReadPeers(),
                                              PreferSingleCopy(segment * sizeof(float), L2Bytes()));
  if (!choice.single_copy) return StagedAllReduce(c, w, off, op, gather, choice);
  if (!choice.measure) return SingleCopyAllReduce(c, w, off, op, gather, 0);
  SingleCopyVote vote;
  vote.mine = how.Estimated(bytes, gather);
  TROUPE_RETURN_IF_ERROR(SingleCopyAllReduce(c, w, off, op, gather, 0, &vote));
  if (!vote.all.empty()) {  // a group of one exchanges nothing
    how.Record(bytes, gather, choice, vote.seconds);
    how.Agree(bytes, gather, vote.all);
  }
  return absl::OkStatus();
}

Algorithm Engine::Choose(const CollectiveOptions& o, size_t count) const {
  Algorithm alg = o.algorithm;
  if (alg == Algorithm::kAuto) {
    const size_t small =
        transport_->HostShared() != nullptr ? o.same_host_small_bytes : o.small_bytes;
    if (count * sizeof(float) <= small) return Algorithm::kRecursiveDoubling;
    alg = Algorithm::kSingleCopy;
  }
  if (alg == Algorithm::kSingleCopy && !transport_->CanReadPeers() &&
      transport_->HostShared() == nullptr) {
    return Algorithm::kRing;
  }
  return alg;
}

Work Engine::ReduceScatter(Buffer in, Buffer out, ReduceOp op, const CollectiveOptions& o) {
  for (const absl::Status& st :
       {CheckBuffer("ReduceScatter", "input", in), CheckBuffer("ReduceScatter", "output", out),
        CheckSameDType("ReduceScatter", in, out),
        CheckCount("ReduceScatter", "input.count (= size * output.count)", out.count * size(),
                   in.count)}) {
    if (!st.ok()) return Work::Done(st);
  }
  if (o.compression != Compression::kNone) {
    return Work::Done(absl::InvalidArgumentError(
        "ReduceScatter: compression expected kNone (supported by AllReduce only)"));
  }
  return Submit(Kind::kReduceScatter, in, out, op, 0, 0, o);
}

absl::Status Engine::RunReduceScatter(const OpContext& c, Buffer in, Buffer out, ReduceOp op,
                                      const CollectiveOptions& o) {
  const int n = size(), r = rank();
  const size_t block = out.count;
  if (block == 0) return absl::OkStatus();
  float* w = ToWork(c.t, in, in.count);
  std::vector<size_t> off(n + 1);
  for (int i = 0; i <= n; ++i) off[i] = block * i;
  float divisor = static_cast<float>(n);
  const Algorithm alg = Choose(o, in.count);
  absl::Status st;
  if (alg == Algorithm::kSingleCopy) {
    st = SameHostAllReduce(c, w, off, op, /*gather=*/false);
  } else if (alg == Algorithm::kRing) {
    st = RingReduceScatter(c, w, off, op, 0);
  } else if (alg == Algorithm::kRecursiveDoubling) {
    st = RecursiveDoublingAllReduce(c, w, in.count, op, 0);
  } else {
    uint64_t lo = o.interval_lo, hi = o.interval_hi, total = 0;
    if (lo == hi) lo = r, hi = r + 1;
    st = OrderedReduceScatter(c, w, off, lo, hi, op, w + off[r], &total, 0);
    divisor = static_cast<float>(total);
  }
  if (!st.ok()) return st;
  float* mine = w + off[r];
  if (op == ReduceOp::kAvg) DivideBy(mine, block, divisor);
  FromWork(mine, out, block);
  return absl::OkStatus();
}

Work Engine::AllGather(Buffer in, Buffer out, const CollectiveOptions& o) {
  for (const absl::Status& st :
       {CheckBuffer("AllGather", "input", in), CheckBuffer("AllGather", "output", out),
        CheckSameDType("AllGather", in, out),
        CheckCount("AllGather", "output.count (= size * input.count)", in.count * size(),
                   out.count)}) {
    if (!st.ok()) return Work::Done(st);
  }
  return Submit(Kind::kAllGather, in, out, ReduceOp::kSum, 0, 0, o);
}

absl::Status Engine::RunAllGather(const OpContext& c, Buffer in, Buffer out) {
  const int n = size(), r = rank();
  const size_t bytes = in.bytes();
  uint8_t* w = static_cast<uint8_t*>(out.data);
  if (bytes == 0) return absl::OkStatus();
  if (in.data != w + r * bytes) std::memmove(w + r * bytes, in.data, bytes);
  std::vector<size_t> off(n + 1);
  for (int i = 0; i <= n; ++i) off[i] = bytes * i;
  return AllGatherSegments(c, w, off, 0);
}

Work Engine::Broadcast(Buffer buf, int root, const CollectiveOptions& o) {
  if (auto st = CheckBuffer("Broadcast", "buffer", buf); !st.ok()) return Work::Done(st);
  if (root < 0 || root >= size()) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root expected in [0, ", size(), "), got ", root)));
  }
  return Submit(Kind::kBroadcast, buf, Buffer{}, ReduceOp::kSum, root, 0, o);
}

absl::Status Engine::RunBroadcast(const OpContext& c, Buffer buf, int root,
                                  const CollectiveOptions& o) {
  uint8_t* p = static_cast<uint8_t*>(buf.data);
  if (buf.bytes() <= o.small_bytes || size() <= 2) {
    return BinomialBroadcast(c, p, buf.bytes(), root, 0);
  }
  return ScatterAllGatherBroadcast(c, p, buf.bytes(), root, 0);
}

Work Engine::Send(Buffer buf, int peer, uint32_t tag, const CollectiveOptions& o) {
  if (auto st = CheckBuffer("Send", "buffer", buf); !st.ok()) return Work::Done(st);
  if (peer < 0 || peer >= size() || peer == rank()) {
    return Work::Done(absl::InvalidArgumentError(absl::StrCat(
        "Send: peer expected in [0, ", size(), ") and not this rank ", rank(), ", got ", peer)));
  }
  return Submit(Kind::kSend, buf, Buffer{}, ReduceOp::kSum, peer, tag, o);
}

Work Engine::Recv(Buffer buf, int peer, uint32_t tag, const CollectiveOptions& o) {
  if (auto st = CheckBuffer("Recv", "buffer", buf); !st.ok()) return Work::Done(st);
  if (peer < 0 || peer >= size() || peer == rank()) {
    return Work::Done(absl::InvalidArgumentError(absl::StrCat(
        "Recv: peer expected in [0, ", size(), ") and not this rank ", rank(), ", got ", peer)));
  }
  return Submit(Kind::kRecv, buf, Buffer{}, ReduceOp::kSum, peer, tag, o);
}

Work Engine::Barrier(const CollectiveOptions& o) {
  return Submit(Kind::kBarrier, Buffer{}, Buffer{}, ReduceOp::kSum, 0, 0, o);
}

CommStats Engine::stats() const {
  CommStats s;
  s.bytes_sent = transport_->bytes_sent();
  s.bytes_received = transport_->bytes_received();
  s.messages_sent = transport_->messages_sent();
  s.ops_completed = ops_completed_.load(std::memory_order_relaxed);
  return s;
}

std::string Engine::DebugString() const {
  std::lock_guard<SpinLock> l(mu_);
  return absl::StrCat(backend_, " communicator rank ", transport_->rank(), "/", transport_->size(),
                      " generation ", generation_, " queued ", queue_.size(), " status ",
                      failed_.ok() ? "healthy" : failed_.ToString());
}

}  // namespace troupe::collectives
