// The NCCL communicator's set-up and bootstrap (nccl_comm.h; its operations are in nccl_comm.cc
// and nccl_ordered_reduce_scatter.cc): NCCL and CUDA codes made Status, the options checked, the
// device and stream prepared, the unique id through the Bootstrap, the non-blocking init settled,
// the tear-down, and the public entry points. See nccl_communicator.h for the failure model.
#include "troupe/collectives/nccl_communicator.h"

#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nccl_backend.h"
#include "nccl_comm.h"
#include "net.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"

namespace troupe::collectives {

std::string NcclResultName(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return absl::StrCat("ncclResult(", static_cast<int>(r), ")");
}

namespace {

absl::StatusCode NcclCode(NcclResult r) {
  switch (r) {
    case NcclResult::kRemoteError:
    case NcclResult::kSystemError:
      return absl::StatusCode::kUnavailable;  // a peer or the network: rebuild without it
    case NcclResult::kInvalidArgument:
    case NcclResult::kInvalidUsage:
      return absl::StatusCode::kInvalidArgument;  // our bug: retrying cannot help
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

// kInProgress is not an error: the caller polls it.
absl::Status NcclStatus(NcclBackend& b, NcclCommHandle comm, const char* call, NcclResult r,
                        const char* file, int line) {
  if (r == NcclResult::kSuccess || r == NcclResult::kInProgress) return absl::OkStatus();
  std::string detail = comm != nullptr ? b.LastError(comm) : std::string();
  return absl::Status(
      NcclCode(r), absl::StrCat(file, ":", line, ": ", call, " failed: ", NcclResultName(r), " (",
                                static_cast<int>(r), "): ", b.ErrorString(r),
                                detail.empty() ? "" : "; ", detail));
}

std::string CudaErrorText(NcclBackend& b, CudaError e) {
  return absl::StrCat(b.CudaErrorName(e), " (", e, "): ", b.CudaErrorString(e));
}

absl::Status CudaStatus(NcclBackend& b, const char* call, CudaError e, const char* file, int line) {
  if (e == kCudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(file, ":", line, ": ", call, " failed: ", CudaErrorText(b, e)));
}

namespace {

absl::StatusOr<int> DeviceCount(NcclBackend& b) {
  int n = 0;
  if (CudaError e = b.GetDeviceCount(&n); e != kCudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount failed: ", CudaErrorText(b, e)));
  }
  if (n == 0) return absl::FailedPreconditionError("no CUDA device (cudaGetDeviceCount: 0)");
  return n;
}

absl::Status ValidateOptions(const Bootstrap* boot, const NcclOptions& o) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("NcclOptions: ", parts...));
  };
  if (boot == nullptr) return bad("bootstrap expected non-null, got null");
  if (o.size < 1) return bad("size expected >= 1, got ", o.size);
  if (o.rank < 0 || o.rank >= o.size) {
    return bad("rank expected in [0, ", o.size, "), got ", o.rank);
  }
  if (o.device < 0) return bad("device expected >= 0, got ", o.device);
  if (o.key_prefix.empty()) return bad("key_prefix expected non-empty, got \"\"");
  if (o.connect_timeout <= absl::ZeroDuration()) {
    return bad("connect_timeout expected > 0, got ", absl::FormatDuration(o.connect_timeout));
  }
  return absl::OkStatus();
}

}  // namespace

NcclComm::NcclComm(const NcclOptions& o, std::shared_ptr<NcclBackend> backend)
    : o_(o),
      b_(std::move(backend)),
      key_(absl::StrCat(o.key_prefix, "/g", o.generation, "/nccl-id")) {}

NcclComm::~NcclComm() {
  std::lock_guard<std::mutex> l(mu_);
  FailLocked(absl::CancelledError("collectives: communicator destroyed")).IgnoreError();
  for (EventHandle e : events_) b_->EventDestroy(e);
  if (intervals_event_ != nullptr) b_->EventDestroy(intervals_event_);
  if (stream_ != nullptr) b_->StreamDestroy(stream_);
  if (scratch_ != nullptr) b_->Free(scratch_);
  if (device_intervals_ != nullptr) b_->Free(device_intervals_);
  if (host_intervals_ != nullptr) b_->FreeHost(host_intervals_);
  for (float* p : retired_blocks_) b_->Free(p);
  if (blocks_ != nullptr) b_->Free(blocks_);
}

absl::Status NcclComm::Init(Bootstrap* boot) {
  const absl::Time deadline = base::MonotonicNow() + o_.connect_timeout;
  NcclBackend& b = *b_;
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_STATUS(b, "cudaSetDevice", b.SetDevice(o_.device)));
  TROUPE_RETURN_IF_ERROR(
      TROUPE_CUDA_STATUS(b, "cudaStreamCreateWithFlags", b.StreamCreateNonBlocking(&stream_)));
  TROUPE_RETURN_IF_ERROR(TROUPE_CUDA_STATUS(b, "cudaMalloc", b.Malloc(&scratch_, sizeof(float))));
  TROUPE_ASSIGN_OR_RETURN(NcclUniqueId id, ExchangeId(boot, deadline));
  const std::string host_key = net::HostKey();
  if (auto st = boot->Publish(HostKeyName(o_.rank), host_key); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("host key '", HostKeyName(o_.rank),
                                                "': publish failed: ", st.message()));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    NcclResult r = b.CommInitRankNonBlocking(&comm_, o_.size, id, o_.rank);
    if (auto st = TROUPE_NCCL_STATUS(b, comm_, "ncclCommInitRankConfig", r); !st.ok()) {
      return FailLocked(st);
    }
  }
  TROUPE_RETURN_IF_ERROR(
      Settle(deadline, "ncclCommInitRankConfig", "the connect timeout", o_.connect_timeout));
  // Every rank published its host key before it joined the communicator that just formed.
  TROUPE_ASSIGN_OR_RETURN(one_host_, AllOnOneHost(boot, host_key, deadline));
  return absl::OkStatus();
}

