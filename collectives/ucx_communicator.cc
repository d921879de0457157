// The UCX backend: a Transport over one UCP worker, wrapped in the Engine, plus the liveness
// channel that turns a peer's death into Unavailable on every pending operation.
#include "troupe/collectives/ucx_communicator.h"

#include <sched.h>
#include <sys/uio.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <mutex>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine.h"
#include "liveness.h"
#include "mailbox.h"
#include "net.h"

namespace troupe::collectives {
namespace {

#define UCX_RETURN_IF_ERROR(expr)                                                                  \
  do {                                                                                             \
    ucs_status_t _s = (expr);                                                                      \
    if (_s != UCS_OK) {                                                                            \
      return absl::InternalError(                                                                  \
          absl::StrCat(__FILE__, ":", __LINE__, ": ", #expr, " failed: ", ucs_status_string(_s))); \
    }                                                                                              \
  } while (0)

struct Req {
  bool live = false;  // handed out and not yet reaped
  bool done = false;
  bool recv = false;
  ucs_status_t status = UCS_OK;
  void* ucx = nullptr;  // UCX request, freed when reaped
  void* buf = nullptr;  // mailbox request: the user's buffer
  int peer = 0;
  size_t bytes = 0;
  uint64_t tag = 0;  // the 48-bit message tag
};

void OnSend(void* /*request*/, ucs_status_t status, void* user) {
  auto* r = static_cast<Req*>(user);
  r->status = status;
  r->done = true;
}

void OnRecv(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* /*info*/,
            void* user) {
  auto* r = static_cast<Req*>(user);
  r->status = status;
  r->done = true;
}

// UCX tag: source rank in the top 16 bits, the 48-bit message tag below.
uint64_t WireTag(int src, uint64_t tag) { return (uint64_t(src) << kTagBits) | (tag & kTagMask); }

class UcxTransport : public Transport {
 public:
  UcxTransport(int rank, int size) : rank_(rank), size_(size) {
    reqs_.push_back(std::make_unique<Req>());  // kCompleted
    reqs_[kCompleted]->done = true;
  }
  ~UcxTransport() override {
    if (dirty_ || live_ucx_ > 0) {
      // A failed worker is leaked on purpose: destroying it purges requests still pending to
      // a dead peer, which trips assertions inside UCX 1.13 without UCP_ERR_HANDLING_MODE_PEER,
      // and never progressing it again guarantees no late transfer lands in a user buffer.
      // Failures are rare (one per membership change); the cost is the worker's memory.
      for (auto& r : abandoned_) r.release();
      for (auto& r : reqs_) {
        if (r->live && r->ucx != nullptr) r.release();
      }
      return;
    }
    for (int j = 0; j < size_ && j < static_cast<int>(eps_.size()); ++j) {
      if (eps_[j] == nullptr) continue;
      ucp_request_param_t p{};
      void* r = ucp_ep_close_nbx(eps_[j], &p);  // flushes: nothing is outstanding when healthy
      if (UCS_PTR_IS_PTR(r)) {
        ucp_worker_h w = lanes_[lane_of_[j]].worker;
        for (int i = 0; i < 100000 && ucp_request_check_status(r) == UCS_INPROGRESS; ++i) {
          ucp_worker_progress(w);
        }
        ucp_request_free(r);
      }
    }
    for (auto& s : scratch_) {
      if (s.memh != nullptr) ucp_mem_unmap(lanes_[kLocal].context, s.memh);
    }
    for (Lane& lane : lanes_) {
      if (lane.worker != nullptr) ucp_worker_destroy(lane.worker);
      if (lane.context != nullptr) ucp_cleanup(lane.context);
    }
  }

  // The lanes: shared memory for the ranks of this host, UCX's network transports for the others
  // (two UCP contexts, since with tcp in one context UCX 1.13 moves large messages between ranks
  // of one host over tcp/lo).
  enum LaneKind { kLocal = 0, kRemote = 1 };

  // Opens a lane: a UCP context over `tls` (restricted to `devices` when not empty) and its
  // worker.
  absl::Status Open(LaneKind kind, const std::string& tls, const std::string& devices) {
    const char* field = kind == kLocal ? "UcxOptions.transports" : "UcxOptions.remote_transports";
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG;
    params.mt_workers_shared = 0;
    ucp_config_t* config = nullptr;
    UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &config));
    const std::string rndv = kind == kRemote && std::getenv("UCX_RNDV_THRESH") == nullptr
                                 ? kDefaultRemoteRndvThresh
                                 : "";
    for (const auto& [name, value] : {std::pair<const char*, std::string>{"TLS", tls},
                                      std::pair<const char*, std::string>{"NET_DEVICES", devices},
                                      std::pair<const char*, std::string>{"RNDV_THRESH", rndv}}) {
      if (value.empty()) continue;
      ucs_status_t m = ucp_config_modify(config, name, value.c_str());
      if (m != UCS_OK) {
        ucp_config_release(config);
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": UCX rejected ", name, "='", value, "': ", ucs_status_string(m)));
      }
    }
    Lane& lane = lanes_[kind];
    ucs_status_t s = ucp_init(&params, config, &lane.context);
    ucp_config_release(config);
    UCX_RETURN_IF_ERROR(s);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the engine's exec lock serializes use
    UCX_RETURN_IF_ERROR(ucp_worker_create(lane.context, &wp, &lane.worker));
    return absl::OkStatus();
  }

