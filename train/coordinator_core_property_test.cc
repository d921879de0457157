// CoordinatorCore under random event sequences: a simulated cluster (ranks that reply, die, drain
// and join; a head table; timers on a fake clock; coordinator restarts from the saved record)
// drives the core with faults and stale or duplicate events injected at random, and checks the
// protocol's invariants after every event:
//   safety   — each step committed once (between rollbacks to a checkpoint); no generation plan
//              holds a worker the core was told is dead; generations only grow; a fault fires at
//              most once, across coordinator restarts; every saved record reads back from its
//              file encoding unchanged;
//   liveness — with no further injected faults and survivors >= min_workers, the job finishes
//              (every remaining step commits) within bounded fake time.
// It counts every (phase, event) pair and asserts each was hit at least 10 times.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/coordinator_record.h"
#include "troupe/train/preempted.h"

namespace troupe::train {
namespace {

using Kind = CoordinatorAction::Kind;
using Actions = std::vector<CoordinatorAction>;
using std::chrono::milliseconds;

enum EventType {
  kEvMembershipKnown,
  kEvJoin,
  kEvJoinFailed,
  kEvWorkerDown,
  kEvNodeDraining,
  kEvNodeDead,
  kEvTable,
  kEvConfigured,
  kEvStepped,
  kEvShardWritten,
  kEvCheckpointCommitted,
  kEvFinal,
  kEvTimer,
  kNumEventTypes,
};
constexpr int kNumPhases = 8;
const char* kEventNames[] = {"membership_known",
                             "join",
                             "join_failed",
                             "worker_down",
                             "node_draining",
                             "node_dead",
                             "table",
                             "configured",
                             "stepped",
                             "shard_written",
                             "checkpoint_committed",
                             "final",
                             "timer"};

struct Coverage {
  int64_t hits[kNumPhases][kNumEventTypes] = {};
  std::map<std::string, int64_t> faults_carried_out;  // by action, over all sequences
};

class Sim {
 public:
  Sim(uint64_t seed, Coverage* coverage) : rng_(seed), coverage_(coverage) {
    steps_ = Pick(2, 7);
    min_workers_ = Pick(1, 2);
    max_world_ = Pick(2, 5);
    checkpoint_every_ = Pick(0, 3);
    notice_window_ = milliseconds(Chance(0.5) ? 0 : 200);
    const int workers = Pick(min_workers_, 5);
    for (int i = 0; i < workers; ++i) AddWorker();
    const FaultKind kinds[] = {FaultKind::kKillWorker,        FaultKind::kStopWorker,
                               FaultKind::kKillShardAndBuddy, FaultKind::kSigtermNode,
                               FaultKind::kJoinWorker,        FaultKind::kKillCoordinator,
                               FaultKind::kCrashInCheckpoint, FaultKind::kPartitionNode,
                               FaultKind::kDropNode,          FaultKind::kStallCoordinator,
                               FaultKind::kSigtermNode};  // twice: hand-overs are many-phased
    std::set<int64_t> steps_used;
    for (int n = Pick(0, 3); n > 0; --n) {
      Fault f;
      f.kind = kinds[Pick(0, static_cast<int>(std::size(kinds)) - 1)];
      f.step = Pick(0, static_cast<int>(steps_) - 1);
      if (!steps_used.insert(f.step).second) continue;  // one fault per step
      faults_.push_back(f);
    }
    started_ = true;
    StartCoordinator(/*restart=*/false);
  }

  // Random phase, then the liveness phase. Returns "" or what went wrong.
  std::string Run() {
    const int random_events = Pick(20, 300);
    for (int i = 0; i < random_events && !finished_ && error_.empty(); ++i) RandomStep();
    if (!error_.empty()) return error_;
    if (!finished_) {
      injecting_ = false;
      const CoreTime start = now_;
      for (int i = 0; i < 200000 && !finished_ && error_.empty(); ++i) {
        if (now_ - start > std::chrono::minutes(30)) {
          return absl::StrCat("liveness: not finished after 30 min of fake time; ",
                              core_->DebugString());
        }
        if (!LivenessStep()) return absl::StrCat("liveness: stuck; ", core_->DebugString());
      }
      if (!finished_ && error_.empty()) return "liveness: not finished";
    }
    // Events after the end change nothing (and cover the done phase).
    for (int i = 0; i < 8 && error_.empty(); ++i) Inject();
    return error_;
  }