absl::StatusOr<NcclUniqueId> NcclComm::ExchangeId(Bootstrap* boot, absl::Time deadline) {
  NcclUniqueId id;
  if (o_.rank == 0) {
    NcclResult r = b_->GetUniqueId(&id);
    TROUPE_RETURN_IF_ERROR(TROUPE_NCCL_STATUS(*b_, nullptr, "ncclGetUniqueId", r));
    if (auto st = boot->Publish(key_, std::string(id.internal, sizeof(id.internal))); !st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("NCCL unique id '", key_, "': publish failed: ", st.message()));
    }
    return id;
  }
  absl::StatusOr<std::string> v = boot->Lookup(key_, deadline);
  if (!v.ok()) {
    return absl::Status(
        v.status().code(),
        absl::StrCat("NCCL unique id '", key_, "' (rank 0 publishes it): ", v.status().message()));
  }
  if (v->size() != sizeof(id.internal)) {
    return absl::DataLossError(absl::StrCat("NCCL unique id '", key_, "': expected ",
                                            sizeof(id.internal), " bytes, got ", v->size()));
  }
  std::memcpy(id.internal, v->data(), v->size());
  return id;
}

std::string NcclComm::HostKeyName(int rank) const { return absl::StrCat(key_, "/host/", rank); }

absl::StatusOr<bool> NcclComm::AllOnOneHost(Bootstrap* boot, const std::string& mine,
                                            absl::Time deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < o_.size; ++r) keys.push_back(HostKeyName(r));
  absl::StatusOr<std::vector<std::string>> v = boot->LookupAll(keys, deadline);
  if (!v.ok()) {
    absl::Status st(v.status().code(),
                    absl::StrCat("host keys '", HostKeyName(0), "'…: ", v.status().message()));
    // Whom the bootstrap blamed (the rank that never published), if anyone, goes along.
    v.status().ForEachPayload(
        [&st](absl::string_view url, const absl::Cord& payload) { st.SetPayload(url, payload); });
    return st;
  }
  bool same = true;
  for (const std::string& h : *v) same = same && h == mine;
  return same;
}