  absl::Status Init(const UcxOptions& o) {
    peer_errors_ = o.ucx_peer_error_handling;
    std::string tls = o.transports;
    if (tls.empty() && std::getenv("UCX_TLS") == nullptr) tls = kDefaultUcxTransports;
    if (auto st = Open(kLocal, tls, ""); !st.ok()) return st;
    cpu_set_t cpus;  // the vCPUs this process may run on (taskset, cgroups), not all online
    const int usable = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    usable_cpus_ = usable;
    spins_before_yield_ = size_ > usable ? 0 : 1 << 16;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Address(LaneKind kind) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    UCX_RETURN_IF_ERROR(ucp_worker_get_address(lanes_[kind].worker, &addr, &len));
    std::string blob(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(lanes_[kind].worker, addr);
    return blob;
  }

  // addrs[j]: peer j's worker address on lane lanes[j].
  absl::Status Connect(const std::vector<std::string>& addrs, const std::vector<LaneKind>& lanes) {
    eps_.assign(size_, nullptr);
    lane_of_ = lanes;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      lanes_[lanes[j]].used = true;
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.address = reinterpret_cast<const ucp_address_t*>(addrs[j].data());
      ep.err_mode = peer_errors_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      ucs_status_t s = ucp_ep_create(lanes_[lanes[j]].worker, &ep, &eps_[j]);
      if (s != UCS_OK) {
        return BlamePeer(
            absl::UnavailableError(absl::StrCat("collectives: rank ", rank_, " cannot reach rank ",
                                                j, lanes[j] == kLocal ? " on this host" : "",
                                                " through UCX: ", ucs_status_string(s))),
            j);
      }
    }
    return absl::OkStatus();
  }

