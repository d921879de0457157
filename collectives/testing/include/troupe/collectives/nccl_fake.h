// troupe/collectives/nccl_fake.h — test support, never installed (target
// troupe_collectives_nccl_fake): an in-process fake of NCCL and the CUDA runtime behind
// NcclBackend (collectives/nccl_backend.h, private), so the NCCL communicator's multi-rank logic
// runs in CI without a GPU. The calls are in testing/nccl_fake.cc, the world they act on in
// testing/nccl_fake_world.{h,cc}.
//
// A FakeNcclWorld is the network; each FakeNcclProcess is one rank's process — its own "NCCL
// library" and device — and the NcclBackend that rank's communicator uses. Ranks are threads of
// this process; "device memory" is host memory. What it mimics:
//   * GetUniqueId makes an id unique in the world; communicators rendezvous by id and rank.
//     ncclCommInitRankConfig (non-blocking) leaves the communicator ncclInProgress until every
//     rank of the id joined — a missing rank keeps the others in progress forever.
//   * Operations are asynchronous, in stream order: an enqueue returns at once; a collective runs
//     when every rank enqueued its matching one (the k-th collective of each rank) and each is at
//     the head of its stream; a send runs with the peer's matching receive (the k-th between the
//     pair); calls between ncclGroupStart and ncclGroupEnd run from the group's end on, in any
//     order among themselves (so sends and receives between two ranks cannot wait on each other),
//     the rest of the stream after the whole group. cudaMemcpyAsync and the AddF32 kernel are
//     host work in stream order ("device memory" and pinned memory are host memory). Events
//     complete when the work recorded before them ran. Sum, avg and max for f32 and bf16
//     (accumulated in f32 in rank order, rounded once); mismatched collectives (kind, count, type,
//     op, root) or send/recv sizes are ncclInvalidUsage on every rank involved.
//   * ncclCommAbort ends the communicator's pending operations (their events complete, their
//     buffers are untouched; copies and kernels queued behind them still run, as on a device;
//     cudaStreamDestroy drops those still queued) and makes every peer's communicator report
//     ncclRemoteError, as NCCL reports a peer that aborted or died over a network transport. An
//     abort during init is not seen by the peers still initialising (they hold no connection to
//     it yet: in NCCL they wait on the bootstrap root); they learn of it only if the group
//     completes.
//   * Faults, addressed by process: Kill (a silent death: its calls do nothing from then on and
//     peers are not told — their operations wait for their own Abort or deadline), Hang (its
//     operations never run, so its collectives stall everywhere, like a stuck kernel),
//     InjectAsyncError, enqueues that stay ncclInProgress for some polls, a device count or an
//     error from cudaGetDeviceCount.
//   * Observation: each process logs its calls (name, id serial, rank) — not the polls
//     (ncclCommGetAsyncError, cudaEventQuery) — and counts its live resources.
// Thread-safe: one mutex for the world; collectives execute in the thread whose call completes
// the match.
//
// Example:
//   auto world = FakeNcclWorld::Create();
//   // thread r: CreateNcclCommunicator(bootstrap, options_r, world->Process(r))
//   world->Process(3)->Kill();
//   EXPECT_EQ(world->Process(0)->CountCalls("ncclCommAbort"), 1);
#ifndef TROUPE_COLLECTIVES_NCCL_FAKE_H_
#define TROUPE_COLLECTIVES_NCCL_FAKE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nccl_backend.h"

namespace troupe::collectives::testing {

// One backend call as the process made it. `id` is the serial of the unique id of the
// communicator it concerns (0 for none), `rank` its rank in that communicator (-1 for none).
struct FakeNcclCall {
  std::string name;  // the NCCL / CUDA function's name, e.g. "ncclCommAbort"
  uint64_t id = 0;
  int rank = -1;
};

// Resources a process holds now (created and not yet destroyed / freed / aborted).
struct FakeNcclResources {
  int comms = 0, streams = 0, events = 0, allocations = 0;
  bool operator==(const FakeNcclResources& o) const {
    return comms == o.comms && streams == o.streams && events == o.events &&
           allocations == o.allocations;
  }
};

struct FakeNcclShared;  // the world's state, in nccl_fake_world.h

class FakeNcclProcess final : public NcclBackend {
 public:
  FakeNcclProcess(std::shared_ptr<FakeNcclShared> world, int id);
  ~FakeNcclProcess() override;