namespace {

// The caller's handle: Work holds the communicator (its helper) by shared_ptr, so the owner is a
// thin forwarder whose destruction aborts what is still in flight.
class NcclOwner final : public Communicator {
 public:
  explicit NcclOwner(std::shared_ptr<NcclComm> c) : c_(std::move(c)) {}
  ~NcclOwner() override { c_->Abort(absl::CancelledError("collectives: communicator destroyed")); }

  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  uint64_t generation() const override { return c_->generation(); }
  Work AllReduce(Buffer i, Buffer o, ReduceOp op, const CollectiveOptions& x) override {
    return c_->AllReduce(i, o, op, x);
  }
  Work ReduceScatter(Buffer i, Buffer o, ReduceOp op, const CollectiveOptions& x) override {
    return c_->ReduceScatter(i, o, op, x);
  }
  Work AllGather(Buffer i, Buffer o, const CollectiveOptions& x) override {
    return c_->AllGather(i, o, x);
  }
  Work Broadcast(Buffer b, int root, const CollectiveOptions& x) override {
    return c_->Broadcast(b, root, x);
  }
  Work Send(Buffer b, int p, uint32_t t, const CollectiveOptions& x) override {
    return c_->Send(b, p, t, x);
  }
  Work Recv(Buffer b, int p, uint32_t t, const CollectiveOptions& x) override {
    return c_->Recv(b, p, t, x);
  }
  std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                     const CollectiveOptions& x) override {
    return c_->PostPointToPoint(ops, x);
  }
  Work Barrier(const CollectiveOptions& x) override { return c_->Barrier(x); }
  void Abort(absl::Status s) override { c_->Abort(std::move(s)); }
  CommStats stats() const override { return c_->stats(); }
  std::string DebugString() const override { return c_->DebugString(); }
  bool PeersShareHost() const override { return c_->PeersShareHost(); }
  bool MatchesByTag() const override { return c_->MatchesByTag(); }

 private:
  std::shared_ptr<NcclComm> c_;
};

}  // namespace

bool NcclAvailable(NcclBackend& backend, std::string* why) {
  absl::StatusOr<int> n = DeviceCount(backend);
  if (!n.ok()) {
    *why = std::string(n.status().message());
    return false;
  }
  int version = 0;
  if (NcclResult r = backend.GetVersion(&version); r != NcclResult::kSuccess) {
    *why = absl::StrCat("ncclGetVersion failed: ", NcclResultName(r), " (", static_cast<int>(r),
                        "): ", backend.ErrorString(r));
    return false;
  }
  *why = absl::StrCat(*n, " CUDA device(s), NCCL ", version);
  return true;
}

bool NcclAvailable(std::string* why) {
  absl::StatusOr<std::shared_ptr<NcclBackend>> b = RealNcclBackend();
  if (!b.ok()) {
    *why = std::string(b.status().message());
    return false;
  }
  return NcclAvailable(**b, why);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Bootstrap* boot, const NcclOptions& o, std::shared_ptr<NcclBackend> backend) {
  TROUPE_RETURN_IF_ERROR(ValidateOptions(boot, o));
  if (backend == nullptr) {
    return absl::InvalidArgumentError("CreateNcclCommunicator: backend expected non-null");
  }
  TROUPE_ASSIGN_OR_RETURN(int devices, DeviceCount(*backend));
  if (o.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclOptions: device expected in [0, ", devices, "), got ", o.device));
  }
  auto comm = std::make_shared<NcclComm>(o, std::move(backend));
  TROUPE_RETURN_IF_ERROR(comm->Init(boot));
  return std::unique_ptr<Communicator>(new NcclOwner(std::move(comm)));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Bootstrap* boot,
                                                                     const NcclOptions& o) {
  TROUPE_RETURN_IF_ERROR(ValidateOptions(boot, o));
  absl::StatusOr<std::shared_ptr<NcclBackend>> backend = RealNcclBackend();
  if (!backend.ok()) return backend.status();
  std::string why;
  if (!NcclAvailable(**backend, &why)) return absl::FailedPreconditionError(why);
  return CreateNcclCommunicator(boot, o, *std::move(backend));
}

}  // namespace troupe::collectives
