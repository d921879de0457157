// The head's ops views: what its HTTP API serves (runtime/ops_http.cc documents the routes), as
// JSON or Prometheus text, from the membership table, the scheduler, the directory and the jobs.
#include "absl/strings/str_cat.h"
#include "head_actor.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime::internal {

caf::message_handler HeadActor::ViewHandlers() {
  return {
      [this](ops_view_atom, const std::string& what,
             const std::string& arg) -> caf::result<std::string> {
        absl::StatusOr<std::string> v = View(what, arg);
        if (!v.ok()) return StatusToError(v.status());
        return *v;
      },
  };
}

absl::StatusOr<std::string> HeadActor::View(const std::string& what, const std::string& arg) {
  using json = nlohmann::json;
  if (what == "cluster") return ClusterView().dump();
  if (what == "metrics") return Metrics();
  if (what == "jobs") {
    json list = json::array();
    for (const auto& [id, j] : jobs_.jobs()) list.push_back(JobTable::Summary(j));
    return json{{"jobs", list}}.dump();
  }
  Job* j = jobs_.Find(arg);
  if ((what == "job" || what == "logs") && j == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", arg, "' on this head"));
  }
  if (what == "job") return JobTable::Full(*j).dump();
  if (what == "logs") {
    std::string out;
    for (const std::string& l : j->logs) absl::StrAppend(&out, l, "\n");
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown view '", what, "': expected cluster, jobs, job ID, logs ID or metrics"));
}

nlohmann::json HeadActor::ClusterView() {
  using json = nlohmann::json;
  json nodes = json::array();
  core_.ForEachMember([&](const MemberInfo& m) {
    if (m.kind != MemberKind::kNode) return;
    const std::string& name = m.id;
    json node = {
        {"name", name},           {"state", Name(m.state)},   {"host", m.host},
        {"address", m.address},   {"spot", IsSpot(m)},        {"resources", json::object()},
        {"used", json::object()}, {"labels", json::object()}, {"workers", json::array()}};
    if (std::optional<scheduler::NodeView> v = sched_.Node(name)) {
      for (const auto& [r, total] : v->total) {
        node["resources"][r] = total;
        node["used"][r] = total - (v->free.count(r) ? v->free.at(r) : 0.0);
      }
      for (const auto& [k, l] : v->labels) {
        if (k != kNodeLabel) node["labels"][k] = l;
      }
    }
    core_.ForEachMember([&](const MemberInfo& w) {
      if (w.kind != MemberKind::kWorker || w.node != name) return;
      json actors = json::array();
      for (const auto& [actor, named] : directory_) {
        if (named.worker == w.id) actors.push_back(actor);
      }
      node["workers"].push_back(
          {{"id", w.id}, {"state", Name(w.state)}, {"pid", w.pid}, {"actors", actors}});
    });
    nodes.push_back(std::move(node));
  });
  json groups = json::array();
  for (const std::string& g : sched_.GroupIds()) {
    groups.push_back(
        {{"name", g}, {"bundles", sched_.GroupNodes(g).value_or(std::vector<std::string>{})}});
  }
  return {{"generation", core_.generation()},
          {"epoch", store_ ? store_->epoch() : 0},
          {"nodes", std::move(nodes)},
          {"placement_groups", std::move(groups)}};
}

// Prometheus text format: the cluster's own series, then every job's (internal/jobs.h).
std::string HeadActor::Metrics() {
  std::map<std::pair<std::string, std::string>, int> by_state;
  for (MemberKind k : {MemberKind::kNode, MemberKind::kWorker}) {
    for (MemberState s :
         {MemberState::kJoining, MemberState::kAlive, MemberState::kDraining, MemberState::kDead}) {
      by_state[{Name(k), Name(s)}] = 0;
    }
  }
  core_.ForEachMember([&](const MemberInfo& m) { ++by_state[{Name(m.kind), Name(m.state)}]; });
  std::string out =
      "# HELP troupe_members Cluster members by kind and state.\n"
      "# TYPE troupe_members gauge\n";
  for (const auto& [ks, n] : by_state) {
    absl::StrAppend(&out, "troupe_members{kind=\"", ks.first, "\",state=\"", ks.second, "\"} ", n,
                    "\n");
  }
  absl::StrAppend(&out,
                  "# HELP troupe_membership_generation The membership generation (bumped on "
                  "every change).\n# TYPE troupe_membership_generation gauge\n"
                  "troupe_membership_generation ",
                  core_.generation(), "\n");
  absl::StrAppend(&out, jobs_.Metrics());
  return out;
}

}  // namespace troupe::runtime::internal