 private:
  struct Worker {
    std::string node;
    bool alive = true;
  };

  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  std::string AddWorker() {
    const std::string w = absl::StrCat("w", next_worker_);
    // The first workers two per node; later joiners on nodes of their own (a dead node stays
    // dead).
    workers_[w] =
        Worker{started_ ? absl::StrCat("j", next_worker_) : absl::StrCat("n", next_worker_ / 2)};
    ++next_worker_;
    return w;
  }
  // Alive workers on nodes without a notice: those a generation can count on.
  int AliveCount() const {
    int n = 0;
    for (const auto& [w, s] : workers_) n += s.alive && !draining_.count(s.node) ? 1 : 0;
    return n;
  }
  std::vector<std::string> Alive() const {
    std::vector<std::string> v;
    for (const auto& [w, s] : workers_) {
      if (s.alive) v.push_back(w);
    }
    return v;
  }
  std::vector<std::string> TableDead() const {
    std::vector<std::string> v;
    for (const auto& [w, s] : workers_) {
      if (!s.alive) v.push_back(w);
    }
    return v;
  }

  // Delivers one event to the core: coverage, then the actions, then the invariants.
  void Deliver(EventType type, const std::function<Actions()>& event) {
    coverage_->hits[static_cast<int>(core_->phase())][type]++;
    const uint64_t gen_before = core_->generation();
    const std::string before = core_->DebugString();
    Actions out = event();
    if (trace_) {
      std::string s;
      for (const auto& a : out) absl::StrAppend(&s, " ", DebugString(a));
      std::fprintf(stderr, "%s @ %s ->%s\n", kEventNames[type], before.c_str(), s.c_str());
    }
    Execute(out);
    if (core_->generation() < gen_before) {
      Fail(absl::StrCat("generation went back from ", gen_before, " to ", core_->generation()));
    }
  }
  void Fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat(what, " [", core_->DebugString(), "]");
  }

  void StartCoordinator(bool restart) {
    CoordinatorCore::Options o;
    o.steps = steps_;
    o.min_workers = min_workers_;
    o.max_world = max_world_;
    o.checkpoint_every = checkpoint_every_;
    o.num_params = 4 * 65536;
    o.faults = faults_;
    o.latest_checkpoint = [this] { return store_latest_; };
    o.notice_window = notice_window_;
    // The watchdog fires only when nothing else can happen (then the job is stuck: a failure).
    o.watchdog = std::chrono::hours(10);
    core_ = std::make_unique<CoordinatorCore>(std::move(o));
    queue_.clear();
    timers_.clear();
    if (restart) core_->Restore(saved_, now_);
    // Half the sequences say where the coordinator runs: a notice there moves it (kMoveSelf),
    // and the next incarnation runs on a node with no notice.
    if (Chance(0.5)) {
      for (const auto& [w, s] : workers_) {
        if (s.alive && !draining_.count(s.node)) {
          core_->SetOwnNode(s.node);
          break;
        }
      }
    }
    for (const std::string& node : draining_) {
      Deliver(kEvNodeDraining, [&] { return core_->OnNodeDraining(node, "draining", now_); });
    }
    // The driver announces the ranks it knows (live ones), then forwards their joins; the
    // table read is as of now.
    const std::vector<std::string> alive = Alive();
    const std::vector<std::string> dead = TableDead();
    for (const std::string& w : dead) told_dead_.insert(w);
    Deliver(kEvMembershipKnown, [&] { return core_->OnMembershipKnown(alive.size(), dead, now_); });
    for (const std::string& w : alive) {
      const std::string node = workers_[w].node;
      queue_.push_back({kEvJoin, [this, w, node] { return core_->OnJoin(w, node, now_); }});
    }
  }

