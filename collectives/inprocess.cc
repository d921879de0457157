#include "troupe/collectives/inprocess.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine.h"
#include "troupe/base/clock.h"

namespace troupe::collectives {
namespace {

struct Req {
  bool done = false;
};

struct Posted {
  int owner;  // rank that posted it
  int peer;   // the other side
  uint64_t tag;
  void* buf;
  size_t bytes;
  std::shared_ptr<Req> req;
};

class InProcTransport;

struct Mailbox {
  std::list<Posted> sends;  // sends addressed to this rank, not yet matched
  std::list<Posted> recvs;  // receives this rank posted, not yet matched
  std::condition_variable cv;
};

struct Shared {
  std::mutex mu;
  std::vector<Mailbox> boxes;
  std::vector<InProcTransport*> transports;
  explicit Shared(int n) : boxes(n), transports(n, nullptr) {}
};

class InProcTransport : public Transport {
 public:
  InProcTransport(std::shared_ptr<Shared> sh, int rank, int size)
      : sh_(std::move(sh)), rank_(rank), size_(size) {}
  ~InProcTransport() override {
    CancelAll();
    std::lock_guard<std::mutex> l(sh_->mu);
    sh_->transports[rank_] = nullptr;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<ReqId> PostSend(int peer, uint64_t tag, const void* buf, size_t bytes) override {
    std::lock_guard<std::mutex> l(sh_->mu);
    if (!failed_.ok()) return failed_;
    auto req = std::make_shared<Req>();
    CountSend(bytes);
    Mailbox& dst = sh_->boxes[peer];
    for (auto it = dst.recvs.begin(); it != dst.recvs.end(); ++it) {
      if (it->peer == rank_ && it->tag == tag) {
        std::memcpy(it->buf, buf, std::min(bytes, it->bytes));
        CountRecvOf(peer, bytes);
        it->req->done = true;
        req->done = true;
        dst.recvs.erase(it);
        dst.cv.notify_all();
        return Track(req);
      }
    }
    dst.sends.push_back(Posted{rank_, peer, tag, const_cast<void*>(buf), bytes, req});
    return Track(req);
  }

  absl::StatusOr<ReqId> PostRecv(int peer, uint64_t tag, void* buf, size_t bytes) override {
    std::lock_guard<std::mutex> l(sh_->mu);
    if (!failed_.ok()) return failed_;
    auto req = std::make_shared<Req>();
    Mailbox& me = sh_->boxes[rank_];
    for (auto it = me.sends.begin(); it != me.sends.end(); ++it) {
      if (it->owner == peer && it->tag == tag) {
        std::memcpy(buf, it->buf, std::min(bytes, it->bytes));
        CountRecv(bytes);
        it->req->done = true;
        req->done = true;
        me.sends.erase(it);
        sh_->boxes[peer].cv.notify_all();
        return Track(req);
      }
    }
    me.recvs.push_back(Posted{rank_, peer, tag, buf, bytes, req});
    return Track(req);
  }

  absl::Status WaitAll(absl::Span<const ReqId> reqs, absl::Time deadline) override {
    std::unique_lock<std::mutex> l(sh_->mu);
    auto all_done = [&] {
      for (ReqId id : reqs) {
        if (!outstanding_[id]->done) return false;
      }
      return true;
    };
    Mailbox& me = sh_->boxes[rank_];
    for (;;) {
      if (all_done()) break;
      if (!failed_.ok()) {
        absl::Status st = failed_;
        l.unlock();
        CancelAll();
        return st;
      }
      // `deadline` is on base::MonotonicNow()'s clock: waited for as a duration (wait_for runs on
      // steady_clock), never as a system_clock time point.
      const absl::Duration left = deadline - base::MonotonicNow();
      if (deadline == absl::InfiniteFuture()) {
        me.cv.wait(l);
      } else if (left > absl::ZeroDuration()) {
        me.cv.wait_for(l, absl::ToChronoNanoseconds(std::min(left, absl::Hours(1))));
      } else {
        l.unlock();
        CancelAll();
        return absl::DeadlineExceededError(
            absl::StrCat("collectives: rank ", rank_, " operation deadline passed"));
      }
    }
    for (ReqId id : reqs) outstanding_.erase(id);
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Test(ReqId id) override {
    std::lock_guard<std::mutex> l(sh_->mu);
    if (!failed_.ok()) return failed_;
    auto it = outstanding_.find(id);
    if (it == outstanding_.end()) return absl::InternalError("collectives: unknown request");
    if (!it->second->done) return false;
    outstanding_.erase(it);
    return true;
  }

  void CancelAll() override {
    std::lock_guard<std::mutex> l(sh_->mu);
    for (auto& box : sh_->boxes) {
      box.sends.remove_if([&](const Posted& p) { return p.owner == rank_; });
    }
    sh_->boxes[rank_].recvs.clear();
    outstanding_.clear();
  }

  void Fail(absl::Status status) override {
    std::lock_guard<std::mutex> l(sh_->mu);
    FailLocked(std::move(status));
  }
  void FailLocked(absl::Status status) {
    if (failed_.ok()) failed_ = std::move(status);
    sh_->boxes[rank_].cv.notify_all();
  }

  // One address space: every peer's memory is readable.
  bool CanReadPeers() const override { return true; }
  absl::Status ReadPeer(int /*peer*/, uint64_t remote, void* local, size_t bytes) override {
    {
      std::lock_guard<std::mutex> l(sh_->mu);
      if (!failed_.ok()) return failed_;
    }
    std::memcpy(local, reinterpret_cast<const void*>(remote), bytes);
    std::lock_guard<std::mutex> l(sh_->mu);  // peers count into this transport under it too
    CountRecv(bytes);
    return absl::OkStatus();
  }

  void* Scratch(int slot, size_t bytes) override {
    if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1);
    auto& v = scratch_[slot];
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }

 private:
  ReqId Track(std::shared_ptr<Req> r) {
    const ReqId id = ++next_id_;
    outstanding_[id] = std::move(r);
    return id;
  }
  void CountRecvOf(int peer, size_t bytes) {
    if (sh_->transports[peer] != nullptr) sh_->transports[peer]->CountRecvPublic(bytes);
  }

 public:
  void CountRecvPublic(size_t bytes) { CountRecv(bytes); }

 private:
  std::shared_ptr<Shared> sh_;
  const int rank_, size_;
  absl::Status failed_;                                          // guarded by sh_->mu
  std::unordered_map<ReqId, std::shared_ptr<Req>> outstanding_;  // guarded by sh_->mu
  ReqId next_id_ = 0;
  std::vector<std::vector<uint8_t>> scratch_;
};

class GroupImpl : public InProcessGroup {
 public:
  explicit GroupImpl(std::shared_ptr<Shared> sh) : sh_(std::move(sh)) {}
  void KillRank(int rank) override {
    std::lock_guard<std::mutex> l(sh_->mu);
    for (size_t i = 0; i < sh_->transports.size(); ++i) {
      if (sh_->transports[i] == nullptr) continue;
      sh_->transports[i]->FailLocked(absl::UnavailableError(
          static_cast<int>(i) == rank
              ? absl::StrCat("collectives: this rank ", rank, " was killed")
              : absl::StrCat("collectives: peer rank ", rank, " died (in-process kill)")));
    }
  }

 private:
  std::shared_ptr<Shared> sh_;
};

}  // namespace

std::shared_ptr<InProcessGroup> InProcessGroup::Create(
    int size, uint64_t generation, std::vector<std::unique_ptr<Communicator>>* comms) {
  auto sh = std::make_shared<Shared>(size);
  comms->clear();
  for (int r = 0; r < size; ++r) {
    auto t = std::make_unique<InProcTransport>(sh, r, size);
    sh->transports[r] = t.get();
    comms->push_back(std::make_unique<Engine>(std::move(t), generation, "in-process"));
  }
  return std::make_shared<GroupImpl>(std::move(sh));
}

}  // namespace troupe::collectives
