// The UCX backend's set-up: the transport's lanes, endpoints and local-peer probe
// (ucx_transport.h; its operations are in ucx_transport.cc), the bootstrap rounds that exchange
// worker addresses, and the liveness channel that turns a peer's death into Unavailable on every
// pending operation. CreateUcxCommunicator runs them in order:
//   1. Init: the local lane (shared memory);
//   2. ExchangeHostAddresses: every rank's host key and local worker address ("<prefix>/ucx/<r>");
//   3. ExchangeNetworkAddresses, when the ranks span hosts: the network lane ("/ucx-net/<r>");
//   4. the liveness channel ("/live/<r>", liveness.h);
//   5. Connect: an endpoint to every peer on the lane that reaches it;
//   6. ProbeLocalPeers: single copy and mailboxes between the ranks of this host ("/local/<r>",
//      "/local-ok/<r>");
//   then the Engine takes the transport over.
#include "troupe/collectives/ucx_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "engine.h"
#include "liveness.h"
#include "mailbox.h"
#include "net.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "ucx_transport.h"

namespace troupe::collectives {
namespace {

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

absl::Status UcxTransport::Init(const UcxOptions& o) {
  peer_errors_ = o.ucx_peer_error_handling;
  std::string tls = o.transports;
  if (tls.empty() && std::getenv("UCX_TLS") == nullptr) tls = kDefaultUcxTransports;
  TROUPE_RETURN_IF_ERROR(Open(kLocal, tls, ""));
  cpu_set_t cpus;  // the vCPUs this process may run on (taskset, cgroups), not all online
  const int usable = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  usable_cpus_ = usable;
  spins_before_yield_ = size_ > usable ? 0 : 1 << 16;
  return absl::OkStatus();
}

absl::Status UcxTransport::Open(LaneKind kind, const std::string& tls, const std::string& devices,
                                bool wakeup) {
  const char* field = kind == kLocal ? "UcxOptions.transports" : "UcxOptions.remote_transports";
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // The network lane's waiters block on its worker's fd (Transport::ArmForEvents).
  params.features = UCP_FEATURE_TAG | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  ucp_config_t* config = nullptr;
  TROUPE_RETURN_IF_ERROR(TROUPE_UCX_CALL(ucp_config_read(nullptr, nullptr, &config)));
  const std::string rndv = kind != kRemote || std::getenv("UCX_RNDV_THRESH") != nullptr ? ""
                           : tls == "tcp" ? kTcpRndvThresh
                                          : kDefaultRemoteRndvThresh;
  const std::string rx_seg =
      kind == kRemote && tls == "tcp" && std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr
          ? kTcpRxSegSize
          : "";
  for (const auto& [name, value] : {std::pair<const char*, std::string>{"TLS", tls},
                                    std::pair<const char*, std::string>{"NET_DEVICES", devices},
                                    std::pair<const char*, std::string>{"RNDV_THRESH", rndv},
                                    std::pair<const char*, std::string>{"RX_SEG_SIZE", rx_seg}}) {
    if (value.empty()) continue;
    ucs_status_t m = ucp_config_modify(config, name, value.c_str());
    // The segment size is a tuning of ours, not the user's setting: a UCX without it reads in its
    // own segments.
    if (m != UCS_OK && std::string_view(name) == "RX_SEG_SIZE") continue;
    if (m != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": UCX rejected ", name, "='", value, "': ", ucs_status_string(m)));
    }
  }
  Lane& lane = lanes_[kind];
  ucs_status_t s = ucp_init(&params, config, &lane.context);
  ucp_config_release(config);
  TROUPE_RETURN_IF_ERROR(TROUPE_UCX_CALL(s));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the engine's exec lock serializes use
  TROUPE_RETURN_IF_ERROR(TROUPE_UCX_CALL(ucp_worker_create(lane.context, &wp, &lane.worker)));
  if (wakeup && ucp_worker_get_efd(lane.worker, &lane.efd) != UCS_OK) lane.efd = -1;
  return absl::OkStatus();
}

