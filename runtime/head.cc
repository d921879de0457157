#include "internal/head.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "internal/cluster_protocol.h"

namespace troupe::runtime::internal {
namespace {

using Clock = std::chrono::steady_clock;

struct Member {
  MemberInfo info;
  caf::actor handle;  // node agent or worker actor
  Clock::time_point last_seen;
  // worker only:
  std::map<std::string, ActorStat> actors;  // by actor name, from heartbeats
  std::set<std::string> hung;               // actors already reported hung
  bool down_reported = false;
  std::string exit_detail, stderr_tail;  // from the node agent's waitpid
  size_t hosted = 0;                     // actors spawned here, for placement
};

class HeadActor final : public caf::event_based_actor {
 public:
  HeadActor(caf::actor_config& cfg, ClusterOptions options, std::string build_id)
      : caf::event_based_actor(cfg), options_(std::move(options)), build_id_(std::move(build_id)) {}

  caf::behavior make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) { HandleDown(dm); });
    delayed_send(this, options_.heartbeat_interval / 2, tick_atom::value);
    return {
        [this](reg_node_atom, const std::string& name, const std::string& build_id,
               const std::string& resources, const std::string& labels,
               const caf::actor& agent) -> caf::result<uint64_t> {
          if (auto e = CheckBuild("node", name, build_id)) return *e;
          auto it = members_.find(name);
          if (it != members_.end() && it->second.info.state != "dead") {
            return caf::make_error(caf::sec::runtime_error,
                                   absl::StrCat("node '", name, "' is already a member"));
          }
          Member m;
          m.info = MemberInfo{name, "node", name, "alive", 0, resources, labels};
          m.handle = agent;
          m.last_seen = Clock::now();
          monitor(agent);
          members_[name] = std::move(m);
          Publish("node_alive", name, name, 0, "resources " + resources + " labels " + labels);
          return generation_;
        },
        [this](reg_worker_atom, const std::string& id, const std::string& node, int64_t pid,
               const std::string& build_id, const caf::actor& worker) -> caf::result<uint64_t> {
          if (auto e = CheckBuild("worker", id, build_id)) return *e;
          Member m;
          m.info = MemberInfo{id, "worker", node, "alive", pid, "", ""};
          m.handle = worker;
          m.last_seen = Clock::now();
          monitor(worker);
          members_[id] = std::move(m);
          Publish("worker_alive", id, node, pid, "");
          return generation_;
        },
        [this](heartbeat_atom, const std::string& id, const std::vector<ActorStat>& stats) {
          auto it = members_.find(id);
          if (it == members_.end() || it->second.info.state == "dead") return;
          Member& m = it->second;
          m.last_seen = Clock::now();
          m.actors.clear();
          for (const auto& s : stats) m.actors[s.name] = s;
          auto hung_ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(options_.hung_timeout).count();
          for (const auto& s : stats) {
            if (s.busy_ms >= static_cast<uint64_t>(hung_ms)) {
              if (m.hung.insert(s.name).second) {
                Publish("actor_hung", s.name, m.info.node, m.info.pid,
                        absl::StrCat("handler running for ", s.busy_ms, "ms on worker ", id,
                                     " (progress ", s.progress, ")"),
                        "", /*bump=*/false);
              }
            } else {
              m.hung.erase(s.name);
            }
          }
        },
        [this](wexit_atom, const std::string& id, int64_t pid, const std::string& status,
               const std::string& tail) {
          auto it = members_.find(id);
          if (it == members_.end()) return;
          it->second.exit_detail = status;
          it->second.stderr_tail = tail;
          MarkWorkerDead(id, "process " + status);
          ReportWorkerDown(id);
        },
        [this](flush_atom, const std::string& id) { ReportWorkerDown(id); },
        [this](drain_atom, const std::string& node, int64_t grace_ms) {
          auto it = members_.find(node);
          if (it == members_.end() || it->second.info.state != "alive") return;
          it->second.info.state = "draining";
          Publish("node_draining", node, node, 0,
                  absl::StrCat("preemption notice; leaves within ", grace_ms, "ms"));
        },
        [this](leave_atom, const std::string& node) { MarkNodeDead(node, "left"); },
        [this](spawn_atom, const std::string& type, const caf::message& args,
               const std::string& name, uint64_t gen,
               const std::string& where) -> caf::result<caf::actor, std::string> {
          return HandleSpawn(type, args, name, gen, where);
        },
        [this](lookup_atom,
               const std::string& name) -> caf::result<caf::actor, uint64_t, std::string> {
          auto it = directory_.find(name);
          if (it == directory_.end()) {
            return caf::make_error(caf::sec::runtime_error,
                                   absl::StrCat("no actor named '", name, "' in the cluster"));
          }
          return {it->second.handle, it->second.generation, it->second.worker};
        },
        [this](members_atom) {
          std::vector<MemberInfo> out;
          for (const auto& [id, m] : members_) out.push_back(m.info);
          return out;
        },
        [this](generation_atom) { return generation_; },
        [this](subscribe_atom, const caf::actor& who) {
          subscribers_.push_back(who);
          monitor(who);
        },
        [this](tick_atom) {
          CheckHeartbeats();
          delayed_send(this, options_.heartbeat_interval / 2, tick_atom::value);
        },
    };
  }

 private:
  struct Named {
    caf::actor handle;
    uint64_t generation;
    std::string worker;
    caf::actor requester;  // told when the actor goes down
  };

  // Removes `it` from the directory and tells whoever spawned it.
  std::map<std::string, struct Named>::iterator NamedDown(std::map<std::string, Named>::iterator it,
                                                          const caf::error& reason,
                                                          const std::string& detail) {
    if (it->second.requester) {
      send(it->second.requester, rdown_atom::value, it->first, it->second.generation, reason,
           detail);
    }
    return directory_.erase(it);
  }

  std::optional<caf::error> CheckBuild(const std::string& what, const std::string& id,
                                       const std::string& build_id) {
    if (build_id == build_id_) return std::nullopt;
    std::string why =
        absl::StrCat(what, " '", id, "' refused: its build id ", build_id,
                     " differs from the head's ", build_id_, "; run the same binary everywhere");
    Publish("refused", id, what == "node" ? id : "", 0, why, "", /*bump=*/false);
    return caf::make_error(caf::sec::runtime_error, why);
  }

  void Publish(const std::string& kind, const std::string& subject, const std::string& node,
               int64_t pid, const std::string& detail, const std::string& tail = "",
               bool bump = true) {
    if (bump) ++generation_;
    MembershipEvent e{generation_, kind, subject, node, pid, detail, tail};
    aout(this) << "troupe-head: " << e.DebugString() << std::endl;
    for (const auto& s : subscribers_) send(s, membership_atom::value, e);
  }

  void MarkWorkerDead(const std::string& id, const std::string& why) {
    auto it = members_.find(id);
    if (it == members_.end() || it->second.info.state == "dead") return;
    Member& m = it->second;
    m.info.state = "dead";
    if (m.exit_detail.empty()) m.exit_detail = why;
    for (auto d = directory_.begin(); d != directory_.end();) {
      d = d->second.worker == id
              ? NamedDown(d, caf::make_error(caf::exit_reason::remote_link_unreachable),
                          "worker " + id + " died: " + why)
              : std::next(d);
    }
    // The exit report from the node agent normally follows within milliseconds; wait for it
    // briefly so the down event can carry the exit status and the stderr tail.
    delayed_send(this, std::chrono::milliseconds(250), flush_atom::value, id);
  }

  void ReportWorkerDown(const std::string& id) {
    auto it = members_.find(id);
    if (it == members_.end() || it->second.down_reported || it->second.info.state != "dead") {
      return;
    }
    Member& m = it->second;
    m.down_reported = true;
    Publish("worker_down", id, m.info.node, m.info.pid, m.exit_detail, m.stderr_tail);
  }

  void MarkNodeDead(const std::string& node, const std::string& why) {
    auto it = members_.find(node);
    if (it == members_.end() || it->second.info.state == "dead") return;
    for (auto& [id, m] : members_) {
      if (m.info.kind == "worker" && m.info.node == node && m.info.state != "dead") {
        MarkWorkerDead(id, "its node " + why);
        ReportWorkerDown(id);
      }
    }
    it->second.info.state = "dead";
    Publish("node_dead", node, node, 0, why);
  }

  void HandleDown(const caf::down_msg& dm) {
    subscribers_.erase(
        std::remove_if(subscribers_.begin(), subscribers_.end(),
                       [&](const caf::actor& a) { return a.address() == dm.source; }),
        subscribers_.end());
    for (auto d = directory_.begin(); d != directory_.end(); ++d) {
      if (d->second.handle.address() == dm.source) {
        NamedDown(d, dm.reason, "actor exited");
        return;
      }
    }
    for (auto& [id, m] : members_) {
      if (m.handle.address() != dm.source || m.info.state == "dead") continue;
      std::string why = "connection lost (" + caf::to_string(dm.reason) + ")";
      if (m.info.kind == "worker") {
        MarkWorkerDead(id, why);
      } else {
        MarkNodeDead(id, why);
      }
      return;
    }
  }

  void CheckHeartbeats() {
    auto now = Clock::now();
    std::vector<std::string> silent;
    for (auto& [id, m] : members_) {
      if (m.info.state == "dead") continue;
      if (now - m.last_seen > options_.heartbeat_timeout) silent.push_back(id);
    }
    for (const auto& id : silent) {
      Member& m = members_[id];
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_seen).count();
      std::string why = absl::StrCat(
          "no heartbeat for ", ms, "ms (timeout ",
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.heartbeat_timeout).count(),
          "ms)");
      if (m.info.kind == "worker") {
        MarkWorkerDead(id, why);
        ReportWorkerDown(id);
        // Fence it: a stopped process must not come back and act on stale state.
        auto node = members_.find(m.info.node);
        if (node != members_.end() && node->second.info.state != "dead") {
          send(node->second.handle, fence_atom::value, id);
        }
      } else {
        MarkNodeDead(id, why);
      }
    }
  }

  caf::result<caf::actor, std::string> HandleSpawn(const std::string& type,
                                                   const caf::message& args,
                                                   const std::string& name, uint64_t gen,
                                                   const std::string& where) {
    std::string want_node, want_worker;
    if (where.rfind("node=", 0) == 0)
      want_node = where.substr(5);
    else if (where.rfind("worker=", 0) == 0)
      want_worker = where.substr(7);
    else if (!where.empty())
      return caf::make_error(
          caf::sec::runtime_error,
          absl::StrCat("placement '", where, "': expected '', 'node=<name>' or 'worker=<id>'"));
    Member* best = nullptr;
    for (auto& [id, m] : members_) {
      if (m.info.kind != "worker" || m.info.state != "alive") continue;
      auto node = members_.find(m.info.node);
      if (node == members_.end() || node->second.info.state != "alive") continue;
      if (!want_node.empty() && m.info.node != want_node) continue;
      if (!want_worker.empty() && id != want_worker) continue;
      if (!best || m.hosted < best->hosted) best = &m;
    }
    if (!best) {
      return caf::make_error(caf::sec::runtime_error,
                             absl::StrCat("no alive worker for '", where.empty() ? "any" : where,
                                          "' (draining and dead nodes take no work)"));
    }
    best->hosted++;
    std::string worker_id = best->info.id;
    // Before make_response_promise, which takes the sender out of the current message.
    caf::actor requester = caf::actor_cast<caf::actor>(current_sender());
    auto rp = make_response_promise<caf::actor, std::string>();
    request(best->handle, options_.spawn_timeout, spawn_atom::value, type, args, name, gen)
        .then(
            [this, rp, name, gen, worker_id, requester](const caf::actor& h) mutable {
              if (!name.empty()) {
                directory_[name] = Named{h, gen, worker_id, requester};
                monitor(h);
              }
              rp.deliver(h, worker_id);
            },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
    return rp;
  }

  ClusterOptions options_;
  std::string build_id_;
  uint64_t generation_ = 0;
  std::map<std::string, Member> members_;
  std::map<std::string, Named> directory_;
  std::vector<caf::actor> subscribers_;
};

}  // namespace

caf::actor SpawnHead(caf::actor_system& system, ClusterOptions options, std::string build_id) {
  return system.spawn<HeadActor>(std::move(options), std::move(build_id));
}

}  // namespace troupe::runtime::internal
