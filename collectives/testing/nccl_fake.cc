// The in-process NCCL / CUDA fake: one process's calls (nccl_fake.h says what it mimics) into
// the world they share (nccl_fake_world.h).
#include "troupe/collectives/nccl_fake.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nccl_fake_world.h"

namespace troupe::collectives::testing {
namespace {

constexpr char kMagic[16] = "troupe-fake-id";
constexpr CudaError kCudaErrorInvalidValue = 1;
constexpr CudaError kCudaErrorInvalidDevice = 101;
constexpr CudaError kCudaErrorInvalidResourceHandle = 400;

}  // namespace

struct FakeNcclProcess::OpArgs {
  FakeNcclShared::Kind kind;
  const void* send;
  void* recv;
  size_t count;
  DType dtype;
  ReduceOp op;
  int root_or_peer;
};

FakeNcclProcess::FakeNcclProcess(std::shared_ptr<FakeNcclShared> world, int id)
    : w_(std::move(world)), id_(id) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->procs[id_];
}

FakeNcclProcess::~FakeNcclProcess() = default;

void FakeNcclProcess::Kill() {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->procs[id_].dead = true;
}

void FakeNcclProcess::Hang() {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->procs[id_].hung = true;
}

void FakeNcclProcess::InjectAsyncError(NcclResult r) {
  std::lock_guard<std::mutex> l(w_->mu);
  for (auto& [ptr, c] : w_->comms) {
    if (c->proc == id_) {
      FakeNcclShared::Fail(c.get(), r, absl::StrCat("fake: injected ", NcclResultName(r)));
    }
  }
}

void FakeNcclProcess::SetEnqueueInProgressPolls(int polls) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->procs[id_].settle_polls = polls;
}

void FakeNcclProcess::SetDevices(int count, CudaError error) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->procs[id_].devices = count;
  w_->procs[id_].device_error = error;
}

std::vector<FakeNcclCall> FakeNcclProcess::Calls() const {
  std::lock_guard<std::mutex> l(w_->mu);
  return w_->procs[id_].calls;
}

int FakeNcclProcess::CountCalls(const std::string& name) const {
  int n = 0;
  for (const FakeNcclCall& c : Calls()) n += c.name == name;
  return n;
}

FakeNcclResources FakeNcclProcess::Live() const {
  std::lock_guard<std::mutex> l(w_->mu);
  return w_->procs[id_].live;
}

NcclResult FakeNcclProcess::GetVersion(int* version) {
  *version = 22809;  // the API the fake follows: NCCL 2.28.9's
  return NcclResult::kSuccess;
}

NcclResult FakeNcclProcess::GetUniqueId(NcclUniqueId* id) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "ncclGetUniqueId");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kMagic, sizeof(kMagic));
  std::memcpy(id->internal + 16, &w_->world_serial, 8);
  uint64_t serial = w_->next_id++;
  std::memcpy(id->internal + 24, &serial, 8);
  return NcclResult::kSuccess;
}