absl::StatusOr<std::string> UcxTransport::Address(LaneKind kind) {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  TROUPE_RETURN_IF_ERROR(TROUPE_UCX_CALL(ucp_worker_get_address(lanes_[kind].worker, &addr, &len)));
  std::string blob(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(lanes_[kind].worker, addr);
  return blob;
}

absl::Status UcxTransport::Connect(const std::vector<std::string>& addrs,
                                   const std::vector<LaneKind>& lanes) {
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
          absl::UnavailableError(absl::StrCat("collectives: rank ", rank_, " cannot reach rank ", j,
                                              lanes[j] == kLocal ? " on this host" : "",
                                              " through UCX: ", ucs_status_string(s))),
          j);
    }
  }
  // The network lane has an fd only where Open asked for wake-ups: no peer shares this host.
  events_ = lanes_[kRemote].used && lanes_[kRemote].efd >= 0;
  return absl::OkStatus();
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
absl::Status UcxTransport::ProbeLocalPeers(Bootstrap* boot, const std::string& prefix,
                                           bool want_single_copy, bool want_mailboxes,
                                           absl::Time deadline) {
  std::vector<int> local;
  for (int j = 0; j < size_; ++j) {
    if (lane_of_[j] == kLocal) local.push_back(j);
  }
  if (local.size() < 2) return absl::OkStatus();
  // More ranks of this communicator on this host than vCPUs: longer naps (transport.h, IdleNap).
  const int per_vcpu = static_cast<int>((local.size() + usable_cpus_ - 1) / usable_cpus_);
  if (static_cast<int>(local.size()) > usable_cpus_) {
    max_nap_ = std::min(absl::Milliseconds(1), absl::Microseconds(50) * per_vcpu);
  }
  std::random_device rd;
  for (auto& w : cookie_) w = (uint64_t{rd()} << 32) | rd();
  if (want_mailboxes) {
    auto boxes = Mailboxes::Create(rank_, local);
    if (boxes.ok()) boxes_ = std::move(*boxes);  // else off: this rank reports no mailboxes
  }
  const std::string me =
      absl::StrCat(BootId(), " ", getpid(), " ", reinterpret_cast<uintptr_t>(cookie_), " ",
                   cookie_[0], " ", cookie_[1], " ", boxes_ != nullptr ? boxes_->inbox_id() : -1);
  TROUPE_RETURN_IF_ERROR(boot->Publish(absl::StrCat(prefix, "/local/", rank_), me));
  pids_.assign(size_, 0);
  bool readable = want_single_copy, attached = boxes_ != nullptr;
  auto keys = [&](const char* what) {
    std::vector<std::string> k;
    for (int j : local) k.push_back(absl::StrCat(prefix, what, j));
    return k;
  };
  // Every local peer's record in one lookup (Bootstrap::LookupAll).
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> peers,
                          boot->LookupAll(keys("/local/"), deadline));
  for (size_t i = 0; i < local.size(); ++i) {
    const int j = local[i];
    if (j == rank_) continue;
    std::istringstream in(peers[i]);
    std::string boot_id;
    uint64_t addr = 0, want[2] = {0, 0}, got[2] = {1, 1};
    int inbox = -1;
    in >> boot_id >> pids_[j] >> addr >> want[0] >> want[1] >> inbox;
    readable = readable && in && boot_id == BootId() &&
               ReadFrom(pids_[j], addr, got, sizeof(got)) && got[0] == want[0] && got[1] == want[1];
    attached = attached && in && inbox >= 0 && boxes_->Attach(j, inbox).ok();
  }
  TROUPE_RETURN_IF_ERROR(boot->Publish(absl::StrCat(prefix, "/local-ok/", rank_),
                                       absl::StrCat(readable ? 1 : 0, " ", attached ? 1 : 0)));
  bool all_read = true, all_attached = true;
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> oks,
                          boot->LookupAll(keys("/local-ok/"), deadline));
  for (const std::string& ok : oks) {
    all_read = all_read && !ok.empty() && ok[0] == '1';
    all_attached = all_attached && ok.size() == 3 && ok[2] == '1';
  }
  all_local_ = static_cast<int>(local.size()) == size_;
  single_copy_ = all_read && all_local_;
  if (!all_attached) boxes_.reset();
  box_queued_.assign(size_, 0);
  return absl::OkStatus();
}

const std::string& UcxTransport::BootId() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    in >> s;
    return s;
  }();
  return id;
}

