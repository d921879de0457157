// MembershipCore under random event sequences (fixed seed): its invariants hold after every
// event, and every (member phase × event) pair of the diagram in membership_core.h is exercised.
//   - a member is declared dead (worker_down, node_dead) at most once per incarnation, and a
//     worker's late exit status (worker_exit) only after that, at most once;
//   - generations only grow: a bumped publish raises the generation by exactly one, any other
//     carries the current one;
//   - a worker once fenced or declared dead is never published alive again;
//   - an alive or draining worker's node is alive or draining; a fence names a dead worker of a
//     node that is not dead yet.
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "membership_core.h"

namespace troupe::runtime {
namespace {

using std::chrono::milliseconds;

enum class Ev { kHello, kJoin, kHeartbeat, kExit, kFlush, kDown, kDrain, kRelease, kLeave, kTick };
const char* EvName(Ev e) {
  constexpr const char* kNames[] = {"hello", "join",  "heartbeat", "exit",  "flush",
                                    "down",  "drain", "release",   "leave", "tick"};
  return kNames[static_cast<int>(e)];
}

const std::vector<std::string> kNodes = {"n0", "n1", "n2"};
const std::vector<std::string> kWorkers = {"n0/w0", "n0/w1", "n1/w0", "n2/w0", "n2/w1"};

using Pair = std::tuple<MemberKind, MemberPhase, Ev>;

// Every (phase × event) pair the diagram allows: a node is never down-pending or dead-exited, a
// worker never draining or asked to rejoin (no peer drains or releases a worker), and a tick
// concerns members only.
std::set<Pair> Expected() {
  std::set<Pair> out;
  for (MemberPhase p : {MemberPhase::kAbsent, MemberPhase::kAlive, MemberPhase::kDraining,
                        MemberPhase::kDead, MemberPhase::kDeadRejoining}) {
    for (Ev e :
         {Ev::kJoin, Ev::kHeartbeat, Ev::kDown, Ev::kDrain, Ev::kRelease, Ev::kLeave, Ev::kTick}) {
      if (!(p == MemberPhase::kAbsent && e == Ev::kTick)) out.insert({MemberKind::kNode, p, e});
    }
  }
  for (MemberPhase p : {MemberPhase::kAbsent, MemberPhase::kAlive, MemberPhase::kDownPending,
                        MemberPhase::kDead, MemberPhase::kDeadExited}) {
    for (Ev e : {Ev::kJoin, Ev::kHeartbeat, Ev::kExit, Ev::kFlush, Ev::kDown, Ev::kTick}) {
      if (!(p == MemberPhase::kAbsent && e == Ev::kTick)) out.insert({MemberKind::kWorker, p, e});
    }
  }
  return out;
}

// What the checker remembers across one sequence.
struct History {
  uint64_t generation = 0;
  std::map<std::string, int> deaths;        // declared dead in the current incarnation
  std::map<std::string, int> exits;         // worker_exit in the current incarnation
  std::set<std::string> never_alive_again;  // workers fenced or declared dead (or restored dead)
};

class Checker {
 public:
  explicit Checker(History* h) : h_(h) {}

  // After every event: its actions, then the table.
  void Check(const MembershipCore& core, const std::vector<MembershipAction>& actions,
             const std::string& where) {
    for (const MembershipAction& a : actions) CheckAction(core, a, where);
    EXPECT_EQ(core.generation(), h_->generation) << where;
    core.ForEachMember([&](const MemberInfo& m) {
      if (m.kind != MemberKind::kWorker || m.state == MemberState::kDead) return;
      const MemberInfo* node = core.Find(m.node);
      ASSERT_NE(node, nullptr) << where << ": " << m.id;
      EXPECT_NE(node->state, MemberState::kDead) << where << ": alive worker " << m.id;
    });
  }