  void Execute(const Actions& actions) {
    for (const CoordinatorAction& a : actions) {
      if (crashed_) break;
      Do(a);
    }
    if (crashed_) {
      crashed_ = false;
      StartCoordinator(/*restart=*/true);
    }
  }

  void CountFault(const std::string& key, int allowed) {
    ++coverage_->faults_carried_out[key.substr(0, key.find_first_of("@0123456789"))];
    if (++fault_runs_[key] > allowed) Fail(absl::StrCat("fault ", key, " carried out twice"));
  }
  const Fault* FaultAt(int64_t step) const {
    for (const Fault& f : faults_) {
      if (f.step == step) return &f;
    }
    return nullptr;
  }

  void Do(const CoordinatorAction& a) {
    switch (a.kind) {
      case Kind::kSaveRecord: {
        // What is saved is what a restart reads back (the file's encoding and its checks).
        absl::StatusOr<CoordinatorRecord> back =
            DecodeCoordinatorRecord(EncodeCoordinatorRecord(a.record), "coordinator.state");
        if (!back.ok() || !(*back == a.record)) {
          Fail(absl::StrCat("a saved record does not read back: ",
                            back.ok() ? "different fields" : back.status().ToString()));
        }
        saved_ = a.record;
        break;
      }
      case Kind::kAbort:
        break;
      case Kind::kConfigure: {
        if (told_dead_.count(a.worker)) {
          Fail(absl::StrCat("generation ", a.generation, " plans ", a.worker,
                            ", which the core was told is dead"));
        }
        if (a.generation < max_planned_) Fail("a plan for an older generation");
        // A memory restore reads the committed configuration the record names: this worker's
        // old rank (if any) maps to its new one, and the mirrors sit where its offset says.
        if (a.plan.source == RestoreSource::kMemory) {
          const std::vector<std::string>& old = saved_.active;
          bool consistent = a.plan.old_world == static_cast<int>(old.size()) &&
                            a.plan.old_buddy == saved_.buddy &&
                            MemoryRestorePossible(a.plan.old_world, a.plan.gone, a.plan.old_buddy);
          for (size_t o = 0; consistent && o < old.size(); ++o) {
            consistent =
                (old[o] == a.worker) == (NewRank(a.plan.gone, static_cast<int>(o)) == a.plan.rank);
          }
          if (!consistent)
            Fail(absl::StrCat("memory plan of ", a.worker, " does not match the record"));
        }
        max_planned_ = a.generation;
        rank_[a.worker] = {a.plan.rank, a.plan.world};
        // Rollback: steps after the restored one may be committed again.
        for (auto it = committed_.upper_bound(a.plan.committed_steps); it != committed_.end();) {
          it = committed_.erase(it);
        }
        Reply(a.worker, kEvConfigured, [this, a] {
          return core_->OnConfigured(a.generation, a.worker, absl::OkStatus(), now_);
        });
        break;
      }
      case Kind::kStep:
        Reply(a.worker, kEvStepped, [this, a] {
          return core_->OnStepped(a.generation, a.step, a.worker, absl::OkStatus(),
                                  {{rank_[a.worker].first, 1.5}}, now_);
        });
        break;
      case Kind::kCommit: {
        if (a.step < 0) break;
        const auto [r, world] = rank_[a.worker];
        const ShardLayout l = ShardLayout::Make(4 * 65536, world);
        if (l.end(r) <= l.begin(r)) break;
        ShardFileInfo info{absl::StrCat("shard-", r), l.begin(r), l.end(r), 1, 1};
        const bool ok = a.step >= steps_ || !Chance(0.05);  // a full disk, now and then
        Reply(a.worker, kEvShardWritten, [this, a, r, info, ok] {
          return core_->OnShardWritten(
              a.generation, a.step, r, info,
              ok ? absl::OkStatus() : absl::ResourceExhaustedError("disk full"), now_);
        });
        break;
      }
      case Kind::kCheckpoint:
        store_latest_ = std::max(store_latest_.value_or(-1), a.step);
        Deliver(kEvCheckpointCommitted,
                [this, a] { return core_->OnCheckpointCommitted(a.step, absl::OkStatus(), now_); });
        break;
      case Kind::kFinal:
        Reply(a.worker, kEvFinal, [this, a] {
          return core_->OnFinal(a.generation, 1234, 4 * 65536, core_->committed(), now_);
        });
        break;
      case Kind::kReadTable: {
        const std::vector<std::string> dead = TableDead();
        queue_.push_back({kEvTable, [this, a, dead] {
                            for (const std::string& w : dead) told_dead_.insert(w);
                            return core_->OnTable(a.generation, dead, now_);
                          }});
        break;
      }
      case Kind::kTimer:
        timers_[a.timer] = now_ + a.delay;
        break;
      case Kind::kKillWorker: {
        const Fault* f = FaultAt(a.step);
        CountFault(absl::StrCat("kill@", a.step),
                   f && f->kind == FaultKind::kKillShardAndBuddy ? 2 : 1);
        Kill(a.worker);
        break;
      }
      case Kind::kNodeFault: {
        const std::string node = workers_[a.worker].node;
        if (a.fault == FaultKind::kDropNode) {  // lost packets: TCP retransmits, nothing fails
          CountFault(absl::StrCat("drop@", core_->committed()), 1);
          break;
        }
        if (a.fault == FaultKind::kSigtermNode) {
          CountFault(absl::StrCat("drain@", core_->committed()), 1);
          draining_.insert(node);
          queue_.push_back({kEvNodeDraining,
                            [this, node] { return core_->OnNodeDraining(node, "SIGTERM", now_); }});
        } else {  // a partition: the head fences the node's workers for missed heartbeats
          CountFault(absl::StrCat("partition@", core_->committed()), 1);
        }
        for (auto& [w, s] : workers_) {
          if (s.node == node && s.alive) Leave(w);  // a drained one leaves after its grace period
        }
        break;
      }
      case Kind::kAddNode: {
        CountFault(a.text, 1);
        const std::string w = AddWorker();
        const std::string node = workers_[w].node;
        queue_.push_back({kEvJoin, [this, w, node] { return core_->OnJoin(w, node, now_); }});
        break;
      }
      case Kind::kReleaseNode:
        // Nothing of the job may be left on it: no rank of the generation just configured.
        for (const std::string& w : core_->group()) {
          if (workers_[w].node == a.text)
            Fail(absl::StrCat("released node ", a.text, " holds ", w));
        }
        ++coverage_->faults_carried_out["release"];
        for (auto& [w, s] : workers_) {
          if (s.node == a.text && s.alive) Kill(w);  // it leaves now
        }
        break;
      case Kind::kReleaseRank:
        // Given up for another job: out of the generation just configured.
        for (const std::string& w : core_->group()) {
          if (w == a.worker) Fail(absl::StrCat("released rank ", a.worker, " is in the group"));
        }
        break;
      case Kind::kEvict:
        // Alive but given up for good: its process ends itself.
        Kill(a.worker);
        break;
      case Kind::kMoveSelf:
        CountFault(absl::StrCat("move@", core_->committed(), "#", moves_++), 1);
        crashed_ = true;  // the supervisor restarts it elsewhere, from its record
        break;
      case Kind::kCrashSelf: {
        const Fault* f = FaultAt(core_->committed());
        if (!f || f->kind != FaultKind::kKillCoordinator) Fail("crash_self without its fault");
        CountFault(absl::StrCat("crash@", core_->committed()), 1);
        crashed_ = true;
        break;
      }
      case Kind::kStallSelf: {
        const Fault* f = FaultAt(core_->committed());
        if (!f || f->kind != FaultKind::kStallCoordinator) Fail("stall_self without its fault");
        CountFault(absl::StrCat("stall@", core_->committed()), 1);
        break;
      }
      case Kind::kArmCrash:
        CountFault("arm_crash", static_cast<int>(std::count_if(
                                    faults_.begin(), faults_.end(), [](const Fault& f) {
                                      return f.kind == FaultKind::kCrashInCheckpoint;
                                    })));
        crashed_ = true;  // dies inside the checkpoint's commit: the manifest is not published
        break;
      case Kind::kCommitted:
        if (!committed_.insert(a.step).second) {
          Fail(absl::StrCat("step ", a.step, " committed twice"));
        }
        break;
      case Kind::kEvent:
        break;
      case Kind::kFinish:
        if (core_->committed() != steps_) Fail("finished before the last step");
        finished_ = true;
        break;
      case Kind::kFail:
        // Every worker it had got a notice: it stops, saying whether the committed step is on
        // disk — truly.
        if (IsPreempted(a.status)) {
          const bool saved = store_latest_ && *store_latest_ >= core_->committed();
          if (saved != absl::StrContains(a.status.message(), "holds every committed step")) {
            Fail(absl::StrCat("a preemption misreports its checkpoint: ", a.status.ToString()));
          }
          ++coverage_->faults_carried_out["preempted"];
          finished_ = true;
          break;
        }
        Fail(absl::StrCat("the job failed: ", a.status.ToString()));
        break;
    }
  }

