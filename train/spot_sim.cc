#include "troupe/train/spot_sim.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "toml_section.h"
#include "troupe/base/status_macros.h"
#include "troupe/scheduler/scheduler.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/preempted.h"

namespace troupe::train {
namespace {

// ---- the trace file ---------------------------------------------------------------------------

void ReadTiming(const toml::table* t, const std::string& file, SpotTrace& trace,
                absl::Status* err) {
  Section s(t, "timing", file, err);
  if (const toml::node* n = s.Raw("step_s")) {
    const toml::array* a = n->as_array();
    std::vector<double> v;
    for (size_t i = 0; a != nullptr && i < a->size(); ++i) {
      std::optional<double> x = (*a)[i].value<double>();
      if (!x || (*a)[i].is_boolean() || (*a)[i].is_string() || *x <= 0) {
        v.clear();
        break;
      }
      v.push_back(*x);
    }
    if (v.empty()) {
      s.Fail("step_s", "a non-empty array of step times in seconds (> 0) by world 1, 2, ...",
             a == nullptr ? TypeName(n->type()) : "another array");
    } else {
      trace.step_s = v;
    }
  }
  s.Number("replan_s", &trace.replan_s, 0, 3600);
  s.Number("detect_s", &trace.detect_s, 0, 3600);
  s.Number("join_s", &trace.join_s, 0, 86400);
  s.Number("checkpoint_s", &trace.checkpoint_s, 0, 3600);
  s.RejectUnknown();
}

// [[name]]: each element a table, read by `read`.
template <class F>
void ReadTables(const toml::table& root, const char* name, const std::string& file,
                absl::Status* err, F read) {
  const toml::node* n = root.get(name);
  if (n == nullptr) return;
  const toml::array* a = n->as_array();
  if (a == nullptr) {
    if (err->ok()) {
      *err = absl::InvalidArgumentError(absl::StrCat(file, ": ", name, ": expected [[", name,
                                                     "]] tables, got ", TypeName(n->type())));
    }
    return;
  }
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::table* t = (*a)[i].as_table();
    if (t == nullptr) {
      if (err->ok()) {
        *err = absl::InvalidArgumentError(absl::StrCat(
            file, ": ", name, "[", i, "]: expected a table, got ", TypeName((*a)[i].type())));
      }
      return;
    }
    Section s(t, absl::StrCat(name, "[", i, "]"), file, err);
    read(s);
    s.RejectUnknown();
  }
}

// ---- the simulation ---------------------------------------------------------------------------

using Kind = CoordinatorAction::Kind;
constexpr int64_t kSimParams = int64_t{64} * 65536;  // every rank of up to 64 owns a shard

CoreTime At(double s) {
  return CoreTime{} + std::chrono::duration_cast<CoreDuration>(std::chrono::duration<double>(s));
}

// SplitMix64: the same draws on every standard library.
struct Rng {
  uint64_t state;
  double Uniform() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }
};

struct Machine {
  std::string zone;
  bool spot = false, alive = true, noticed = false;
  double price_per_h = 0, start_s = 0, end_s = -1;
};

class SpotSim {
  using Actions = std::vector<CoordinatorAction>;

 public:
  SpotSim(const SpotTrace& t, int on_demand, int spot)
      : t_(t), rng_{t.seed}, mix_{on_demand, spot} {}