  std::string Describe() {
    std::string out = absl::StrCat(
        "single copy (cross-memory attach, kSingleCopy above CollectiveOptions::small_bytes): ",
        single_copy_ ? "on" : "off", "\n",
        "staged all-reduce (kSingleCopy through the shared segments, preferred): ",
        HostShared() != nullptr ? "on" : "off", "\n",
        "shared-memory mailboxes (collective messages up to ", Mailboxes::kPayloadBytes,
        " bytes between ranks of this host): ", boxes_ != nullptr ? "on" : "off", "\n");
    for (int j = 0; j < size_; ++j) {
      if (j == rank_ || eps_[j] == nullptr) continue;
      char* buf = nullptr;
      size_t len = 0;
      FILE* f = open_memstream(&buf, &len);
      ucp_ep_print_info(eps_[j], f);
      fclose(f);
      absl::StrAppend(&out, "rank ", rank_, " -> ", j,
                      lane_of_[j] == kLocal ? " (this host)" : " (another host)", ":\n",
                      std::string(buf, len));
      free(buf);
    }
    return out;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<ReqId> PostSend(int peer, uint64_t tag, const void* buf, size_t bytes) override {
    if (auto st = failure(); !st.ok()) return st;
    if (ViaBox(peer, tag, bytes)) {
      CountSend(bytes);
      // In order per peer: behind any send to it still waiting for a slot.
      if (box_queued_[peer] == 0 && boxes_->TrySend(peer, tag, buf, bytes)) return kCompleted;
      auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/false);
      req->buf = const_cast<void*>(buf);
      ++box_queued_[peer];
      box_sends_.push_back(id);
      return id;
    }
    auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/false);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = OnSend;
    p.user_data = req;
    CountSend(bytes);
    void* r = ucp_tag_send_nbx(eps_[peer], buf, bytes, WireTag(rank_, tag), &p);
    return Track(id, r, "send", peer);
  }

  absl::StatusOr<ReqId> PostRecv(int peer, uint64_t tag, void* buf, size_t bytes) override {
    if (auto st = failure(); !st.ok()) return st;
    if (ViaBox(peer, tag, bytes)) {
      absl::StatusOr<bool> got = boxes_->TryRecv(peer, tag, buf, bytes);
      if (!got.ok()) return FailWith(got.status());
      if (*got) {
        CountRecv(bytes);
        return kCompleted;
      }
      auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/true);
      req->buf = buf;
      box_recvs_.push_back(id);
      return id;
    }
    auto [id, req] = NewReq(peer, tag, bytes, /*recv=*/true);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv = OnRecv;
    p.user_data = req;
    void* r = ucp_tag_recv_nbx(lanes_[lane_of_[peer]].worker, buf, bytes, WireTag(peer, tag),
                               ~uint64_t{0}, &p);
    return Track(id, r, "recv", peer);
  }

  absl::Status WaitAll(absl::Span<const ReqId> ids, absl::Time deadline) override {
    int idle = 0;
    for (uint64_t iter = 0;; ++iter) {
      bool all = true;
      for (ReqId id : ids) {
        const Req* r = reqs_[id].get();
        if (!r->done) {
          all = false;
          break;
        }
        if (r->status != UCS_OK) return FailWith(PeerError(r));
      }
      if (all) break;
      if (auto st = failure(); !st.ok()) return st;
      if ((iter & 255) == 255 && absl::Now() > deadline) {
        return FailWith(absl::DeadlineExceededError(absl::StrCat(
            "collectives: rank ", rank_, " operation deadline passed; ", DescribePending(ids), "; ",
            iter, " polls, ", spins_before_yield_ == 0 ? "yielding at every idle poll" : "spinning",
            " (", size_, " ranks, ", usable_cpus_, " usable vCPUs)")));
      }
      idle = Progress() != 0 ? 0 : idle + 1;
      IdleWait(idle);
    }
    for (ReqId id : ids) Reap(id);
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Test(ReqId id) override {
    if (auto st = failure(); !st.ok()) return st;
    Progress();
    const Req* r = reqs_[id].get();
    if (!r->done) return false;
    if (r->status != UCS_OK) return FailWith(PeerError(r));
    Reap(id);
    return true;
  }

  void CancelAll() override {
    dirty_ = true;
    // Mailbox requests are dropped: only this thread ever copies into or out of their buffers.
    box_sends_.clear();
    box_recvs_.clear();
    std::fill(box_queued_.begin(), box_queued_.end(), 0);
    // UCX receives are cancelled; sends to a dead or departed peer cannot be, so they are
    // abandoned (kept alive until the worker goes away; nothing will read them after this).
    for (auto& r : reqs_) {
      if (r->live && !r->done && r->recv && r->ucx != nullptr) {
        ucp_request_cancel(lanes_[lane_of_[r->peer]].worker, r->ucx);
      }
    }
    // A receive already matched to a multi-fragment message cannot be cancelled; after a short
    // grace it is abandoned (the contract in communicator.h keeps its buffer valid until the
    // communicator is destroyed).
    const absl::Time until = absl::Now() + absl::Milliseconds(20);
    for (;;) {
      bool pending = false;
      for (auto& r : reqs_) pending |= r->live && r->ucx != nullptr && r->recv && !r->done;
      if (!pending || absl::Now() > until) break;
      ProgressUcx();
    }
    for (ReqId id = 1; id < reqs_.size(); ++id) {
      std::unique_ptr<Req>& r = reqs_[id];
      if (!r->live) continue;
      if (r->done || r->ucx == nullptr) {
        if (r->ucx != nullptr) ucp_request_free(r->ucx);
        r->live = false;
      } else {
        abandoned_.push_back(std::move(r));
        r = std::make_unique<Req>();
      }
      free_ids_.push_back(id);
    }
    live_ucx_ = 0;
  }

  void Fail(absl::Status status) override {
    std::lock_guard<std::mutex> l(fail_mu_);
    if (failed_.ok()) failed_ = std::move(status);
    has_failed_.store(true, std::memory_order_release);
  }

  // The ranks of this host, found out together in one bootstrap round over them:
  // - Single copy through Linux cross-memory attach (process_vm_readv), when every rank is on
  //   this host and may read the others' memory (same user; ptrace policy, e.g. Yama or a
  //   container's seccomp profile, may forbid it). Each rank publishes its boot id, pid and the
  //   address of a random cookie; a rank that reads every peer's cookie back says so, and single
  //   copy is on only if every rank did (the cookie read fails across pid namespaces).
  // - Shared-memory mailboxes (mailbox.h): each rank publishes its inbox's id and attaches its
  //   peers'; they are used only if every rank of this host attached every other's, so the ranks
  //   of a host agree on how each message travels.
  absl::Status ProbeLocalPeers(Bootstrap* boot, const std::string& prefix, bool want_single_copy,
                               bool want_mailboxes, absl::Time deadline) {
    std::vector<int> local;
    for (int j = 0; j < size_; ++j) {
      if (lane_of_[j] == kLocal) local.push_back(j);
    }
    if (local.size() < 2) return absl::OkStatus();
    std::random_device rd;
    for (auto& w : cookie_) w = (uint64_t{rd()} << 32) | rd();
    if (want_mailboxes) {
      auto boxes = Mailboxes::Create(rank_, local);
      if (boxes.ok()) boxes_ = std::move(*boxes);  // else off: this rank reports no mailboxes
    }
    const std::string me =
        absl::StrCat(BootId(), " ", getpid(), " ", reinterpret_cast<uintptr_t>(cookie_), " ",
                     cookie_[0], " ", cookie_[1], " ", boxes_ != nullptr ? boxes_->inbox_id() : -1);
    if (auto st = boot->Publish(absl::StrCat(prefix, "/local/", rank_), me); !st.ok()) return st;
    pids_.assign(size_, 0);
    bool readable = want_single_copy, attached = boxes_ != nullptr;
    for (int j : local) {
      if (j == rank_) continue;
      auto peer = boot->Lookup(absl::StrCat(prefix, "/local/", j), deadline);
      if (!peer.ok()) return peer.status();
      std::istringstream in(*peer);
      std::string boot_id;
      uint64_t addr = 0, want[2] = {0, 0}, got[2] = {1, 1};
      int inbox = -1;
      in >> boot_id >> pids_[j] >> addr >> want[0] >> want[1] >> inbox;
      readable = readable && in && boot_id == BootId() &&
                 ReadFrom(pids_[j], addr, got, sizeof(got)) && got[0] == want[0] &&
                 got[1] == want[1];
      attached = attached && in && inbox >= 0 && boxes_->Attach(j, inbox).ok();
    }
    if (auto st = boot->Publish(absl::StrCat(prefix, "/local-ok/", rank_),
                                absl::StrCat(readable ? 1 : 0, " ", attached ? 1 : 0));
        !st.ok()) {
      return st;
    }
    bool all_read = true, all_attached = true;
    for (int j : local) {
      auto ok = boot->Lookup(absl::StrCat(prefix, "/local-ok/", j), deadline);
      if (!ok.ok()) return ok.status();
      all_read = all_read && (*ok)[0] == '1';
      all_attached = all_attached && ok->size() == 3 && (*ok)[2] == '1';
    }
    all_local_ = static_cast<int>(local.size()) == size_;
    single_copy_ = all_read && all_local_;
    if (!all_attached) boxes_.reset();
    box_queued_.assign(size_, 0);
    return absl::OkStatus();
  }

  bool CanReadPeers() const override { return single_copy_; }

  Mailboxes* HostShared() override { return all_local_ ? boxes_.get() : nullptr; }

  absl::Status WaitUntil(absl::FunctionRef<bool()> ready, absl::Time deadline) override {
    int idle = 0;
    for (uint64_t iter = 0; !ready(); ++iter) {
      if (auto st = failure(); !st.ok()) return st;
      if ((iter & 255) == 255 && absl::Now() > deadline) {
        return FailWith(absl::DeadlineExceededError(
            absl::StrCat("collectives: rank ", rank_,
                         " operation deadline passed waiting for the peers' shared segments")));
      }
      IdleWait(++idle);
    }
    return absl::OkStatus();
  }

  absl::Status ReadPeer(int peer, uint64_t remote, void* local, size_t bytes) override {
    if (auto st = failure(); !st.ok()) return st;
    if (!ReadFrom(pids_[peer], remote, local, bytes)) {
      return FailWith(BlamePeer(absl::UnavailableError(absl::StrCat(
                                    "collectives: reading peer rank ", peer, "'s memory (pid ",
                                    pids_[peer], ") failed: ", std::strerror(errno))),
                                peer));
    }
    CountRecv(bytes);
    return absl::OkStatus();
  }

  void* Scratch(int slot, size_t bytes) override {
    if (scratch_.size() <= static_cast<size_t>(slot)) scratch_.resize(slot + 1);
    Region& s = scratch_[slot];
    if (s.size >= bytes) return s.ptr;
    if (s.memh != nullptr) ucp_mem_unmap(lanes_[kLocal].context, s.memh);
    s = Region{};
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length = std::max<size_t>(bytes, size_t{1} << 20);
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    if (ucp_mem_map(lanes_[kLocal].context, &mp, &s.memh) != UCS_OK) {
      s.heap.resize(bytes);  // registration failed: plain memory still works
      s.ptr = s.heap.data();
      s.size = bytes;
      return s.ptr;
    }
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    ucp_mem_query(s.memh, &attr);
    s.ptr = attr.address;
    s.size = attr.length;
    return s.ptr;
  }

 private:
  struct Region {
    ucp_mem_h memh = nullptr;
    void* ptr = nullptr;
    size_t size = 0;
    std::vector<uint8_t> heap;
  };

  static const std::string& BootId() {
    static const std::string id = [] {
      std::ifstream in("/proc/sys/kernel/random/boot_id");
      std::string s;
      in >> s;
      return s;
    }();
    return id;
  }

  // process_vm_readv until all `bytes` arrived; false (errno set) if the peer is gone or
  // unreadable. Pieces of at most 64 MiB keep each system call short.
  static bool ReadFrom(pid_t pid, uint64_t remote, void* local, size_t bytes) {
    auto* dst = static_cast<char*>(local);
    while (bytes > 0) {
      const size_t want = std::min<size_t>(bytes, size_t{64} << 20);
      iovec l{dst, want}, r{reinterpret_cast<void*>(remote), want};
      const ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
      if (n <= 0) {
        if (n == 0) errno = EFAULT;
        return false;
      }
      dst += n;
      remote += static_cast<uint64_t>(n);
      bytes -= static_cast<size_t>(n);
    }
    return true;
  }

  absl::Status failure() {
    if (!has_failed_.load(std::memory_order_acquire)) return absl::OkStatus();
    std::lock_guard<std::mutex> l(fail_mu_);
    return failed_;
  }
  absl::Status FailWith(absl::Status st) {
    Fail(st);
    return failure();
  }
  // Which of `ids` are still pending, with peer, size and the tag's operation / phase / step /
  // piece (see OpTag and OpContext::Tag): where a stalled collective waits.
  std::string DescribePending(absl::Span<const ReqId> ids) {
    std::string out;
    int pending = 0;
    for (ReqId id : ids) {
      const Req* r = reqs_[id].get();
      if (r->done) continue;
      if (++pending > 4) continue;
      const uint64_t sub = r->tag & 0xffffff;
      absl::StrAppend(&out, pending > 1 ? ", " : "", r->recv ? "receive from" : "send to", " rank ",
                      r->peer, " (", r->bytes, " bytes, ");
      if (r->tag >> 47) {
        absl::StrAppend(&out, "user tag ", r->tag & 0x7fffffff, ")");
      } else {
        absl::StrAppend(&out, "op ", (r->tag >> 24) & 0x7fffff, " phase ", sub >> 20, " step ",
                        (sub >> 12) & 0xff, " piece ", sub & 0xfff, ")");
      }
    }
    return absl::StrCat(pending, " of ", ids.size(), " requests pending: ", out,
                        pending > 4 ? ", ..." : "");
  }

  absl::Status PeerError(const Req* r) {
    return BlamePeer(absl::UnavailableError(absl::StrCat(
                         "collectives: ", r->recv ? "receive from" : "send to", " peer rank ",
                         r->peer, " failed: ", ucs_status_string(r->status))),
                     r->peer);
  }

  // A fresh request and its id (an index into reqs_, reused once reaped: no allocation per
  // message once the table has grown to the most requests in flight).
  std::pair<ReqId, Req*> NewReq(int peer, uint64_t tag, size_t bytes, bool recv) {
    ReqId id;
    if (free_ids_.empty()) {
      id = reqs_.size();
      reqs_.push_back(std::make_unique<Req>());
    } else {
      id = free_ids_.back();
      free_ids_.pop_back();
      *reqs_[id] = Req{};
    }
    Req* r = reqs_[id].get();
    r->live = true;
    r->peer = peer;
    r->tag = tag;
    r->bytes = bytes;
    r->recv = recv;
    return {id, r};
  }

  absl::StatusOr<ReqId> Track(ReqId id, void* r, const char* what, int peer) {
    Req* req = reqs_[id].get();
    if (UCS_PTR_IS_ERR(r)) {
      req->live = false;
      free_ids_.push_back(id);
      return FailWith(BlamePeer(
          absl::UnavailableError(absl::StrCat("collectives: ", what, " with peer rank ", peer,
                                              " failed: ", ucs_status_string(UCS_PTR_STATUS(r)))),
          peer));
    }
    if (r == nullptr) {
      req->done = true;
    } else {
      req->ucx = r;
      ++live_ucx_;
    }
    return id;
  }

  void Reap(ReqId id) {
    Req* r = reqs_[id].get();
    if (!r->live) return;
    if (r->recv) CountRecv(r->bytes);  // counted once it has arrived
    if (r->ucx != nullptr) {
      ucp_request_free(r->ucx);
      --live_ucx_;
    }
    r->live = false;
    free_ids_.push_back(id);
  }

  // Collective messages between ranks of this host small enough for a mailbox slot. User
  // point-to-point messages stay on UCX: a receive there may be larger than its message, and
  // both sides must route a message the same way.
  bool ViaBox(int peer, uint64_t tag, size_t bytes) const {
    return boxes_ != nullptr && lane_of_[peer] == kLocal && (tag >> 47) == 0 && bytes > 0 &&
           bytes <= Mailboxes::kPayloadBytes;
  }

  // Moves what can move through the mailboxes: queued sends whose slot freed up (in order per
  // peer), receives whose message arrived. The number of requests completed.
  unsigned ProgressBoxes() {
    unsigned n = 0;
    if (!box_sends_.empty()) {
      size_t keep = 0;
      blocked_.clear();
      for (ReqId id : box_sends_) {
        Req* r = reqs_[id].get();
        const bool behind = std::find(blocked_.begin(), blocked_.end(), r->peer) != blocked_.end();
        if (!behind && boxes_->TrySend(r->peer, r->tag, r->buf, r->bytes)) {
          r->done = true;
          --box_queued_[r->peer];
          ++n;
        } else {
          if (!behind) blocked_.push_back(r->peer);
          box_sends_[keep++] = id;
        }
      }
      box_sends_.resize(keep);
    }
    size_t keep = 0;
    for (ReqId id : box_recvs_) {
      Req* r = reqs_[id].get();
      absl::StatusOr<bool> got = boxes_->TryRecv(r->peer, r->tag, r->buf, r->bytes);
      if (!got.ok()) {
        (void)FailWith(got.status());
        return n;
      }
      if (*got) {
        r->done = true;
        ++n;
      } else {
        box_recvs_[keep++] = id;
      }
    }
    box_recvs_.resize(keep);
    return n;
  }

  struct Lane {
    ucp_context_h context = nullptr;
    ucp_worker_h worker = nullptr;
    bool used = false;  // some peer is reached through it
  };

  // After `idle` polls in a row found nothing: spin while this rank has a vCPU to itself; on an
  // oversubscribed machine yield, and once a few yields found nothing, sleep a little.
  // sched_yield only yields to tasks of this task group: ranks in other cgroups or autogroups
  // (a session each, on a kernel with sched_autogroup) would wait for the CPU a yielding rank
  // keeps — 3 to 4 times slower steps on the lab, whose processes run in sessions of their own.
  void IdleWait(int idle) const {
    constexpr int kYieldsBeforeSleep = 4;
    if (idle <= spins_before_yield_) return;
    if (idle <= spins_before_yield_ + kYieldsBeforeSleep) {
      sched_yield();
      return;
    }
    timespec nap{0, 20 * 1000};
    nanosleep(&nap, nullptr);
  }

  unsigned ProgressUcx() {
    unsigned n = 0;
    for (Lane& lane : lanes_) {
      if (lane.used) n += ucp_worker_progress(lane.worker);
    }
    return n;
  }

  // Progresses the mailboxes and the UCX lanes in use; the number of events. With no UCX request
  // in flight, UCX is progressed only every 256th call (what arrives there waits in its queues).
  unsigned Progress() {
    unsigned n = boxes_ != nullptr ? ProgressBoxes() : 0;
    if (live_ucx_ > 0 || (++ucx_skips_ & 255) == 0) n += ProgressUcx();
    return n;
  }

  const int rank_, size_;
  bool peer_errors_ = false;
  bool dirty_ = false;  // an operation failed with requests in flight
  Lane lanes_[2];
  std::vector<LaneKind> lane_of_;  // by peer rank
  std::vector<ucp_ep_h> eps_;
  // Requests by id, reused once reaped (free_ids_). Pointers are stable: UCX's callbacks hold
  // them. kCompleted (id 0) is what a request that completed as it was posted gets: a mailbox
  // message that went or came at once takes no entry (it is done, never live, never reaped).
  static constexpr ReqId kCompleted = 0;
  std::vector<std::unique_ptr<Req>> reqs_;
  std::vector<ReqId> free_ids_;
  std::list<std::unique_ptr<Req>> abandoned_;
  int live_ucx_ = 0;  // requests handed to UCX and not yet reaped
  unsigned ucx_skips_ = 0;
  // Shared-memory mailboxes to the ranks of this host (null: off); requests waiting on them.
  std::unique_ptr<Mailboxes> boxes_;
  std::vector<ReqId> box_sends_, box_recvs_;
  std::vector<int> box_queued_;  // by peer: sends in box_sends_
  std::vector<int> blocked_;     // ProgressBoxes: peers whose oldest queued send is still waiting
  bool single_copy_ = false;
  bool all_local_ = false;       // every rank is on this host
  std::vector<pid_t> pids_;      // peers' pids, for ReadPeer
  uint64_t cookie_[2] = {0, 0};  // reaped requests, reused (no malloc per message)
  // Idle progress polls before WaitAll yields the CPU: spin while every rank may have a vCPU of
  // its own (a yield is a system call that delays the next poll), for ~2 ms (65536 polls; with
  // 2048 or 16384 polls one launch in four ran 8-byte all-reduces 2-8x slower); yield at every
  // idle poll when
  // ranks outnumber the vCPUs this process may use (the peer being waited for may need this
  // one) — OpenMPI's yield-when-idle rule.
  int spins_before_yield_ = 64;
  int usable_cpus_ = 1;
  std::vector<Region> scratch_;
  std::mutex fail_mu_;
  absl::Status failed_;
  std::atomic<bool> has_failed_{false};
};

