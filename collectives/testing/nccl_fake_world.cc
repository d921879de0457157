// The fake NCCL world's simulation (nccl_fake_world.h): matching, execution in stream order,
// abort; and FakeNcclWorld, which hands out its processes.
#include "nccl_fake_world.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "reduce.h"

namespace troupe::collectives::testing {
namespace {

std::atomic<uint64_t> next_world_serial{1};

std::vector<float> Load(const void* p, size_t n, DType t) {
  std::vector<float> v(n);
  if (n == 0) return v;
  if (t == DType::kF32) {
    std::memcpy(v.data(), p, n * sizeof(float));
  } else {
    Bf16ToF32(static_cast<const uint16_t*>(p), v.data(), n);
  }
  return v;
}

void Store(const float* v, size_t n, void* p, DType t) {
  if (n == 0) return;
  if (t == DType::kF32) {
    std::memmove(p, v, n * sizeof(float));
  } else {
    F32ToBf16(v, static_cast<uint16_t*>(p), n);
  }
}

}  // namespace

FakeNcclShared::~FakeNcclShared() {
  for (auto& [id, p] : procs) {
    for (void* a : p.allocations) std::free(a);
  }
}

FakeNcclShared::Comm* FakeNcclShared::FindComm(NcclCommHandle h) {
  auto it = comms.find(reinterpret_cast<Comm*>(h));
  return it == comms.end() ? nullptr : it->second.get();
}

FakeNcclShared::Stream* FakeNcclShared::FindStream(StreamHandle h) {
  auto it = streams.find(reinterpret_cast<Stream*>(h));
  return it == streams.end() || it->second->destroyed ? nullptr : it->second.get();
}

FakeNcclShared::Event* FakeNcclShared::FindEvent(EventHandle h) {
  auto it = events.find(reinterpret_cast<Event*>(h));
  return it == events.end() || it->second->destroyed ? nullptr : it->second.get();
}

void FakeNcclShared::Log(int proc, const char* name, const Comm* c) {
  procs[proc].calls.push_back({name, c ? c->id : 0, c ? c->rank : -1});
}

void FakeNcclShared::Fail(Comm* c, NcclResult r, const std::string& why) {
  if (c->async != NcclResult::kSuccess) return;
  c->async = r;
  c->last_error = why;
}

void FakeNcclShared::FailMembers(Group& g, const std::string& why) {
  for (Comm* m : g.members) {
    if (m != nullptr) Fail(m, NcclResult::kRemoteError, why);
  }
}

// At the head of its stream, or in the group at the head (a group's operations run in any
// order, as one).
bool FakeNcclShared::Runnable(const std::shared_ptr<Op>& op) {
  if (op == nullptr || op->ran || op->group_open) return false;
  const Proc& p = procs[op->proc];
  if (p.dead || p.hung || op->stream->queue.empty()) return false;
  const std::shared_ptr<Op>& head = op->stream->queue.front();
  return head == op || (op->group != 0 && head->group == op->group);
}

// Operations leave their stream in order: each once it and all before it ran.
void FakeNcclShared::Retire(Stream* s) {
  while (!s->queue.empty() && s->queue.front()->ran) {
    s->queue.front()->done = true;
    s->queue.pop_front();
  }
}

void FakeNcclShared::Finish(const std::shared_ptr<Op>& op) {
  op->ran = true;
  Retire(op->stream);
}

// Runs every operation whose match is complete and at the head of its streams, until none.
void FakeNcclShared::Progress() {
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (auto& [ptr, s] : streams) {
      while (!s->destroyed && !s->queue.empty() && s->queue.front()->kind == Kind::kLocal &&
             Runnable(s->queue.front())) {
        std::shared_ptr<Op> op = s->queue.front();
        op->run();
        Finish(op);
        progressed = true;
      }
    }
    for (auto& [id, g] : groups) {
      if (!g.ready()) continue;
      for (auto it = g.collectives.begin(); it != g.collectives.end();) {
        if (RunCollective(g, it->first, it->second)) {
          it = g.collectives.erase(it);
          progressed = true;
        } else {
          ++it;
        }
      }
      for (auto it = g.p2p.begin(); it != g.p2p.end();) {
        if (RunP2p(it->second.first, it->second.second)) {
          it = g.p2p.erase(it);
          progressed = true;
        } else {
          ++it;
        }
      }
    }
  }
}