  // A reply from `worker`'s rank, if its process lives.
  void Reply(const std::string& worker, EventType type, std::function<Actions()> f) {
    if (workers_[worker].alive) queue_.push_back({type, std::move(f)});
  }

  // A drained worker leaves when its grace period ends: at once (a short one), or at some later
  // point of the queue — still answering until then, so a hand-over can finish.
  void Leave(const std::string& w) {
    if (Chance(0.5)) return Kill(w);
    queue_.push_back({kEvWorkerDown, [this, w] {
                        if (!workers_[w].alive) return Actions{};
                        workers_[w].alive = false;
                        told_dead_.insert(w);
                        return core_->OnWorkerDown(w, "left after its grace period", now_);
                      }});
  }

  void Kill(const std::string& w) {
    if (!workers_[w].alive) return;
    workers_[w].alive = false;
    queue_.push_back({kEvWorkerDown, [this, w] {
                        told_dead_.insert(w);
                        return core_->OnWorkerDown(w, "killed", now_);
                      }});
  }

  // Fires the earliest timer due within `horizon` (the fake clock jumps to it).
  bool FireEarliestTimer(CoreDuration horizon = std::chrono::hours(1000)) {
    if (timers_.empty()) return false;
    auto it = std::min_element(timers_.begin(), timers_.end(),
                               [](const auto& x, const auto& y) { return x.second < y.second; });
    if (it->second > now_ + horizon) return false;
    const uint64_t id = it->first;
    now_ = std::max(now_, it->second);
    timers_.erase(it);
    Deliver(kEvTimer, [this, id] { return core_->OnTimer(id, now_); });
    return true;
  }