class UcxEngine : public Engine {
 public:
  UcxEngine(std::unique_ptr<UcxTransport> t, uint64_t generation)
      : Engine(std::move(t), generation, "ucx") {}
  ~UcxEngine() override {
    liveness_.reset();  // first: a clean goodbye, and no more callbacks into this engine
    Shutdown();
  }
  void SetLiveness(std::unique_ptr<Liveness> l) { liveness_ = std::move(l); }
  std::string Describe() { return static_cast<UcxTransport*>(transport())->Describe(); }

 private:
  std::unique_ptr<Liveness> liveness_;
};

}  // namespace

namespace {

// Where shared memory reaches: ranks with the same boot id and IPC and mount namespaces share
// System V and POSIX shared memory (UCX's own reachability test compares the same). Two node
// agents of one machine are one host here; two containers or lab hosts are not.
std::string HostKey() {
  std::string key;
  {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    in >> key;
  }
  for (const char* ns : {"/proc/self/ns/ipc", "/proc/self/ns/mnt"}) {
    char link[64] = {};
    const ssize_t n = readlink(ns, link, sizeof(link) - 1);
    absl::StrAppend(&key, "/", n > 0 ? std::string(link, static_cast<size_t>(n)) : "?");
  }
  return key;
}

// The address this rank's listeners bind to and peers on other hosts connect to.
absl::StatusOr<std::string> ListenAddress(const UcxOptions& o, bool multi_host) {
  if (!o.address.empty()) return o.address;
  if (!multi_host) return std::string("127.0.0.1");
  auto a = net::FirstExternalAddress();
  if (!a.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "UcxOptions.address: the ranks are on several hosts and this one has no address to "
        "offer them: ",
        a.status().message()));
  }
  return *a;
}

}  // namespace