bool FakeNcclShared::RunCollective(Group& g, uint64_t k,
                                   const std::vector<std::shared_ptr<Op>>& ops) {
  if (static_cast<int>(ops.size()) != g.nranks) return false;
  for (const auto& op : ops) {
    if (!Runnable(op)) return false;
  }
  const Op& a = *ops[0];
  for (const auto& op : ops) {
    if (op->kind != a.kind || op->count != a.count || op->dtype != a.dtype ||
        (op->op != a.op && (a.kind == Kind::kAllReduce || a.kind == Kind::kReduceScatter)) ||
        (op->root_or_peer != a.root_or_peer && a.kind == Kind::kBroadcast)) {
      for (const auto& o : ops) {
        Fail(o->comm, NcclResult::kInvalidUsage,
             absl::StrCat("fake: collective #", k, " differs between ranks 0 and ", op->comm->rank,
                          " (kind, count, type, op or root)"));
      }
      return false;
    }
  }
  const int n = g.nranks;
  const size_t count = a.count, esize = DTypeSize(a.dtype);
  if (a.kind == Kind::kAllReduce || a.kind == Kind::kReduceScatter) {
    const size_t total = a.kind == Kind::kAllReduce ? count : count * n;
    std::vector<float> acc = Load(ops[0]->send, total, a.dtype);
    for (int r = 1; r < n; ++r) {
      std::vector<float> in = Load(ops[r]->send, total, a.dtype);
      ReduceInto(acc.data(), in.data(), total, a.op);
    }
    if (a.op == ReduceOp::kAvg) DivideBy(acc.data(), total, static_cast<float>(n));
    for (int r = 0; r < n; ++r) {
      const float* part = a.kind == Kind::kAllReduce ? acc.data() : acc.data() + count * r;
      Store(part, count, ops[r]->recv, a.dtype);
    }
  } else if (a.kind == Kind::kAllGather) {
    std::vector<char> all(count * esize * n);
    for (int r = 0; r < n; ++r) {
      if (count > 0) std::memcpy(all.data() + count * esize * r, ops[r]->send, count * esize);
    }
    for (int r = 0; r < n && !all.empty(); ++r) std::memcpy(ops[r]->recv, all.data(), all.size());
  } else {  // kBroadcast
    const char* src = static_cast<const char*>(ops[a.root_or_peer]->send);
    std::vector<char> data(src, src + count * esize);
    for (int r = 0; r < n && !data.empty(); ++r) {
      std::memcpy(ops[r]->recv, data.data(), data.size());
    }
  }
  for (const auto& op : ops) Finish(op);
  return true;
}

bool FakeNcclShared::RunP2p(const std::shared_ptr<Op>& send, const std::shared_ptr<Op>& recv) {
  if (!Runnable(send) || !Runnable(recv)) return false;
  if (send->count != recv->count || send->dtype != recv->dtype) {
    std::string why = absl::StrCat("fake: send from rank ", send->comm->rank, " of ", send->count,
                                   " elements does not match the receive of ", recv->count,
                                   " at rank ", recv->comm->rank);
    Fail(send->comm, NcclResult::kInvalidUsage, why);
    Fail(recv->comm, NcclResult::kInvalidUsage, why);
    return false;
  }
  if (send->count > 0) {
    std::memmove(recv->recv, send->send, send->count * DTypeSize(send->dtype));
  }
  Finish(send);
  Finish(recv);
  return true;
}

// ncclCommAbort: the communicator's pending operations end (untouched buffers), its peers see
// a remote error, the handle is gone.
void FakeNcclShared::Abort(Comm* c) {
  for (auto& [ptr, s] : streams) {
    for (auto it = s->queue.begin(); it != s->queue.end();) {
      if ((*it)->comm == c) {
        (*it)->done = true;
        it = s->queue.erase(it);
      } else {
        ++it;
      }
    }
    Retire(s.get());
  }
  Group& g = groups[c->id];
  for (auto& [k, ops] : g.collectives) {
    for (auto& op : ops) {
      if (op != nullptr && op->comm == c) op = nullptr;
    }
  }
  for (auto& [k, pair] : g.p2p) {
    if (pair.first != nullptr && pair.first->comm == c) pair.first = nullptr;
    if (pair.second != nullptr && pair.second->comm == c) pair.second = nullptr;
  }
  if (g.members[c->rank] == c) g.members[c->rank] = nullptr;
  g.broken = true;
  // Before init finished the ranks hold no connections to each other (only to the bootstrap
  // root): they keep waiting, as in NCCL, and learn of the abort when the group forms.
  if (g.ready())
    FailMembers(g, absl::StrCat("fake: rank ", c->rank, " aborted communicator #", c->id));
  --procs[c->proc].live.comms;
  comms.erase(c);
}

FakeNcclWorld::FakeNcclWorld() : shared_(std::make_shared<FakeNcclShared>()) {
  shared_->world_serial = next_world_serial.fetch_add(1);
}

std::shared_ptr<FakeNcclWorld> FakeNcclWorld::Create() {
  return std::shared_ptr<FakeNcclWorld>(new FakeNcclWorld());
}

std::shared_ptr<FakeNcclProcess> FakeNcclWorld::Process(int id) {
  std::lock_guard<std::mutex> l(mu_);
  auto& p = processes_[id];
  if (p == nullptr) p = std::make_shared<FakeNcclProcess>(shared_, id);
  return p;
}

}  // namespace troupe::collectives::testing