std::string UcxTransport::Describe() {
  std::string out = absl::StrCat(
      "single copy (cross-memory attach, kSingleCopy above CollectiveOptions::small_bytes, "
      "above same_host_small_bytes where staging is on): ",
      single_copy_ ? "on" : "off", "\n",
      "staged all-reduce (kSingleCopy through the shared segments, above "
      "CollectiveOptions::same_host_small_bytes; where single copy is on too, whichever the ranks "
      "measure faster): ",
      HostShared() != nullptr ? "on" : "off", "\n",
      "shared-memory mailboxes (collective messages up to ", Mailboxes::kPayloadBytes,
      " bytes between ranks of this host): ", boxes_ != nullptr ? "on" : "off", "\n",
      "idle waits: ", events_ ? "block on the network lane's events" : "poll, yield and nap", "\n",
      "moves of this rank off a vCPU a rank of this host shared (MoveOffSharedCpu): ",
      boxes_ != nullptr ? boxes_->moves() : 0, "\n");
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

UcxTransport::~UcxTransport() {
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

namespace {

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

// The peers' worker addresses and which lane reaches each.
struct Peers {
  std::vector<std::string> addrs;
  std::vector<UcxTransport::LaneKind> lanes;
  bool multi_host = false;  // some rank is on another host (then every rank has one)
};

// Round 1: every rank's host key and shared-memory worker address.
absl::StatusOr<Peers> ExchangeHostAddresses(UcxTransport& t, Bootstrap* boot, const UcxOptions& o,
                                            const std::string& prefix, absl::Time deadline) {
  TROUPE_ASSIGN_OR_RETURN(auto local, t.Address(UcxTransport::kLocal));
  const std::string host = net::HostKey();
  TROUPE_RETURN_IF_ERROR(boot->Publish(absl::StrCat(prefix, "/ucx/", o.rank), host + "\n" + local));
  Peers p;
  p.addrs.resize(o.size);
  p.lanes.assign(o.size, UcxTransport::kLocal);
  std::vector<std::string> keys;
  for (int j = 0; j < o.size; ++j) keys.push_back(absl::StrCat(prefix, "/ucx/", j));
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> all, boot->LookupAll(keys, deadline));
  for (int j = 0; j < o.size; ++j) {
    const std::string& a = all[j];
    const size_t nl = a.find('\n');
    if (nl == std::string::npos) {
      return absl::DataLossError(absl::StrCat("bootstrap: rank ", j, "'s UCX record has no host"));
    }
    if (a.compare(0, nl, host) != 0) {
      p.lanes[j] = UcxTransport::kRemote;
      p.multi_host = true;
    }
    p.addrs[j] = a.substr(nl + 1);
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
  // Waiting on events only where every peer is on another host (HasEvents).
  const bool alone = std::count(p.lanes.begin(), p.lanes.end(), UcxTransport::kLocal) == 1;
  TROUPE_RETURN_IF_ERROR(t.Open(UcxTransport::kRemote, tls, devices, /*wakeup=*/alone));
  TROUPE_ASSIGN_OR_RETURN(auto remote, t.Address(UcxTransport::kRemote));
  TROUPE_RETURN_IF_ERROR(boot->Publish(absl::StrCat(prefix, "/ucx-net/", o.rank), remote));
  std::vector<std::string> keys;
  std::vector<int> remote_ranks;
  for (int j = 0; j < o.size; ++j) {
    if (p.lanes[j] != UcxTransport::kRemote) continue;
    keys.push_back(absl::StrCat(prefix, "/ucx-net/", j));
    remote_ranks.push_back(j);
  }
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> all, boot->LookupAll(keys, deadline));
  for (size_t i = 0; i < remote_ranks.size(); ++i) p.addrs[remote_ranks[i]] = std::move(all[i]);
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
  const absl::Time deadline = base::MonotonicNow() + o.connect_timeout;
  const std::string prefix = absl::StrCat(o.key_prefix, "/g", o.generation);
  auto t = std::make_unique<UcxTransport>(o.rank, o.size);
  TROUPE_RETURN_IF_ERROR(t->Init(o));
  TROUPE_ASSIGN_OR_RETURN(Peers peers, ExchangeHostAddresses(*t, boot, o, prefix, deadline));
  TROUPE_ASSIGN_OR_RETURN(auto address, ListenAddress(o, peers.multi_host));
  if (peers.multi_host) {
    TROUPE_RETURN_IF_ERROR(ExchangeNetworkAddresses(*t, boot, o, prefix, address, deadline, peers));
  }
  // The liveness channel first: its connects (and probes of the ranks it does not watch) are
  // bounded by the deadline and blame the peer they fail on, where UCX 1.13's tcp endpoint creation
  // blocks in connect(2) for the kernel's SYN retries (about two minutes) on a peer that cannot be
  // reached.
  Liveness::Options lo;
  lo.interval = o.heartbeat_interval;
  lo.timeout = o.liveness_timeout;
  auto sink = std::make_shared<DeadPeerSink>();
  auto live = Liveness::Start(
      boot, prefix, o.rank, o.size, address, lo,
      [sink, on_dead = o.on_peer_dead](int rank, const std::string& why) {
        absl::Status dead =
            BlamePeer(absl::UnavailableError(absl::StrCat("collectives: ", why)), rank);
        if (on_dead) on_dead(dead);
        sink->Report(std::move(dead));
      },
      deadline);
  if (!live.ok()) return live.status();
  // The ranks it does not watch, across hosts, must be reachable too before UCX dials them.
  if (peers.multi_host) TROUPE_RETURN_IF_ERROR((*live)->ProbeUnwatched(boot, prefix, deadline));
  TROUPE_RETURN_IF_ERROR(t->Connect(peers.addrs, peers.lanes));
  TROUPE_RETURN_IF_ERROR(
      t->ProbeLocalPeers(boot, prefix, o.single_copy && !peers.multi_host, o.mailboxes, deadline));
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