namespace {

// The peers' worker addresses and which lane reaches each.
struct Peers {
  std::vector<std::string> addrs;
  std::vector<UcxTransport::LaneKind> lanes;
  bool multi_host = false;  // some rank is on another host (then every rank has one)
};

// Round 1: every rank's host key and shared-memory worker address.
absl::StatusOr<Peers> ExchangeHostAddresses(UcxTransport& t, Bootstrap* boot, const UcxOptions& o,
                                            const std::string& prefix, absl::Time deadline) {
  auto local = t.Address(UcxTransport::kLocal);
  if (!local.ok()) return local.status();
  const std::string host = HostKey();
  if (absl::Status st = boot->Publish(absl::StrCat(prefix, "/ucx/", o.rank), host + "\n" + *local);
      !st.ok())
    return st;
  Peers p;
  p.addrs.resize(o.size);
  p.lanes.assign(o.size, UcxTransport::kLocal);
  for (int j = 0; j < o.size; ++j) {
    auto a = boot->Lookup(absl::StrCat(prefix, "/ucx/", j), deadline);
    if (!a.ok()) return a.status();
    const size_t nl = a->find('\n');
    if (nl == std::string::npos) {
      return absl::DataLossError(absl::StrCat("bootstrap: rank ", j, "'s UCX record has no host"));
    }
    if (a->compare(0, nl, host) != 0) {
      p.lanes[j] = UcxTransport::kRemote;
      p.multi_host = true;
    }
    p.addrs[j] = a->substr(nl + 1);
  }
  return p;
}

// Round 2, between ranks of different hosts only: the network worker, on the interface of
// `address` unless remote_devices says otherwise, and its address.
absl::Status ExchangeNetworkAddresses(UcxTransport& t, Bootstrap* boot, const UcxOptions& o,
                                      const std::string& prefix, const std::string& address,
                                      absl::Time deadline, Peers& p) {
  std::string devices = o.remote_devices;
  if (devices.empty()) {
    auto dev = net::InterfaceOf(address);
    if (!dev.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("UcxOptions.address: ", address,
                       " is not an address of this host: ", dev.status().message()));
    }
    devices = *dev;
  }
  const std::string tls =
      o.remote_transports.empty() ? kDefaultRemoteUcxTransports : o.remote_transports;
  if (absl::Status st = t.Open(UcxTransport::kRemote, tls, devices); !st.ok()) return st;
  auto remote = t.Address(UcxTransport::kRemote);
  if (!remote.ok()) return remote.status();
  if (absl::Status st = boot->Publish(absl::StrCat(prefix, "/ucx-net/", o.rank), *remote); !st.ok())
    return st;
  for (int j = 0; j < o.size; ++j) {
    if (p.lanes[j] != UcxTransport::kRemote) continue;
    auto a = boot->Lookup(absl::StrCat(prefix, "/ucx-net/", j), deadline);
    if (!a.ok()) return a.status();
    p.addrs[j] = *a;
  }
  return absl::OkStatus();
}