NcclResult FakeNcclProcess::CommInitRankNonBlocking(NcclCommHandle* comm, int nranks,
                                                    const NcclUniqueId& id, int rank) {
  std::lock_guard<std::mutex> l(w_->mu);
  uint64_t world = 0, serial = 0;
  std::memcpy(&world, id.internal + 16, 8);
  std::memcpy(&serial, id.internal + 24, 8);
  w_->procs[id_].calls.push_back({"ncclCommInitRankConfig", serial, rank});
  if (std::memcmp(id.internal, kMagic, sizeof(kMagic)) != 0 || world != w_->world_serial) {
    return NcclResult::kInvalidArgument;  // not an id of this world
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) return NcclResult::kInvalidArgument;
  auto [it, created] = w_->groups.try_emplace(serial);
  FakeNcclShared::Group& g = it->second;
  if (created) {
    g.nranks = nranks;
    g.members.assign(nranks, nullptr);
    g.taken.assign(nranks, false);
  }
  if (g.nranks != nranks) return NcclResult::kInvalidArgument;
  if (g.taken[rank]) return NcclResult::kInvalidUsage;
  auto c = std::make_unique<FakeNcclShared::Comm>();
  c->proc = id_;
  c->id = serial;
  c->rank = rank;
  FakeNcclShared::Comm* raw = c.get();
  w_->comms.emplace(raw, std::move(c));
  ++w_->procs[id_].live.comms;
  *comm = reinterpret_cast<NcclCommHandle>(raw);
  if (!w_->procs[id_].dead) {  // a dead process never joins: the others stay in progress
    g.taken[rank] = true;
    g.members[rank] = raw;
    ++g.joined;
    if (g.ready() && g.broken) {
      FakeNcclShared::FailMembers(g, "fake: a rank aborted before the communicator formed");
    }
  }
  return NcclResult::kInProgress;
}

NcclResult FakeNcclProcess::CommGetAsyncError(NcclCommHandle comm, NcclResult* async_error) {
  std::lock_guard<std::mutex> l(w_->mu);
  FakeNcclShared::Comm* c = w_->FindComm(comm);
  if (c == nullptr) return NcclResult::kInvalidArgument;
  if (c->async != NcclResult::kSuccess) {
    *async_error = c->async;
  } else if (!w_->groups[c->id].ready()) {
    *async_error = NcclResult::kInProgress;
  } else if (c->settle_polls > 0) {
    --c->settle_polls;
    *async_error = NcclResult::kInProgress;
  } else {
    *async_error = NcclResult::kSuccess;
  }
  return NcclResult::kSuccess;
}

NcclResult FakeNcclProcess::CommAbort(NcclCommHandle comm) {
  std::lock_guard<std::mutex> l(w_->mu);
  FakeNcclShared::Comm* c = w_->FindComm(comm);
  w_->Log(id_, "ncclCommAbort", c);
  if (c == nullptr) return NcclResult::kInvalidArgument;
  if (w_->procs[id_].dead) return NcclResult::kSuccess;  // a dead process does nothing
  w_->Abort(c);
  w_->Progress();  // ops that waited behind the aborted ones on a stream may run now
  return NcclResult::kSuccess;
}

std::string FakeNcclProcess::LastError(NcclCommHandle comm) {
  std::lock_guard<std::mutex> l(w_->mu);
  FakeNcclShared::Comm* c = w_->FindComm(comm);
  return c == nullptr ? "" : c->last_error;
}

const char* FakeNcclProcess::ErrorString(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess:
      return "no error";
    case NcclResult::kUnhandledCudaError:
      return "unhandled cuda error (fake)";
    case NcclResult::kSystemError:
      return "unhandled system error (fake)";
    case NcclResult::kInternalError:
      return "internal error (fake)";
    case NcclResult::kInvalidArgument:
      return "invalid argument (fake)";
    case NcclResult::kInvalidUsage:
      return "invalid usage (fake)";
    case NcclResult::kRemoteError:
      return "remote process exited or there was a network error (fake)";
    case NcclResult::kInProgress:
      return "operation in progress (fake)";
  }
  return "unknown result (fake)";
}