  void DeliverQueued(size_t i) {
    auto item = std::move(queue_[i]);
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
    now_ += milliseconds(Pick(0, 5));
    Deliver(item.first, item.second);
  }

  void RandomStep() {
    const int r = Pick(0, 99);
    if (r < 50 && !queue_.empty())
      return DeliverQueued(Pick(0, static_cast<int>(queue_.size()) - 1));
    // Not the watchdog while replies are on their way: it would call a healthy job stuck.
    if (r < 60 && FireEarliestTimer(std::chrono::minutes(2))) return;
    Inject();
  }

  // One random event: a fault, a joiner, or a stale or duplicate message.
  void Inject() {
    const EventType type = static_cast<EventType>(Pick(0, kNumEventTypes - 1));
    const uint64_t gen = core_->generation();
    const uint64_t some_gen = static_cast<uint64_t>(Pick(0, static_cast<int>(gen)));
    const std::vector<std::string> alive = Alive();
    const std::string any =
        alive.empty() ? "w0" : alive[Pick(0, static_cast<int>(alive.size()) - 1)];
    const bool can_lose = injecting_ && AliveCount() > min_workers_;
    switch (type) {
      case kEvMembershipKnown:
        return Deliver(type, [&] { return core_->OnMembershipKnown(alive.size(), {}, now_); });
      case kEvJoin: {
        const std::string w = Chance(0.5) && injecting_ ? AddWorker() : any;
        const std::string node = workers_[w].node;
        return Deliver(type, [&] { return core_->OnJoin(w, node, now_); });
      }
      case kEvJoinFailed:
        return Deliver(type, [&] { return core_->OnJoinFailed("ghost", "no such actor", now_); });
      case kEvWorkerDown:
        if (can_lose) Kill(any);
        return Deliver(type, [&] {
          told_dead_.insert(can_lose ? any : "ghost");
          return core_->OnWorkerDown(can_lose ? any : "ghost", "killed", now_);
        });
      case kEvNodeDraining: {
        const std::string node = workers_[any].node;
        bool whole_node_ok = can_lose;
        int on_node = 0;
        for (const auto& [w, s] : workers_) on_node += s.node == node && s.alive ? 1 : 0;
        whole_node_ok = whole_node_ok && AliveCount() - on_node >= min_workers_;
        if (!whole_node_ok)
          return Deliver(type, [&] { return core_->OnNodeDraining("nx", "x", now_); });
        for (auto& [w, s] : workers_) {
          if (s.node == node && s.alive) Leave(w);
        }
        draining_.insert(node);
        return Deliver(type, [&] { return core_->OnNodeDraining(node, "SIGTERM", now_); });
      }
      case kEvNodeDead: {
        const std::string node = workers_[any].node;
        int on_node = 0;
        for (const auto& [w, s] : workers_) on_node += s.node == node && s.alive ? 1 : 0;
        if (!(can_lose && AliveCount() - on_node >= min_workers_)) {
          return Deliver(type, [&] { return core_->OnNodeDead("nx", now_); });
        }
        for (auto& [w, s] : workers_) {
          if (s.node == node) {
            if (s.alive) Kill(w);
            told_dead_.insert(w);
          }
        }
        return Deliver(type, [&] { return core_->OnNodeDead(node, now_); });
      }
      case kEvTable: {
        const std::vector<std::string> dead = TableDead();
        for (const std::string& w : dead) told_dead_.insert(w);
        return Deliver(type, [&] { return core_->OnTable(some_gen, dead, now_); });
      }
      case kEvConfigured: {
        // A rank's configure failure (a bootstrap that timed out), or a stale success.
        const bool current = injecting_ && Chance(0.5);
        const absl::Status st =
            current ? absl::DeadlineExceededError("bootstrap") : absl::OkStatus();
        return Deliver(type, [&] {
          return core_->OnConfigured(current ? gen : gen - std::min<uint64_t>(gen, 1), any, st,
                                     now_);
        });
      }
      case kEvStepped: {
        const bool current = injecting_ && Chance(0.5);
        const absl::Status st = current ? absl::UnavailableError("peer gone") : absl::OkStatus();
        return Deliver(type, [&] {
          return core_->OnStepped(current ? gen : some_gen, core_->committed() - (current ? 0 : 1),
                                  any, st, {}, now_);
        });
      }
      case kEvShardWritten:
        return Deliver(type, [&] {
          return core_->OnShardWritten(gen + 1, core_->committed(), 0, {}, absl::OkStatus(), now_);
        });
      case kEvCheckpointCommitted:
        return Deliver(type,
                       [&] { return core_->OnCheckpointCommitted(-1, absl::OkStatus(), now_); });
      case kEvFinal:
        return Deliver(type, [&] { return core_->OnFinal(gen + 1, 1, 1, 1, now_); });
      case kEvTimer:
        return Deliver(type, [&] { return core_->OnTimer(999999, now_); });
      case kNumEventTypes:
        break;
    }
  }