 private:
  void CheckAction(const MembershipCore& core, const MembershipAction& a,
                   const std::string& where) {
    const std::string at = where + ": " + DebugString(a);
    if (a.kind == MembershipAction::Kind::kFence) {
      h_->never_alive_again.insert(a.member);
      EXPECT_NE(core.Phase(a.member), MemberPhase::kAlive) << at << " fences a live worker";
      return;
    }
    if (a.kind != MembershipAction::Kind::kPublish) return;
    const MembershipEvent& e = a.event;
    if (a.bump) {
      EXPECT_EQ(e.generation, h_->generation + 1) << at;
      ASSERT_TRUE(a.record.has_value()) << at;
      EXPECT_EQ(a.record->id, e.subject) << at;
    } else {
      EXPECT_EQ(e.generation, h_->generation) << at;
    }
    h_->generation = e.generation;
    switch (e.kind) {
      case MembershipKind::kNodeAlive:
      case MembershipKind::kWorkerAlive:
        EXPECT_EQ(h_->never_alive_again.count(e.subject), 0u) << at << ": published alive again";
        EXPECT_EQ(a.record->state, MemberState::kAlive) << at;
        h_->deaths[e.subject] = 0;
        h_->exits[e.subject] = 0;
        break;
      case MembershipKind::kWorkerDown:
      case MembershipKind::kNodeDead:
        EXPECT_EQ(++h_->deaths[e.subject], 1) << at << ": declared dead twice";
        EXPECT_EQ(a.record->state, MemberState::kDead) << at;
        if (e.kind == MembershipKind::kWorkerDown) h_->never_alive_again.insert(e.subject);
        break;
      case MembershipKind::kWorkerExit:
        EXPECT_EQ(h_->deaths[e.subject], 1) << at << ": an exit before the death";
        EXPECT_EQ(++h_->exits[e.subject], 1) << at << ": a second exit";
        break;
      case MembershipKind::kNodeDraining:
        EXPECT_EQ(a.record->state, MemberState::kDraining) << at;
        break;
      case MembershipKind::kActorHung:
      case MembershipKind::kRefused:
        EXPECT_FALSE(a.bump) << at;
        break;
    }
  }

  History* h_;
};

class Driver {
 public:
  Driver(uint64_t seed, std::set<Pair>* hit) : rng_(seed), hit_(hit) {}

  void RunSequence(int sequence) {
    MembershipCore::Options o;
    o.heartbeat_interval = milliseconds(100);
    o.heartbeat_timeout = milliseconds(1000);
    o.hung_timeout = milliseconds(500);
    o.protocol_version = 8;
    o.build_id = "b";
    MembershipCore core(o);
    History history;
    Checker checker(&history);
    if (Draw(4) == 0) Restore(&core, &history);
    now_ = TimePoint{} + std::chrono::hours(1);
    const int events = 20 + static_cast<int>(Draw(60));
    for (int i = 0; i < events; ++i) {
      now_ += milliseconds(Draw(60));
      std::string where;
      std::vector<MembershipAction> actions = Step(&core, &where);
      checker.Check(
          core, actions,
          "sequence " + std::to_string(sequence) + " event " + std::to_string(i) + " " + where);
      if (::testing::Test::HasFailure()) return;
    }
  }

 private:
  uint64_t Draw(uint64_t n) { return rng_() % n; }
  const std::string& Pick(const std::vector<std::string>& v) { return v[Draw(v.size())]; }

  void Restore(MembershipCore* core, History* h) {
    h->generation = 10 + Draw(100);
    std::vector<MemberInfo> members;
    for (const std::string& w : kWorkers) {
      if (Draw(3) != 0) continue;
      MemberInfo m;
      m.id = w;
      m.kind = MemberKind::kWorker;
      m.node = w.substr(0, 2);
      m.state = Draw(2) ? MemberState::kDead : MemberState::kAlive;
      if (m.state == MemberState::kDead) h->never_alive_again.insert(w);
      members.push_back(m);
    }
    core->Restore(h->generation, members);
  }

  void Hit(const MembershipCore& core, const std::string& id, Ev e) {
    const MemberKind kind =
        id.find('/') == std::string::npos ? MemberKind::kNode : MemberKind::kWorker;
    hit_->insert({kind, core.Phase(id), e});
  }

  // Full ones, deltas that chain and deltas that do not (a head that missed a beat).
  Heartbeat Beats() {
    Heartbeat out{Draw(2) ? 0 : Draw(4), Draw(4), {}};
    for (const char* a : {"a", "b"}) {
      if (Draw(2))
        out.changes.push_back(ActorBusy{a, Draw(100), Draw(3) == 0 ? 500 + Draw(500) : 0});
    }
    return out;
  }