  absl::StatusOr<SpotOutcome> Run() {
    if (t_.zones.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(t_.file, ": expected at least one [[zone]]"));
    }
    if (mix_.first + mix_.second < 1) {
      return absl::InvalidArgumentError("a mix needs at least one machine");
    }
    for (int i = 0; i < mix_.first; ++i) AddMachine(absl::StrCat("od", i), t_.zones[0], false);
    for (int i = 0; i < mix_.second; ++i) {
      AddMachine(absl::StrCat("s", i), t_.zones[i % t_.zones.size()], true);
    }
    next_spot_ = mix_.second;
    scheduler::ActorRequest coordinator;
    coordinator.actor = "coordinator";
    coordinator.spot = scheduler::SpotPreference::kPreferOnDemand;
    TROUPE_ASSIGN_OR_RETURN(scheduler::ActorDecision placed, sched_.PlaceActor(coordinator));
    if (!placed.placed()) {
      return absl::FailedPreconditionError("the scheduler cannot place the coordinator");
    }
    coordinator_ = placed.node;
    out_.coordinator_machine = coordinator_;
    StartCoordinator(/*restart=*/false);
    constexpr int64_t kMaxEvents = 50'000'000;
    for (int64_t n = 0; !done_ && error_.ok() && !queue_.empty(); ++n) {
      if (n > kMaxEvents || now_ > 1e7) break;
      Event e = queue_.top();
      queue_.pop();
      now_ = e.at;
      e.run();
    }
    if (!error_.ok()) return error_;
    if (!done_) {
      return absl::DeadlineExceededError(
          absl::StrCat("the simulated job did not finish (", committed_, " of ", t_.steps,
                       " steps committed at ", now_, " s): too few workers left for min_workers?"));
    }
    out_.on_demand = mix_.first;
    out_.spot = mix_.second;
    out_.seconds = last_commit_s_ - first_commit_s_;
    out_.steps = committed_ - first_committed_;
    out_.goodput_steps_per_h = out_.seconds > 0 ? 3600.0 * out_.steps / out_.seconds : 0;
    for (const auto& [name, m] : machines_) {
      const double end = m.end_s >= 0 ? m.end_s : now_;
      out_.cost += m.price_per_h * (end - m.start_s) / 3600.0;
    }
    out_.cost_per_1k_steps = committed_ > 0 ? 1000.0 * out_.cost / committed_ : 0;
    out_.steps_lost = core_->record().steps_lost;
    out_.final_world = static_cast<int>(core_->group().size());
    return out_;
  }

 private:
  struct Event {
    double at;
    uint64_t seq;
    std::function<void()> run;
    bool operator<(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  void Schedule(double at, std::function<void()> f) {
    queue_.push(Event{at, next_seq_++, std::move(f)});
  }
  // `f` runs at `at` if the coordinator it answers is still the one in charge.
  void Reply(double at, const std::string& worker, std::function<Actions()> f) {
    const uint64_t inc = incarnation_;
    Schedule(at, [this, inc, worker, f = std::move(f)] {
      if (inc == incarnation_ && Alive(worker)) Execute(f());
    });
  }
  bool Alive(const std::string& worker) const {
    auto it = machines_.find(MachineOf(worker));
    return it != machines_.end() && it->second.alive;
  }
  static std::string MachineOf(const std::string& worker) {
    return worker.substr(0, worker.find('/'));
  }
  static std::string WorkerOf(const std::string& machine) { return machine + "/w0"; }
  double StepSeconds(size_t world) const {
    return t_.step_s[std::min(world, t_.step_s.size()) - 1];
  }

  void AddMachine(const std::string& name, const SpotZone& zone, bool spot) {
    Machine m;
    m.zone = zone.name;
    m.spot = spot;
    m.price_per_h = spot ? zone.spot_price_per_h : zone.on_demand_price_per_h;
    m.start_s = now_;
    machines_[name] = m;
    scheduler::NodeSpec n;
    n.name = name;
    n.resources = {{"cpu", 1}};
    n.labels = {{scheduler::kSpotLabel, spot ? "true" : "false"},
                {scheduler::kZoneLabel, zone.name}};
    (void)sched_.AddNode(n);
  }

  void StartCoordinator(bool restart) {
    CoordinatorCore::Options o;
    o.steps = t_.steps;
    o.min_workers = t_.min_workers;
    o.max_world = t_.max_workers;
    o.num_params = kSimParams;
    o.latest_checkpoint = [this] { return latest_checkpoint_; };
    o.notice_window = std::chrono::milliseconds(250);
    o.watchdog = std::chrono::hours(24 * 365);
    core_ = std::make_unique<CoordinatorCore>(std::move(o));
    ++incarnation_;
    if (restart) core_->Restore(saved_, At(now_));
    core_->SetOwnNode(coordinator_);
    std::vector<std::string> alive, dead;
    for (const auto& [name, m] : machines_) {
      (m.alive ? alive : dead).push_back(WorkerOf(name));
    }
    Execute(core_->OnMembershipKnown(alive.size(), dead, At(now_)));
    for (const std::string& w : alive) {
      Execute(core_->OnJoin(w, MachineOf(w), At(now_), machines_[MachineOf(w)].zone));
      if (machines_[MachineOf(w)].noticed) {
        Execute(core_->OnNodeDraining(MachineOf(w), "spot notice", At(now_)));
      }
    }
  }

  void Execute(const std::vector<CoordinatorAction>& actions) {
    for (const CoordinatorAction& a : actions) {
      if (done_) return;
      Do(a);
    }
  }

  void Do(const CoordinatorAction& a) {
    switch (a.kind) {
      case Kind::kSaveRecord:
        saved_ = a.record;
        break;
      case Kind::kConfigure:
        ReplyConfigured(a);
        break;
      case Kind::kStep:
        ReplyStepped(a);
        break;
      case Kind::kCommit:
        ReplyShardWritten(a);
        break;
      case Kind::kCheckpoint:
        CommitCheckpoint(a);
        break;
      case Kind::kFinal:
        Reply(now_, a.worker, [this, g = a.generation] {
          return core_->OnFinal(g, 0, kSimParams, core_->committed(), At(now_));
        });
        break;
      case Kind::kReadTable:
        AnswerTable(a);
        break;
      case Kind::kTimer:
        ArmTimer(a);
        break;
      case Kind::kCommitted:
        CountCommitted(a);
        break;
      case Kind::kEvent:
        if (a.event.event == "generation") ++out_.generations;
        if (a.event.event == "handover_checkpoint") ++out_.handover_checkpoints;
        break;
      case Kind::kFinish:
        done_ = true;
        break;
      case Kind::kReleaseNode: {  // handed over: the machine goes now, not at its notice's end
        const std::string machine = a.text;
        Schedule(now_, [this, machine] { Leave(machine, 0); });
        break;
      }
      case Kind::kMoveSelf:
        MoveCoordinatorOff();
        break;
      case Kind::kFail:
        EndFailed(a);
        break;
      default:  // aborts, and chaos (a trace has none)
        break;
    }
  }

  // ---- the workers' and the cluster's answers to the coordinator's actions ----

  void ReplyConfigured(const CoordinatorAction& a) {
    Reply(now_ + t_.replan_s, a.worker, [this, g = a.generation, w = a.worker] {
      return core_->OnConfigured(g, w, absl::OkStatus(), At(now_));
    });
  }

  void ReplyStepped(const CoordinatorAction& a) {
    const uint64_t g = a.generation;
    const int64_t step = a.step;
    Reply(now_ + StepSeconds(core_->group().size()), a.worker, [this, g, step, w = a.worker] {
      return core_->OnStepped(g, step, w, absl::OkStatus(), {{0, 1.0}}, At(now_));
    });
  }

  void ReplyShardWritten(const CoordinatorAction& a) {
    if (a.step < 0) return;
    const std::vector<std::string>& group = core_->group();
    const int32_t index =
        static_cast<int32_t>(std::find(group.begin(), group.end(), a.worker) - group.begin());
    const uint64_t g = a.generation;
    const int64_t step = a.step;
    Reply(now_ + t_.checkpoint_s, a.worker, [this, g, step, index] {
      return core_->OnShardWritten(g, step, index, ShardFileInfo{}, absl::OkStatus(), At(now_));
    });
  }

  void CommitCheckpoint(const CoordinatorAction& a) {
    latest_checkpoint_ = std::max(latest_checkpoint_.value_or(-1), a.step);
    const uint64_t inc = incarnation_;
    const int64_t step = a.step;
    Schedule(now_, [this, inc, step] {
      if (inc == incarnation_) Execute(core_->OnCheckpointCommitted(step, {}, At(now_)));
    });
  }

  void AnswerTable(const CoordinatorAction& a) {
    std::vector<std::string> dead;
    for (const auto& [name, m] : machines_) {
      if (!m.alive) dead.push_back(WorkerOf(name));
    }
    const uint64_t inc = incarnation_, g = a.generation;
    Schedule(now_, [this, inc, g, dead] {
      if (inc == incarnation_) Execute(core_->OnTable(g, dead, At(now_)));
    });
  }

  void ArmTimer(const CoordinatorAction& a) {
    const uint64_t inc = incarnation_, id = a.timer;
    Schedule(now_ + std::chrono::duration<double>(a.delay).count(), [this, inc, id] {
      if (inc == incarnation_) Execute(core_->OnTimer(id, At(now_)));
    });
  }

  // The first commit starts the clock and the preemptions: the job's start-up is not measured.
  void CountCommitted(const CoordinatorAction& a) {
    if (first_commit_s_ < 0) {
      first_commit_s_ = now_;
      first_committed_ = a.step;
      StartPreemptions();
    }
    last_commit_s_ = now_;
    committed_ = a.step;
  }

  void EndFailed(const CoordinatorAction& a) {
    if (IsPreempted(a.status)) {
      out_.preempted = true;
      done_ = true;
    } else {
      error_ = absl::Status(a.status.code(),
                            absl::StrCat("the simulated job failed: ", a.status.message()));
    }
  }

  // ---- the machines' lives ----

  void StartPreemptions() {
    if (!t_.preemptions.empty()) {
      for (size_t i = 0; i < t_.preemptions.size(); ++i) {
        const SpotPreemption p = t_.preemptions[i];
        Schedule(now_ + p.at_s, [this, p, i] {
          auto it = machines_.find(p.machine);
          int64_t index = -1;
          const bool spot_name = p.machine.size() > 1 && p.machine[0] == 's' &&
                                 absl::SimpleAtoi(p.machine.substr(1), &index) && index >= 0;
          if (it == machines_.end() && spot_name) {
            ++out_.ignored_preemptions;  // a spot machine this mix does not have
            return;
          }
          if (it == machines_.end() || !it->second.spot) {
            error_ = absl::InvalidArgumentError(absl::StrCat(
                t_.file, ": preemption[", i,
                "].machine: expected a spot machine (s0, s1, ...), got \"", p.machine, "\""));
            return;
          }
          Preempt(p.machine);
        });
      }
      return;
    }
    for (const auto& [name, m] : machines_) {
      if (m.spot) DrawPreemption(name);
    }
  }

  void DrawPreemption(const std::string& machine) {
    const SpotZone& z = Zone(machines_[machine].zone);
    if (z.preemptions_per_h <= 0) return;
    const double wait_s = -std::log(1.0 - rng_.Uniform()) / z.preemptions_per_h * 3600.0;
    Schedule(now_ + wait_s, [this, machine] { Preempt(machine); });
  }

  const SpotZone& Zone(const std::string& name) const {
    for (const SpotZone& z : t_.zones) {
      if (z.name == name) return z;
    }
    return t_.zones[0];
  }

  void Preempt(const std::string& machine) {
    Machine& m = machines_[machine];
    if (!m.alive || m.noticed || done_) return;
    ++out_.preemptions;
    const SpotZone& z = Zone(m.zone);
    if (z.notice_s > 0) {
      m.noticed = true;
      (void)sched_.DrainNode(machine);
      Execute(core_->OnNodeDraining(machine, "spot notice", At(now_)));
      Schedule(now_ + z.notice_s, [this, machine] { Leave(machine, 0); });
    } else {
      Leave(machine, t_.detect_s);
    }
  }

  // The machine is gone now; the cluster sees it `detect_s` later.
  void Leave(const std::string& machine, double detect_s) {
    Machine& m = machines_[machine];
    if (!m.alive) return;
    m.alive = false;
    m.end_s = now_;
    const SpotZone zone = Zone(m.zone);
    Schedule(now_ + detect_s, [this, machine] {
      const std::string w = WorkerOf(machine);
      Execute(core_->OnWorkerDown(w, "machine gone", At(now_)));
      Execute(core_->OnNodeDead(machine, At(now_)));
    });
    if (machine == coordinator_)
      MoveCoordinator(machine, detect_s);
    else
      (void)sched_.RemoveNodes({machine});
    if (m.spot && !done_) {
      Schedule(now_ + zone.replace_s, [this, zone] {
        if (done_) return;
        const std::string name = absl::StrCat("s", next_spot_++);
        AddMachine(name, zone, true);
        if (t_.preemptions.empty()) DrawPreemption(name);
        Schedule(now_ + t_.join_s, [this, name] {
          if (machines_[name].alive) {
            Execute(core_->OnJoin(WorkerOf(name), name, At(now_), machines_[name].zone));
          }
        });
      });
    }
  }

  // The coordinator's machine got a notice and the coordinator stopped to move (kMoveSelf): the
  // job supervisor restarts it where the scheduler places it now (not on a draining machine).
  void MoveCoordinatorOff() {
    ++out_.coordinator_moves;
    ++incarnation_;
    (void)sched_.ReleaseActor("coordinator");
    scheduler::ActorRequest r;
    r.actor = "coordinator";
    r.spot = scheduler::SpotPreference::kPreferOnDemand;
    absl::StatusOr<scheduler::ActorDecision> placed = sched_.PlaceActor(r);
    if (!placed.ok() || !placed->placed()) {
      error_ = absl::FailedPreconditionError("the coordinator cannot move: no machine takes it");
      return;
    }
    coordinator_ = placed->node;
    Schedule(now_ + t_.replan_s, [this] { StartCoordinator(/*restart=*/true); });
  }

  // The coordinator's process died with its machine: the job supervisor restarts it where the
  // scheduler re-places it, from its saved record, once the loss is seen.
  void MoveCoordinator(const std::string& machine, double detect_s) {
    ++out_.coordinator_moves;
    ++incarnation_;  // the old one's replies and timers go nowhere
    absl::StatusOr<scheduler::RescheduleReport> r = sched_.RemoveNodes({machine});
    coordinator_.clear();
    if (r.ok()) {
      for (const auto& moved : r->moved) {
        if (moved.actor == "coordinator") coordinator_ = moved.to;
      }
    }
    if (coordinator_.empty()) {
      error_ = absl::FailedPreconditionError(
          "the coordinator's machine left and no machine can take it");
      return;
    }
    Schedule(now_ + detect_s + t_.replan_s, [this] { StartCoordinator(/*restart=*/true); });
  }

  const SpotTrace& t_;
  Rng rng_;
  std::pair<int, int> mix_;
  double now_ = 0;
  uint64_t next_seq_ = 0;
  std::priority_queue<Event> queue_;
  std::map<std::string, Machine> machines_;
  int next_spot_ = 0;
  scheduler::Scheduler sched_;
  std::string coordinator_;
  std::unique_ptr<CoordinatorCore> core_;
  uint64_t incarnation_ = 0;
  CoordinatorRecord saved_;
  std::optional<int64_t> latest_checkpoint_;
  bool done_ = false;
  absl::Status error_;
  double first_commit_s_ = -1, last_commit_s_ = -1;
  int64_t first_committed_ = 0, committed_ = 0;
  SpotOutcome out_;
};

}  // namespace