  // Liveness: deliver in order, fire timers when nothing else can happen, keep min_workers.
  bool LivenessStep() {
    if (AliveCount() < min_workers_) {
      const std::string w = AddWorker();
      const std::string node = workers_[w].node;
      Deliver(kEvJoin, [&] { return core_->OnJoin(w, node, now_); });
      return true;
    }
    if (!queue_.empty()) {
      DeliverQueued(0);
      return true;
    }
    return FireEarliestTimer();
  }

  std::mt19937_64 rng_;
  Coverage* coverage_;
  int64_t steps_ = 1;
  int min_workers_ = 1, max_world_ = 1;
  int64_t checkpoint_every_ = 0;
  std::vector<Fault> faults_;
  std::map<std::string, Worker> workers_;
  int next_worker_ = 0;
  std::unique_ptr<CoordinatorCore> core_;
  CoordinatorRecord saved_;
  std::optional<int64_t> store_latest_;
  std::set<std::string> draining_;  // nodes that got a notice
  int moves_ = 0;
  CoreDuration notice_window_{0};
  std::deque<std::pair<EventType, std::function<Actions()>>> queue_;
  std::map<uint64_t, CoreTime> timers_;
  CoreTime now_{};
  std::map<std::string, std::pair<int, int>> rank_;  // worker → (rank, world) it was planned as
  std::set<std::string> told_dead_;
  std::set<int64_t> committed_;
  std::map<std::string, int> fault_runs_;
  uint64_t max_planned_ = 0;
  bool started_ = false;
  bool injecting_ = true;
  bool trace_ = std::getenv("TROUPE_SIM_TRACE") != nullptr;
  bool crashed_ = false;
  bool finished_ = false;
  std::string error_;
};

TEST(CoordinatorCorePropertyTest, InvariantsHoldOverThousandsOfRandomSequences) {
  Coverage coverage;
  constexpr int kSequences = 15000;
  const char* only = std::getenv("TROUPE_SIM_SEED");
  for (int seed = only ? std::atoi(only) : 1; seed <= (only ? std::atoi(only) : kSequences);
       ++seed) {
    Sim sim(static_cast<uint64_t>(seed), &coverage);
    const std::string error = sim.Run();
    ASSERT_EQ(error, "") << "sequence seed " << seed;
  }
  std::string missing;
  for (int p = 0; p < kNumPhases; ++p) {
    for (int e = 0; e < kNumEventTypes; ++e) {
      if (coverage.hits[p][e] < 10) {
        absl::StrAppend(&missing, PhaseName(static_cast<CoordinatorPhase>(p)), " x ",
                        kEventNames[e], ": ", coverage.hits[p][e], "\n");
      }
    }
  }
  EXPECT_EQ(missing, "") << "(phase x event) pairs hit fewer than 10 times";
  for (const char* kind : {"kill", "drain", "join", "crash", "arm_crash", "move", "release"}) {
    EXPECT_GE(coverage.faults_carried_out[kind], 50) << kind << " faults carried out";
  }
  EXPECT_GE(coverage.faults_carried_out["preempted"], 10) << "jobs stopped as preempted";
  std::string table;
  for (int p = 0; p < kNumPhases; ++p) {
    absl::StrAppend(&table, PhaseName(static_cast<CoordinatorPhase>(p)), ":");
    for (int e = 0; e < kNumEventTypes; ++e) absl::StrAppend(&table, " ", coverage.hits[p][e]);
    absl::StrAppend(&table, "\n");
  }
  std::printf("coverage (phase: hits per event %s ...)\n%s", kEventNames[0], table.c_str());
}

}  // namespace
}  // namespace troupe::train
