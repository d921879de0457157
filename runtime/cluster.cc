#include "troupe/runtime/cluster.h"

#include <link.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/context.h"
#include "internal/mesh.h"
#include "internal/process.h"
#include "internal/tls.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {

void ClusterOptions::Register(ConfigRegistry& registry) {
  registry.AddDuration("heartbeat_interval", &heartbeat_interval,
                       "how often nodes and workers send heartbeats", Positive());
  registry.AddDuration("heartbeat_timeout", &heartbeat_timeout,
                       "silence after which the head declares a process dead", Positive());
  registry.AddDuration("hung_timeout", &hung_timeout,
                       "an actor whose handler runs this long is reported hung", Positive());
  registry.AddDuration("spawn_timeout", &spawn_timeout, "remote spawn deadline", Positive());
  registry.AddDuration("join_timeout", &join_timeout,
                       "how long a node or worker keeps trying to reach a head not yet listening",
                       Positive());
  registry.AddDuration("head_grace", &head_grace,
                       "how long a node agent or worker that lost the head keeps its processes "
                       "and actors running while it rejoins the head that takes over",
                       Positive());
  registry.AddString("log_dir", &log_dir, "where worker processes write stdout/stderr");
  registry.AddString("build_id", &build_id, "override this binary's build id (tests)");
}

void RegisterClusterTypes(caf::actor_system_config& cfg) {
  cfg.add_message_type<MemberInfo>("troupe.MemberInfo");
  cfg.add_message_type<std::vector<MemberInfo>>("troupe.MemberInfos");
  cfg.add_message_type<MembershipEvent>("troupe.MembershipEvent");
  cfg.add_message_type<NodeFault>("troupe.NodeFault");
  cfg.add_message_type<Placement>("troupe.Placement");
  cfg.add_message_type<RankGang>("troupe.RankGang");
  cfg.add_message_type<RankGrant>("troupe.RankGrant");
  cfg.add_message_type<GroupStrategy>("troupe.GroupStrategy");
  cfg.add_message_type<internal::ActorStat>("troupe.ActorStat");
  cfg.add_message_type<std::vector<internal::ActorStat>>("troupe.ActorStats");
}

namespace {

int FindBuildId(struct dl_phdr_info* info, size_t, void* out) {
  if (info->dlpi_name && info->dlpi_name[0] != '\0') return 0;  // the main program only
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const unsigned char* desc =
          reinterpret_cast<const unsigned char*>(name + ((nh->n_namesz + 3) & ~3u));
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        std::string hex;
        for (unsigned j = 0; j < nh->n_descsz; ++j)
          absl::StrAppend(&hex, absl::Hex(desc[j], absl::kZeroPad2));
        *static_cast<std::string*>(out) = hex;
        return 1;
      }
      p = reinterpret_cast<const char*>(desc) + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return 0;
}

}  // namespace

void ClusterOptions::ScaleForSharedHost(int processes, int vcpus) {
  const int per_vcpu = (processes + std::max(1, vcpus) - 1) / std::max(1, vcpus);
  const int extra_seconds = per_vcpu <= 8 ? 0 : (per_vcpu - 1) / 8;
  heartbeat_timeout = std::max<Duration>(
      heartbeat_timeout, std::chrono::seconds(1) + std::chrono::seconds(extra_seconds));
}

std::string ClusterOptions::EffectiveBuildId() const {
  return build_id.empty() ? BuildId() : build_id;
}

std::string BuildId() {
  static const std::string id = [] {
    std::string hex;
    dl_iterate_phdr(FindBuildId, &hex);
    if (!hex.empty()) return hex;
    // No GNU build-id note: FNV-1a of the executable's bytes.
    std::ifstream in(internal::SelfExe(), std::ios::binary);
    uint64_t h = 1469598103934665603ULL;
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      for (std::streamsize i = 0; i < in.gcount(); ++i) {
        h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ULL;
      }
    }
    return absl::StrCat("fnv-", absl::Hex(h, absl::kZeroPad16));
  }();
  return id;
}

absl::StatusOr<ClusterClient> ClusterClient::Connect(Runtime& runtime, const std::string& host,
                                                     uint16_t port, Duration timeout,
                                                     Duration retry_for) {
  if (!runtime.options().network) {
    return absl::FailedPreconditionError(
        "ClusterClient::Connect: the runtime was created without RuntimeOptions::network");
  }
  TROUPE_ASSIGN_OR_RETURN(auto head, internal::Connect(runtime, host, port, retry_for));
  runtime.internal_context()->SetHead(head);
  return ClusterClient(&runtime, head, host, port, timeout);
}

std::string ClusterClient::address() const { return absl::StrCat(host_, ":", port_); }

void ClusterClient::ConnectDirectly() { internal::StartMesh(*runtime_, head_, ""); }

void ClusterClient::ConnectTo(const std::string& worker) {
  internal::ReachWorker(*runtime_->internal_context(), worker);
}