  // --- faults ---
  void Kill();
  void Hang();
  // Every live communicator of this process reports `r` from ncclCommGetAsyncError from now on.
  void InjectAsyncError(NcclResult r);
  // Each later enqueue returns ncclInProgress, and ncclCommGetAsyncError says so `polls` times.
  void SetEnqueueInProgressPolls(int polls);
  // cudaGetDeviceCount's answer (default: 1 device, success).
  void SetDevices(int count, CudaError error = kCudaSuccess);

  // --- observation ---
  std::vector<FakeNcclCall> Calls() const;
  int CountCalls(const std::string& name) const;
  FakeNcclResources Live() const;

  // --- NcclBackend ---
  NcclResult GetVersion(int* version) override;
  NcclResult GetUniqueId(NcclUniqueId* id) override;
  NcclResult CommInitRankNonBlocking(NcclCommHandle* comm, int nranks, const NcclUniqueId& id,
                                     int rank) override;
  NcclResult CommGetAsyncError(NcclCommHandle comm, NcclResult* async_error) override;
  NcclResult CommAbort(NcclCommHandle comm) override;
  std::string LastError(NcclCommHandle comm) override;
  const char* ErrorString(NcclResult r) override;
  NcclResult AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       NcclCommHandle comm, StreamHandle stream) override;
  NcclResult ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                           ReduceOp op, NcclCommHandle comm, StreamHandle stream) override;
  NcclResult AllGather(const void* send, void* recv, size_t send_count, DType dtype,
                       NcclCommHandle comm, StreamHandle stream) override;
  NcclResult Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                       NcclCommHandle comm, StreamHandle stream) override;
  NcclResult Send(const void* buf, size_t count, DType dtype, int peer, NcclCommHandle comm,
                  StreamHandle stream) override;
  NcclResult Recv(void* buf, size_t count, DType dtype, int peer, NcclCommHandle comm,
                  StreamHandle stream) override;
  NcclResult GroupStart() override;
  NcclResult GroupEnd() override;
  CudaError GetDeviceCount(int* count) override;
  CudaError SetDevice(int device) override;
  CudaError StreamCreateNonBlocking(StreamHandle* stream) override;
  CudaError StreamDestroy(StreamHandle stream) override;
  CudaError EventCreateDisableTiming(EventHandle* event) override;
  CudaError EventRecord(EventHandle event, StreamHandle stream) override;
  CudaError EventQuery(EventHandle event) override;
  CudaError EventDestroy(EventHandle event) override;
  CudaError Malloc(void** ptr, size_t bytes) override;
  CudaError Free(void* ptr) override;
  CudaError MallocHost(void** ptr, size_t bytes) override;
  CudaError FreeHost(void* ptr) override;
  CudaError MemcpyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) override;
  CudaError AddF32(float* dst, const float* a, const float* b, size_t n,
                   StreamHandle stream) override;
  const char* CudaErrorName(CudaError e) override;
  const char* CudaErrorString(CudaError e) override;

 private:
  struct OpArgs;
  NcclResult Enqueue(const char* name, const OpArgs& args, NcclCommHandle comm,
                     StreamHandle stream);
  CudaError EnqueueLocal(const char* name, StreamHandle stream, std::function<void()> run);
  const std::shared_ptr<FakeNcclShared> w_;
  const int id_;
};

class FakeNcclWorld {
 public:
  static std::shared_ptr<FakeNcclWorld> Create();
  // The process `id` (created on first use; the same object afterwards).
  std::shared_ptr<FakeNcclProcess> Process(int id);

 private:
  FakeNcclWorld();
  std::shared_ptr<FakeNcclShared> shared_;
  std::mutex mu_;
  std::map<int, std::shared_ptr<FakeNcclProcess>> processes_;
};

}  // namespace troupe::collectives::testing

#endif  // TROUPE_COLLECTIVES_NCCL_FAKE_H_
