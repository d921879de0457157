// Private, test support: the state of a fake NCCL world (nccl_fake.h) and the simulation that
// runs it — the network and every process's "device": communicators rendezvous into groups,
// streams hold enqueued work in order, and Progress() runs whatever has its match (the k-th
// collective of every rank, the k-th send with the k-th receive) at the head of its streams.
// FakeNcclProcess (nccl_fake.cc) makes the calls; this file decides what they do to the world.
// Threads: every member is guarded by `mu`, which the caller holds.
#ifndef TROUPE_COLLECTIVES_TESTING_NCCL_FAKE_WORLD_H_
#define TROUPE_COLLECTIVES_TESTING_NCCL_FAKE_WORLD_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nccl_backend.h"
#include "troupe/collectives/nccl_fake.h"

namespace troupe::collectives::testing {

struct FakeNcclShared {
  // kLocal: a copy or kernel of this process's own (cudaMemcpyAsync, AddF32): `run` does it.
  enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv, kLocal };
  struct Comm;
  struct Stream;
  struct Op {
    Kind kind;
    const void* send;
    void* recv;
    size_t count;
    DType dtype;
    ReduceOp op;
    int root_or_peer;
    Comm* comm;  // null for kLocal
    Stream* stream;
    int proc;
    uint64_t group = 0;       // the ncclGroupStart..End it was issued in (0: none)
    bool group_open = false;  // issued in a group not yet ended: not runnable
    bool ran = false;         // executed; `done` once every op before it on the stream is too
    bool done = false;
    std::function<void()> run = nullptr;  // kLocal
  };
  struct Comm {
    int proc;
    uint64_t id;
    int rank;
    NcclResult async = NcclResult::kSuccess;
    int settle_polls = 0;  // polls left that report an enqueue still in progress
    uint64_t collectives = 0;
    std::map<int, uint64_t> sent, received;  // per peer
    std::string last_error;
  };
  struct Stream {
    int proc;
    std::deque<std::shared_ptr<Op>> queue;  // enqueued, not yet run, in order
    bool destroyed = false;
  };
  struct Event {
    int proc;
    std::shared_ptr<Op> last;  // the stream's last op when recorded; null: nothing to wait for
    bool never = false;        // recorded by a dead process
    bool destroyed = false;
  };
  struct Group {
    int nranks = 0;
    std::vector<Comm*> members;  // null: not joined yet, or aborted
    std::vector<bool> taken;
    int joined = 0;
    bool broken = false;                                               // a member aborted
    std::map<uint64_t, std::vector<std::shared_ptr<Op>>> collectives;  // k-th collective by rank
    // (src, dst, k) -> (k-th send from src to dst, k-th receive at dst from src)
    std::map<std::tuple<int, int, uint64_t>, std::pair<std::shared_ptr<Op>, std::shared_ptr<Op>>>
        p2p;
    bool ready() const { return joined == nranks; }
  };
  struct Proc {
    bool dead = false, hung = false;
    int settle_polls = 0;
    int devices = 1;
    CudaError device_error = kCudaSuccess;
    int group_depth = 0;  // ncclGroupStart calls not yet ended
    uint64_t group = 0;   // the serial of the outermost open group
    std::vector<std::shared_ptr<Op>> group_ops;
    std::vector<FakeNcclCall> calls;
    FakeNcclResources live;
    std::set<void*> allocations;
  };

  ~FakeNcclShared();

  // Handles back to state: null when unknown (or, for streams and events, destroyed).
  Comm* FindComm(NcclCommHandle h);
  Stream* FindStream(StreamHandle h);
  Event* FindEvent(EventHandle h);
  // Records a call in the process's log (FakeNcclProcess::Calls).
  void Log(int proc, const char* name, const Comm* c = nullptr);
  // The first asynchronous error of `c` (or of every member of `g`: ncclRemoteError) sticks.
  static void Fail(Comm* c, NcclResult r, const std::string& why);
  static void FailMembers(Group& g, const std::string& why);

  // --- the simulation ---
  bool Runnable(const std::shared_ptr<Op>& op);
  static void Retire(Stream* s);
  static void Finish(const std::shared_ptr<Op>& op);
  void Progress();
  bool RunCollective(Group& g, uint64_t k, const std::vector<std::shared_ptr<Op>>& ops);
  bool RunP2p(const std::shared_ptr<Op>& send, const std::shared_ptr<Op>& recv);
  void Abort(Comm* c);

  std::mutex mu;
  uint64_t world_serial = 0;
  uint64_t next_id = 1;
  uint64_t next_group = 1;
  std::map<int, Proc> procs;
  std::map<uint64_t, Group> groups;
  std::map<Comm*, std::unique_ptr<Comm>> comms;
  std::map<Stream*, std::unique_ptr<Stream>> streams;
  std::map<Event*, std::unique_ptr<Event>> events;
};

}  // namespace troupe::collectives::testing

#endif  // TROUPE_COLLECTIVES_TESTING_NCCL_FAKE_WORLD_H_