absl::Status ClusterClient::Reconnect(Duration grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  absl::Status last = absl::UnavailableError("nothing answered");
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<caf::actor> head =
        internal::Connect(*runtime_, host_, port_, std::chrono::milliseconds(200));
    if (head.ok()) {
      head_ = *head;
      runtime_->internal_context()->SetHead(head_);
      if (runtime_->internal_context()->mesh()) internal::StartMesh(*runtime_, head_, "");
      return absl::OkStatus();
    }
    last = head.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("lost the cluster's head at ", address(),
                                             " and no head took over within ",
                                             FormatDuration(grace), "; last: ", last.message()));
}

namespace {

template <class... Ts, class... Args>
absl::StatusOr<std::tuple<Ts...>> Ask(caf::actor_system& sys, const caf::actor& to,
                                      Duration timeout, Args&&... args) {
  caf::scoped_actor self{sys};
  absl::StatusOr<std::tuple<Ts...>> out = absl::UnavailableError("no answer");
  self->request(to, std::chrono::duration_cast<caf::timespan>(timeout), std::forward<Args>(args)...)
      .receive([&](Ts&... xs) { out = std::make_tuple(std::move(xs)...); },
               [&](caf::error& e) { out = ErrorToStatus(e, "head"); });
  return out;
}

}  // namespace

absl::StatusOr<ActorRef> ClusterClient::Spawn(const std::string& type, const caf::message& args,
                                              const std::string& name, const std::string& where) {
  TROUPE_ASSIGN_OR_RETURN(auto p, Placement::Parse(where));
  return Spawn(type, args, name, p);
}

absl::StatusOr<ActorRef> ClusterClient::Spawn(const std::string& type, const caf::message& args,
                                              const std::string& name, const Placement& placement) {
  uint64_t gen = name.empty() ? 1 : runtime_->internal_context()->NextGeneration(name);
  TROUPE_ASSIGN_OR_RETURN(
      auto r, (Ask<caf::actor, std::string, std::string>(runtime_->system(), head_, timeout_,
                                                         internal::spawn_atom::value, type, args,
                                                         name, gen, placement)));
  return ActorRef{name, gen, std::get<0>(r), std::get<2>(r)};
}

absl::StatusOr<std::vector<std::string>> ClusterClient::CreatePlacementGroup(
    const std::string& name, const std::vector<std::string>& bundles, GroupStrategy strategy,
    const std::string& domain_key) {
  TROUPE_ASSIGN_OR_RETURN(auto r, Ask<std::vector<std::string>>(runtime_->system(), head_, timeout_,
                                                                internal::pg_atom::value, name,
                                                                bundles, strategy, domain_key));
  return std::get<0>(r);
}

absl::StatusOr<ActorRef> ClusterClient::Lookup(const std::string& name) {
  auto r = Ask<caf::actor, uint64_t, std::string, std::string>(runtime_->system(), head_, timeout_,
                                                               internal::lookup_atom::value, name);
  if (!r.ok()) return absl::NotFoundError(r.status().message());
  return ActorRef{name, std::get<1>(*r), std::get<0>(*r), std::get<3>(*r)};
}

absl::StatusOr<std::string> ClusterClient::WhereIs(const std::string& name) {
  auto r = Ask<caf::actor, uint64_t, std::string, std::string>(runtime_->system(), head_, timeout_,
                                                               internal::lookup_atom::value, name);
  if (!r.ok()) return absl::NotFoundError(r.status().message());
  return std::get<2>(*r);
}

absl::StatusOr<std::vector<MemberInfo>> ClusterClient::Members() {
  TROUPE_ASSIGN_OR_RETURN(auto r, Ask<std::vector<MemberInfo>>(runtime_->system(), head_, timeout_,
                                                               internal::members_atom::value));
  return std::get<0>(r);
}

absl::StatusOr<uint64_t> ClusterClient::Generation() {
  TROUPE_ASSIGN_OR_RETURN(
      auto r, Ask<uint64_t>(runtime_->system(), head_, timeout_, internal::generation_atom::value));
  return std::get<0>(r);
}

absl::StatusOr<std::string> ClusterClient::SubmitJob(const std::string& name,
                                                     const std::string& spec_toml, int64_t steps) {
  TROUPE_ASSIGN_OR_RETURN(auto r, Ask<std::string>(runtime_->system(), head_, timeout_,
                                                   job_submit_atom::value, name, spec_toml, steps));
  return std::get<0>(r);
}

absl::Status ClusterClient::StopJob(const std::string& id) {
  return Ask<bool>(runtime_->system(), head_, timeout_, job_stop_atom::value, id).status();
}

absl::StatusOr<RankGrant> ClusterClient::ReserveRanks(const RankGang& gang, Duration timeout) {
  TROUPE_ASSIGN_OR_RETURN(auto r, Ask<RankGrant>(runtime_->system(), head_,
                                                 timeout > Duration::zero() ? timeout : timeout_,
                                                 job_gang_atom::value, gang));
  return std::get<0>(r);
}

absl::StatusOr<std::string> ClusterClient::View(const std::string& what, const std::string& arg) {
  TROUPE_ASSIGN_OR_RETURN(auto r, Ask<std::string>(runtime_->system(), head_, timeout_,
                                                   ops_view_atom::value, what, arg));
  return std::get<0>(r);
}

void ClusterClient::Subscribe(const caf::actor& subscriber) {
  caf::anon_send(head_, internal::subscribe_atom::value, subscriber);
}

}  // namespace troupe::runtime