absl::StatusOr<SpotTrace> ParseSpotTrace(const std::string& toml_text, const std::string& file) {
  TROUPE_ASSIGN_OR_RETURN(toml::table parsed, ParseToml(toml_text, file));
  const toml::table& root = parsed;
  SpotTrace t;
  t.file = file;
  absl::Status err;
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (key != "job" && key != "cluster" && key != "timing" && key != "zone" &&
        key != "preemption") {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key,
                       ": expected one of [job], [cluster], [timing], [[zone]], [[preemption]], "
                       "got an unknown section"));
    }
  }
  {
    Section s(root["job"].as_table(), "job", file, &err);
    s.Int("steps", &t.steps, 2, int64_t{1} << 40);
    s.Int32("min_workers", &t.min_workers, 1, 4096);
    s.Int32("max_workers", &t.max_workers, 1, 4096);
    int64_t seed = static_cast<int64_t>(t.seed);
    s.Int("seed", &seed, 0, std::numeric_limits<int64_t>::max());
    t.seed = static_cast<uint64_t>(seed);
    s.RejectUnknown();
  }
  {
    Section s(root["cluster"].as_table(), "cluster", file, &err);
    s.Int32("on_demand", &t.on_demand, 0, 4096);
    s.Int32("spot", &t.spot, 0, 4096);
    s.RejectUnknown();
  }
  ReadTiming(root["timing"].as_table(), file, t, &err);
  ReadTables(root, "zone", file, &err, [&](Section& s) {
    SpotZone z;
    s.Str("name", &z.name, /*nonempty=*/true);
    s.Number("spot_price_per_h", &z.spot_price_per_h, 0, 1e6);
    s.Number("on_demand_price_per_h", &z.on_demand_price_per_h, 0, 1e6);
    s.Number("preemptions_per_h", &z.preemptions_per_h, 0, 1e6);
    s.Number("notice_s", &z.notice_s, 0, 86400);
    s.Number("replace_s", &z.replace_s, 0, 86400);
    t.zones.push_back(z);
  });
  ReadTables(root, "preemption", file, &err, [&](Section& s) {
    SpotPreemption p;
    s.Number("at_s", &p.at_s, 0, 1e9);
    s.Str("machine", &p.machine, /*nonempty=*/true);
    t.preemptions.push_back(p);
  });
  if (!err.ok()) return err;
  if (t.zones.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": zone: expected at least one [[zone]] table, got none"));
  }
  if (t.min_workers > t.max_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": job.min_workers: expected at most job.max_workers (", t.max_workers,
                     "), got ", t.min_workers));
  }
  return t;
}

absl::StatusOr<SpotTrace> LoadSpotTrace(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "the trace"));
  return ParseSpotTrace(text, path);
}

absl::StatusOr<SpotOutcome> SimulateSpot(const SpotTrace& trace, int on_demand, int spot) {
  return SpotSim(trace, on_demand, spot).Run();
}

}  // namespace troupe::train