  int32_t WaitStatus() {
    switch (Draw(3)) {
      case 0:
        return static_cast<int32_t>(Draw(4) << 8);  // exited
      case 1:
        return SIGKILL;
      default:
        return SIGTERM;
    }
  }

  std::vector<MembershipAction> Step(MembershipCore* core, std::string* where) {
    const Ev ev = static_cast<Ev>(Draw(10));
    const bool worker = Draw(2) == 1;
    const std::string& id = Pick(worker ? kWorkers : kNodes);
    *where = std::string(EvName(ev)) + " " + id;
    if (ev == Ev::kTick) {
      // Mostly on time; sometimes a stall just over two intervals, sometimes one of seconds.
      const uint64_t kind = Draw(10);
      now_ += milliseconds(kind < 6 ? 25 : kind < 8 ? 150 + Draw(100) : 1000 + Draw(1500));
      for (const auto& n : kNodes) {
        if (core->Phase(n) != MemberPhase::kAbsent) Hit(*core, n, Ev::kTick);
      }
      for (const auto& w : kWorkers) {
        if (core->Phase(w) != MemberPhase::kAbsent) Hit(*core, w, Ev::kTick);
      }
      return core->OnTick(now_);
    }
    if (ev == Ev::kHello) {
      return core->OnHello(Draw(4) ? 8 : 7, Draw(4) ? "b" : "other", worker ? "worker" : "node",
                           id);
    }
    // Events a peer sends about a worker or about a node only; others become a heartbeat.
    Ev target = ev;
    if (worker && (ev == Ev::kDrain || ev == Ev::kRelease || ev == Ev::kLeave)) {
      target = Ev::kHeartbeat;
    }
    if (!worker && (ev == Ev::kExit || ev == Ev::kFlush)) target = Ev::kHeartbeat;
    Hit(*core, id, target);
    return Apply(core, target, id, worker);
  }

  std::vector<MembershipAction> Apply(MembershipCore* core, Ev ev, const std::string& id,
                                      bool worker) {
    switch (ev) {
      case Ev::kJoin:
        if (worker) {
          MemberInfo w;
          w.id = id;
          w.node = id.substr(0, 2);
          w.pid = static_cast<int64_t>(1000 + Draw(1000));
          return core->OnRegisterWorker(w, now_);
        }
        if (!core->CheckNodeJoin(id).ok()) return {};
        {
          MemberInfo n;
          n.id = id;
          n.resources = "cpu=1";
          return core->OnNodeJoined(n, now_);
        }
      case Ev::kHeartbeat:
        return core->OnHeartbeat(id, Beats(), now_);
      case Ev::kExit:
        return core->OnWorkerExit(id, Draw(2) ? "tail" : "", WaitStatus(), Draw(4) == 0);
      case Ev::kFlush:
        return core->OnFlush(id);
      case Ev::kDown:
        return core->OnConnectionLost(id, "remote_link_unreachable");
      case Ev::kDrain:
        return core->OnDrain(id, 1000, "SIGTERM");
      case Ev::kRelease:
        return core->OnRelease(id);
      case Ev::kLeave:
        return core->OnLeave(id);
      case Ev::kHello:
      case Ev::kTick:
        break;
    }
    return {};
  }

  std::mt19937_64 rng_;
  std::set<Pair>* hit_;
  TimePoint now_{};
};

TEST(MembershipCoreProperty, InvariantsHoldAfterEveryEventOfRandomSequences) {
  constexpr int kSequences = 2000;
  std::set<Pair> hit;
  Driver driver(/*seed=*/40, &hit);
  for (int s = 0; s < kSequences && !::testing::Test::HasFailure(); ++s) driver.RunSequence(s);
  for (const Pair& p : Expected()) {
    EXPECT_EQ(hit.count(p), 1u) << "never hit: " << Name(std::get<0>(p)) << " "
                                << Name(std::get<1>(p)) << " × " << EvName(std::get<2>(p));
  }
  for (const Pair& p : hit) {
    EXPECT_EQ(Expected().count(p), 1u)
        << "a phase the diagram does not allow: " << Name(std::get<0>(p)) << " "
        << Name(std::get<1>(p)) << " × " << EvName(std::get<2>(p));
  }
}

}  // namespace
}  // namespace troupe::runtime
