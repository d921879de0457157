#include "troupe/runtime/sim_cluster.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/tls.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime::testing {

using namespace troupe::runtime::internal;  // the protocol's atoms
using Clock = std::chrono::steady_clock;

namespace {
using beat_atom = caf::atom_constant<caf::atom("sim_beat")>;
using quiet_atom = caf::atom_constant<caf::atom("sim_quiet")>;
using join_atom = caf::atom_constant<caf::atom("sim_join")>;

int64_t NowNs() { return Clock::now().time_since_epoch().count(); }
}  // namespace

struct SimCluster::State {
  SimClusterOptions o;
  std::unique_ptr<Runtime> runtime;
  mutable std::mutex mu;
  std::condition_variable cv;
  int answered = 0;  // registrations answered in the current round
  std::string error;
  int64_t started = 0, joined = 0;
  caf::actor head, subscriber;
  std::vector<std::string> nodes, workers;
  std::map<std::string, caf::actor> members;
  std::set<std::string> gone;
  std::map<std::string, int64_t> deaths_seen;
  std::atomic<int64_t> spawns{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> head_lost{false};
  std::thread watcher;

  void Answered(const std::string& error_text) {
    std::lock_guard<std::mutex> l(mu);
    ++answered;
    if (!error_text.empty() && error.empty()) error = error_text;
    cv.notify_all();
  }
};

namespace {

using StatePtr = std::shared_ptr<SimCluster::State>;

struct MemberState {
  caf::actor head;
  bool silent = false, full = true, beating = false;
  uint64_t version = 0;
};

// One member: node (`node` empty) or worker of `node`.
caf::behavior Member(caf::stateful_actor<MemberState>* self, StatePtr st, std::string id,
                     std::string node) {
  self->set_default_handler(caf::drop);
  const bool is_node = node.empty();
  return {
      [=](join_atom, const caf::actor& head) {
        self->state.head = head;
        self->state.full = true;
        self->request(head, std::chrono::seconds(30), cluster_hello_atom::value,
                      kClusterProtocolVersion, st->o.build_id,
                      std::string(is_node ? "node" : "worker"), id)
            .then(
                [=](uint32_t) {
                  const caf::actor me = caf::actor_cast<caf::actor>(self);
                  caf::message reg =
                      is_node ? caf::make_message(reg_node_atom::value, id,
                                                  absl::StrCat("cpu=", st->o.workers_per_node),
                                                  std::string(), std::string("127.0.0.1"),
                                                  std::string("simhost"), me)
                              : caf::make_message(reg_worker_atom::value, id, node,
                                                  static_cast<int64_t>(getpid()), me, int32_t{0},
                                                  int32_t{0});
                  self->request(head, std::chrono::seconds(30), std::move(reg))
                      .then(
                          [=](uint64_t) {
                            // Beats from its registration on: a node waiting for the others to
                            // join would go silent past the timeout (1,024 nodes did).
                            if (!std::exchange(self->state.beating, true)) {
                              self->send(self, beat_atom::value);
                            }
                            st->Answered("");
                          },
                          [=](caf::error& e) {
                            st->Answered(absl::StrCat(id, ": ", self->system().render(e)));
                          });
                },
                [=](caf::error& e) {
                  st->Answered(absl::StrCat(id, " hello: ", self->system().render(e)));
                });
      },
      [=](beat_atom) {
        MemberState& m = self->state;
        if (!m.silent && m.head) {
          const uint64_t base = m.full ? 0 : m.version;
          if (m.full) ++m.version;
          m.full = false;
          self->send(m.head, heartbeat_atom::value, id, base, m.version, std::vector<ActorStat>{});
        }
        self->delayed_send(self, st->o.heartbeat_interval, beat_atom::value);
      },
      [=](quiet_atom) { self->state.silent = true; },
      // As a node agent does: a worker the head fenced is killed.
      [=](fence_atom, const std::string& worker) -> caf::result<void> {
        if (!st->o.nodes_kill_fenced) return caf::sec::unexpected_message;
        std::lock_guard<std::mutex> l(st->mu);
        if (auto it = st->members.find(worker); it != st->members.end()) {
          st->gone.insert(worker);  // a later rejoin does not wait for it
          caf::anon_send_exit(it->second, caf::exit_reason::kill);
        }
        return caf::unit;
      },
      [=](heartbeat_sync_atom) { self->state.full = true; },
      // A spawn is answered with the member itself: the head places, records and monitors it as
      // it would a new actor, and nothing outlives the member.
      [=](spawn_atom, const std::string&, const caf::message&, const std::string&,
          uint64_t) -> caf::actor {
        ++st->spawns;
        return caf::actor_cast<caf::actor>(self);
      },
  };
}

// Sends (join_atom, head) to `ids` and waits until each was answered; "" or the first error.
std::string JoinAll(const StatePtr& st, const std::vector<std::string>& ids) {
  std::unique_lock<std::mutex> l(st->mu);
  st->answered = 0;
  int expected = 0;
  for (const std::string& id : ids) {
    if (st->gone.count(id)) continue;
    caf::anon_send(st->members.at(id), join_atom::value, st->head);
    ++expected;
  }
  const bool done = st->cv.wait_for(l, st->o.join_timeout,
                                    [&] { return st->answered >= expected || !st->error.empty(); });
  if (!st->error.empty()) return st->error;
  return done ? "" : absl::StrCat(expected - st->answered, " members not answered");
}

caf::behavior Subscriber(caf::event_based_actor* self, StatePtr st) {
  self->set_default_handler(caf::drop);
  return {
      [st](membership_atom, const MembershipEvent& e) {
        if (e.kind != MembershipKind::kWorkerDown && e.kind != MembershipKind::kNodeDead) return;
        std::lock_guard<std::mutex> l(st->mu);
        st->deaths_seen.emplace(e.subject, NowNs());
      },
  };
}

// Watches the head; once it is lost, reaches a head at the same address again (the store's
// restart, or a standby there) and has every member register with it: nodes, then workers.
void Watch(const StatePtr& st) {
  caf::scoped_actor self{st->runtime->system()};
  while (!st->stop) {
    caf::actor head;
    {
      std::lock_guard<std::mutex> l(st->mu);
      head = st->head;
    }
    self->monitor(head);
    bool down = false;
    while (!down && !st->stop) {
      self->receive([&](caf::down_msg&) { down = true; },
                    caf::after(std::chrono::milliseconds(200)) >> [] {});
    }
    if (st->stop) return;
    st->head_lost = true;
    absl::StatusOr<caf::actor> again;
    while (!st->stop) {
      again = Connect(*st->runtime, st->o.head_host, st->o.head_port, std::chrono::seconds(1));
      if (again.ok()) break;
    }
    if (st->stop) return;
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->head = *again;
    }
    std::string e = JoinAll(st, st->nodes);
    if (e.empty()) e = JoinAll(st, st->workers);
    caf::anon_send(*again, subscribe_atom::value, st->subscriber);
    std::lock_guard<std::mutex> l(st->mu);
    if (!e.empty() && st->error.empty()) st->error = e;
    st->joined = NowNs();
    st->head_lost = false;
    st->cv.notify_all();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<SimCluster>> SimCluster::Start(SimClusterOptions o) {
  auto st = std::make_shared<State>();
  st->o = std::move(o);
  RuntimeOptions ro;
  ro.network = true;
  auto runtime = Runtime::Create(ActorRegistry(), ro);
  if (!runtime.ok()) return runtime.status();
  st->runtime = std::move(*runtime);
  auto head = Connect(*st->runtime, st->o.head_host, st->o.head_port, std::chrono::seconds(30));
  if (!head.ok()) return head.status();
  st->head = *head;
  caf::actor_system& sys = st->runtime->system();
  st->subscriber = sys.spawn(Subscriber, st);
  caf::anon_send(st->head, subscribe_atom::value, st->subscriber);
  for (int i = st->o.first_node; i < st->o.first_node + st->o.nodes; ++i) {
    const std::string node = absl::StrCat(st->o.prefix, i);
    st->nodes.push_back(node);
    st->members[node] = sys.spawn(Member, st, node, std::string());
    for (int j = 0; j < st->o.workers_per_node; ++j) {
      const std::string w = absl::StrCat(node, "/w", j);
      st->workers.push_back(w);
      st->members[w] = sys.spawn(Member, st, w, node);
    }
  }
  std::unique_ptr<SimCluster> c(new SimCluster());
  c->st_ = st;
  st->started = NowNs();
  std::string e = JoinAll(st, st->nodes);
  if (e.empty()) e = JoinAll(st, st->workers);
  if (!e.empty()) return absl::UnavailableError(absl::StrCat("sim cluster: ", e));
  st->joined = NowNs();
  st->watcher = std::thread([st] { Watch(st); });
  return c;
}

SimCluster::~SimCluster() {
  st_->stop = true;
  if (st_->watcher.joinable()) st_->watcher.join();
  for (const auto& [id, m] : st_->members) caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(st_->subscriber, caf::exit_reason::user_shutdown);
  {
    std::lock_guard<std::mutex> l(st_->mu);
    st_->members.clear();
  }
  st_->runtime.reset();
}

int64_t SimCluster::started_ns() const { return st_->started; }
int64_t SimCluster::joined_ns() const {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->joined;
}
std::vector<std::string> SimCluster::member_ids() const {
  std::vector<std::string> out = st_->nodes;
  out.insert(out.end(), st_->workers.begin(), st_->workers.end());
  return out;
}

int64_t SimCluster::Exit(const std::string& id) {
  {
    std::lock_guard<std::mutex> l(st_->mu);
    st_->gone.insert(id);
  }
  const int64_t t = NowNs();
  caf::anon_send_exit(st_->members.at(id), caf::exit_reason::kill);
  return t;
}

int64_t SimCluster::Silence(const std::string& id) {
  {
    std::lock_guard<std::mutex> l(st_->mu);
    st_->gone.insert(id);
  }
  const int64_t t = NowNs();
  caf::anon_send(st_->members.at(id), quiet_atom::value);
  return t;
}

std::optional<int64_t> SimCluster::DeathSeen(const std::string& id) const {
  std::lock_guard<std::mutex> l(st_->mu);
  auto it = st_->deaths_seen.find(id);
  if (it == st_->deaths_seen.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<int64_t> SimCluster::AwaitRejoined(int64_t since_ns, std::chrono::seconds timeout) {
  std::unique_lock<std::mutex> l(st_->mu);
  const bool done = st_->cv.wait_for(l, timeout, [&] {
    return !st_->error.empty() || (st_->joined > since_ns && !st_->head_lost);
  });
  if (!st_->error.empty()) return absl::UnavailableError(st_->error);
  if (!done) return absl::DeadlineExceededError("the members did not all rejoin");
  return st_->joined;
}

int64_t SimCluster::spawns_served() const { return st_->spawns.load(); }

}  // namespace troupe::runtime::testing