// Where the liveness monitor reports a dead peer: the engine once it exists; until then the first
// report is kept and handed over when it does (a peer that dies while endpoints are created).
class DeadPeerSink {
 public:
  void Report(absl::Status status) {
    std::lock_guard<std::mutex> l(mu_);
    if (engine_ != nullptr) {
      engine_->Abort(std::move(status));
    } else if (pending_.ok()) {
      pending_ = std::move(status);
    }
  }
  void Attach(UcxEngine* engine) {
    std::lock_guard<std::mutex> l(mu_);
    engine_ = engine;
    if (!pending_.ok()) engine_->Abort(pending_);
  }

 private:
  std::mutex mu_;
  UcxEngine* engine_ = nullptr;
  absl::Status pending_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(Bootstrap* boot,
                                                                    const UcxOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size || o.size > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("UcxOptions: rank expected in [0, size) with ",
                                                   "1 <= size <= 65535, got rank ", o.rank,
                                                   " size ", o.size));
  }
  const absl::Time deadline = absl::Now() + o.connect_timeout;
  const std::string prefix = absl::StrCat(o.key_prefix, "/g", o.generation);
  auto t = std::make_unique<UcxTransport>(o.rank, o.size);
  if (absl::Status st = t->Init(o); !st.ok()) return st;
  absl::StatusOr<Peers> peers = ExchangeHostAddresses(*t, boot, o, prefix, deadline);
  if (!peers.ok()) return peers.status();
  auto address = ListenAddress(o, peers->multi_host);
  if (!address.ok()) return address.status();
  if (peers->multi_host) {
    if (absl::Status st = ExchangeNetworkAddresses(*t, boot, o, prefix, *address, deadline, *peers);
        !st.ok())
      return st;
  }
  // The liveness channel first: its connects are bounded by the deadline and blame the peer they
  // fail on, where UCX 1.13's tcp endpoint creation blocks in connect(2) for the kernel's SYN
  // retries (about two minutes) on a peer that cannot be reached.
  Liveness::Options lo;
  lo.interval = o.heartbeat_interval;
  lo.timeout = o.liveness_timeout;
  auto sink = std::make_shared<DeadPeerSink>();
  auto live = Liveness::Start(
      boot, prefix, o.rank, o.size, *address, lo,
      [sink, on_dead = o.on_peer_dead](int rank, const std::string& why) {
        absl::Status dead =
            BlamePeer(absl::UnavailableError(absl::StrCat("collectives: ", why)), rank);
        if (on_dead) on_dead(dead);
        sink->Report(std::move(dead));
      },
      deadline);
  if (!live.ok()) return live.status();
  if (absl::Status st = t->Connect(peers->addrs, peers->lanes); !st.ok()) return st;
  if (absl::Status st = t->ProbeLocalPeers(boot, prefix, o.single_copy && !peers->multi_host,
                                           o.mailboxes, deadline);
      !st.ok())
    return st;
  auto engine = std::make_unique<UcxEngine>(std::move(t), o.generation);
  engine->SetLiveness(std::move(*live));
  sink->Attach(engine.get());
  return std::unique_ptr<Communicator>(std::move(engine));
}

std::string DescribeUcxTransports(Communicator* comm) {
  auto* e = dynamic_cast<UcxEngine*>(comm);
  return e == nullptr ? std::string() : e->Describe();
}

}  // namespace troupe::collectives