NcclResult FakeNcclProcess::Enqueue(const char* name, const OpArgs& a, NcclCommHandle comm,
                                    StreamHandle stream) {
  std::lock_guard<std::mutex> l(w_->mu);
  FakeNcclShared::Comm* c = w_->FindComm(comm);
  w_->Log(id_, name, c);
  if (c == nullptr) return NcclResult::kInvalidArgument;
  FakeNcclShared::Stream* s = w_->FindStream(stream);
  if (s == nullptr) return NcclResult::kUnhandledCudaError;
  FakeNcclShared::Proc& p = w_->procs[id_];
  if (p.dead) return NcclResult::kSuccess;  // swallowed: it never runs
  if (c->async != NcclResult::kSuccess) return c->async;
  FakeNcclShared::Group& g = w_->groups[c->id];
  if (!g.ready()) {
    FakeNcclShared::Fail(c, NcclResult::kInvalidUsage, "fake: operation before init finished");
    return NcclResult::kInvalidUsage;
  }
  using Kind = FakeNcclShared::Kind;
  const bool p2p = a.kind == Kind::kSend || a.kind == Kind::kRecv;
  if ((p2p || a.kind == Kind::kBroadcast) && (a.root_or_peer < 0 || a.root_or_peer >= g.nranks)) {
    return NcclResult::kInvalidArgument;
  }
  auto op = std::make_shared<FakeNcclShared::Op>(FakeNcclShared::Op{
      a.kind, a.send, a.recv, a.count, a.dtype, a.op, a.root_or_peer, c, s, id_});
  if (p.group_depth > 0) {  // runs from ncclGroupEnd on, with the rest of its group
    op->group = p.group;
    op->group_open = true;
    p.group_ops.push_back(op);
  }
  s->queue.push_back(op);
  if (!p2p) {
    auto& slots = g.collectives[c->collectives++];
    slots.resize(g.nranks);
    slots[c->rank] = op;
  } else if (a.kind == Kind::kSend) {
    g.p2p[{c->rank, a.root_or_peer, c->sent[a.root_or_peer]++}].first = op;
  } else {
    g.p2p[{a.root_or_peer, c->rank, c->received[a.root_or_peer]++}].second = op;
  }
  if (p.group_depth > 0) return NcclResult::kSuccess;  // the group's end reports progress
  w_->Progress();
  if (p.settle_polls > 0) {
    c->settle_polls = p.settle_polls;
    return NcclResult::kInProgress;
  }
  return NcclResult::kSuccess;
}

NcclResult FakeNcclProcess::GroupStart() {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "ncclGroupStart");
  FakeNcclShared::Proc& p = w_->procs[id_];
  if (p.group_depth++ == 0) p.group = w_->next_group++;
  return NcclResult::kSuccess;
}

NcclResult FakeNcclProcess::GroupEnd() {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "ncclGroupEnd");
  FakeNcclShared::Proc& p = w_->procs[id_];
  if (p.group_depth == 0) return NcclResult::kInvalidUsage;
  if (--p.group_depth > 0) return NcclResult::kSuccess;
  std::vector<std::shared_ptr<FakeNcclShared::Op>> ops;
  ops.swap(p.group_ops);
  for (const auto& op : ops) op->group_open = false;
  w_->Progress();
  if (p.settle_polls > 0 && !ops.empty()) {
    for (const auto& op : ops) {
      if (w_->FindComm(reinterpret_cast<NcclCommHandle>(op->comm)) != nullptr) {
        op->comm->settle_polls = p.settle_polls;
      }
    }
    return NcclResult::kInProgress;
  }
  return NcclResult::kSuccess;
}

NcclResult FakeNcclProcess::AllReduce(const void* send, void* recv, size_t count, DType dtype,
                                      ReduceOp op, NcclCommHandle comm, StreamHandle stream) {
  return Enqueue("ncclAllReduce",
                 {FakeNcclShared::Kind::kAllReduce, send, recv, count, dtype, op, 0}, comm, stream);
}

NcclResult FakeNcclProcess::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                          DType dtype, ReduceOp op, NcclCommHandle comm,
                                          StreamHandle stream) {
  return Enqueue("ncclReduceScatter",
                 {FakeNcclShared::Kind::kReduceScatter, send, recv, recv_count, dtype, op, 0}, comm,
                 stream);
}

NcclResult FakeNcclProcess::AllGather(const void* send, void* recv, size_t send_count, DType dtype,
                                      NcclCommHandle comm, StreamHandle stream) {
  return Enqueue(
      "ncclAllGather",
      {FakeNcclShared::Kind::kAllGather, send, recv, send_count, dtype, ReduceOp::kSum, 0}, comm,
      stream);
}

NcclResult FakeNcclProcess::Broadcast(const void* send, void* recv, size_t count, DType dtype,
                                      int root, NcclCommHandle comm, StreamHandle stream) {
  return Enqueue("ncclBroadcast",
                 {FakeNcclShared::Kind::kBroadcast, send, recv, count, dtype, ReduceOp::kSum, root},
                 comm, stream);
}

NcclResult FakeNcclProcess::Send(const void* buf, size_t count, DType dtype, int peer,
                                 NcclCommHandle comm, StreamHandle stream) {
  return Enqueue("ncclSend",
                 {FakeNcclShared::Kind::kSend, buf, nullptr, count, dtype, ReduceOp::kSum, peer},
                 comm, stream);
}

NcclResult FakeNcclProcess::Recv(void* buf, size_t count, DType dtype, int peer,
                                 NcclCommHandle comm, StreamHandle stream) {
  return Enqueue("ncclRecv",
                 {FakeNcclShared::Kind::kRecv, nullptr, buf, count, dtype, ReduceOp::kSum, peer},
                 comm, stream);
}

CudaError FakeNcclProcess::GetDeviceCount(int* count) {
  std::lock_guard<std::mutex> l(w_->mu);
  const FakeNcclShared::Proc& p = w_->procs[id_];
  *count = p.device_error == kCudaSuccess ? p.devices : 0;
  return p.device_error;
}

CudaError FakeNcclProcess::SetDevice(int device) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaSetDevice");
  const FakeNcclShared::Proc& p = w_->procs[id_];
  if (p.device_error != kCudaSuccess) return p.device_error;
  return device >= 0 && device < p.devices ? kCudaSuccess : kCudaErrorInvalidDevice;
}

CudaError FakeNcclProcess::StreamCreateNonBlocking(StreamHandle* stream) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaStreamCreateWithFlags");
  auto s = std::make_unique<FakeNcclShared::Stream>();
  s->proc = id_;
  *stream = reinterpret_cast<StreamHandle>(s.get());
  w_->streams.emplace(s.get(), std::move(s));
  ++w_->procs[id_].live.streams;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::StreamDestroy(StreamHandle stream) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaStreamDestroy");
  FakeNcclShared::Stream* s = w_->FindStream(stream);
  if (s == nullptr) return kCudaErrorInvalidResourceHandle;
  s->destroyed = true;  // kept: events may still point at its ops
  // Work still queued never runs (a real stream would run it before the memory it uses is
  // freed; here it would touch freed memory).
  for (auto& op : s->queue) op->done = true;
  s->queue.clear();
  --w_->procs[id_].live.streams;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::EventCreateDisableTiming(EventHandle* event) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaEventCreateWithFlags");
  auto e = std::make_unique<FakeNcclShared::Event>();
  e->proc = id_;
  *event = reinterpret_cast<EventHandle>(e.get());
  w_->events.emplace(e.get(), std::move(e));
  ++w_->procs[id_].live.events;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::EventRecord(EventHandle event, StreamHandle stream) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaEventRecord");
  FakeNcclShared::Event* e = w_->FindEvent(event);
  FakeNcclShared::Stream* s = w_->FindStream(stream);
  if (e == nullptr || s == nullptr) return kCudaErrorInvalidResourceHandle;
  e->last = s->queue.empty() ? nullptr : s->queue.back();
  e->never = w_->procs[id_].dead;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::EventQuery(EventHandle event) {
  std::lock_guard<std::mutex> l(w_->mu);
  FakeNcclShared::Event* e = w_->FindEvent(event);
  if (e == nullptr) return kCudaErrorInvalidResourceHandle;
  if (e->never || w_->procs[id_].dead) return kCudaErrorNotReady;
  return e->last == nullptr || e->last->done ? kCudaSuccess : kCudaErrorNotReady;
}

CudaError FakeNcclProcess::EventDestroy(EventHandle event) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaEventDestroy");
  FakeNcclShared::Event* e = w_->FindEvent(event);
  if (e == nullptr) return kCudaErrorInvalidResourceHandle;
  e->destroyed = true;
  e->last = nullptr;
  --w_->procs[id_].live.events;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::Malloc(void** ptr, size_t bytes) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaMalloc");
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  *ptr = std::aligned_alloc(256, rounded);
  w_->procs[id_].allocations.insert(*ptr);
  ++w_->procs[id_].live.allocations;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::Free(void* ptr) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaFree");
  if (ptr == nullptr) return kCudaSuccess;
  if (w_->procs[id_].allocations.erase(ptr) == 0) return kCudaErrorInvalidValue;
  std::free(ptr);
  --w_->procs[id_].live.allocations;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::MallocHost(void** ptr, size_t bytes) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaMallocHost");
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  *ptr = std::aligned_alloc(256, rounded);
  w_->procs[id_].allocations.insert(*ptr);
  ++w_->procs[id_].live.allocations;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::FreeHost(void* ptr) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, "cudaFreeHost");
  if (ptr == nullptr) return kCudaSuccess;
  if (w_->procs[id_].allocations.erase(ptr) == 0) return kCudaErrorInvalidValue;
  std::free(ptr);
  --w_->procs[id_].live.allocations;
  return kCudaSuccess;
}

CudaError FakeNcclProcess::EnqueueLocal(const char* name, StreamHandle stream,
                                        std::function<void()> run) {
  std::lock_guard<std::mutex> l(w_->mu);
  w_->Log(id_, name);
  FakeNcclShared::Stream* s = w_->FindStream(stream);
  if (s == nullptr) return kCudaErrorInvalidResourceHandle;
  if (w_->procs[id_].dead) return kCudaSuccess;  // swallowed: it never runs
  auto op = std::make_shared<FakeNcclShared::Op>(
      FakeNcclShared::Op{FakeNcclShared::Kind::kLocal, nullptr, nullptr, 0, DType::kF32,
                         ReduceOp::kSum, 0, nullptr, s, id_});
  op->run = std::move(run);
  s->queue.push_back(std::move(op));
  w_->Progress();
  return kCudaSuccess;
}

CudaError FakeNcclProcess::MemcpyAsync(void* dst, const void* src, size_t bytes,
                                       StreamHandle stream) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return kCudaErrorInvalidValue;
  return EnqueueLocal("cudaMemcpyAsync", stream, [=] {
    if (bytes > 0) std::memmove(dst, src, bytes);
  });
}

CudaError FakeNcclProcess::AddF32(float* dst, const float* a, const float* b, size_t n,
                                  StreamHandle stream) {
  if (n > 0 && (dst == nullptr || a == nullptr || b == nullptr)) return kCudaErrorInvalidValue;
  return EnqueueLocal("AddF32", stream, [=] {
    for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
  });
}

const char* FakeNcclProcess::CudaErrorName(CudaError e) {
  switch (e) {
    case kCudaSuccess:
      return "cudaSuccess";
    case kCudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case 35:
      return "cudaErrorInsufficientDriver";
    case 100:
      return "cudaErrorNoDevice";
    case kCudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case kCudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case kCudaErrorNotReady:
      return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}

const char* FakeNcclProcess::CudaErrorString(CudaError e) {
  switch (e) {
    case kCudaSuccess:
      return "no error";
    case 35:
      return "CUDA driver version is insufficient for CUDA runtime version (fake)";
    case 100:
      return "no CUDA-capable device is detected (fake)";
    case kCudaErrorInvalidDevice:
      return "invalid device ordinal (fake)";
  }
  return "CUDA error (fake)";
}

}  // namespace troupe::collectives::testing
