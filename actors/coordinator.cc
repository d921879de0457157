// The coordinator actor "troupe.coordinator" (see training.h): generations, step commits,
// checkpoint manifests, recovery and chaos. It runs in a worker process under the driver's job
// supervisor; its committed-step record (<work_dir>/coordinator.state) lets a restarted one
// resume where the killed one stopped.
#include "troupe/actors/training.h"

#include <algorithm>
#include <cstdio>

#include <signal.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "protocol.h"
#include "troupe/kernels/norm.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/faults.h"

namespace troupe::actors {

std::string EncodePlan(const GenerationPlan& p) {
  std::string old = p.old_to_new.empty() ? "-" : absl::StrJoin(p.old_to_new, ",");
  return absl::StrCat(p.world, " ", p.rank, " ", p.committed_steps, " ",
                      static_cast<int>(p.source), " ", p.checkpoint_step, " ", old);
}

absl::StatusOr<GenerationPlan> DecodePlan(const std::string& text) {
  std::vector<std::string> f = absl::StrSplit(text, ' ');
  GenerationPlan p;
  int source = 0;
  bool ok = f.size() == 6 && absl::SimpleAtoi(f[0], &p.world) && absl::SimpleAtoi(f[1], &p.rank) &&
            absl::SimpleAtoi(f[2], &p.committed_steps) && absl::SimpleAtoi(f[3], &source) &&
            absl::SimpleAtoi(f[4], &p.checkpoint_step) && source >= 0 && source <= 2;
  if (ok && f[5] != "-") {
    for (absl::string_view s : absl::StrSplit(f[5], ',')) {
      int v;
      if (!absl::SimpleAtoi(s, &v)) ok = false;
      p.old_to_new.push_back(v);
    }
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("generation plan: malformed '", text, "'"));
  p.source = static_cast<RestoreSource>(source);
  return p;
}

namespace {

struct Member {
  std::string worker, node;
  int64_t node_pid = 0;
  caf::actor rank;
  bool alive = true;
  bool draining = false;
};

struct PendingCheckpoint {
  uint64_t gen = 0;
  int world = 0;
  int expected = 0;
  std::map<int, ShardFileInfo> shards;
};

enum class Phase { kWaiting, kConfiguring, kStepping, kRecovering, kFinishing, kDone };

struct Coordinator {
  JobSpec spec;
  int64_t num_params = 0;
  int64_t tokens_per_microbatch = 0;
  std::optional<model::GptConfig> gpt_config;
  std::unique_ptr<CheckpointStore> store;
  caf::event_based_actor* self = nullptr;
  caf::actor driver;  // prints our lines, receives the report, relays joins and membership
  caf::actor head;    // rank handles are looked up here (see runtime::directory_lookup_atom)
  size_t expected_joins = SIZE_MAX;  // ranks the driver knows of when we started
  bool membership_known = false;     // the head's table has been read (see known_atom)
  std::set<std::string> dead;        // workers the table said were dead

  std::map<std::string, Member> members;
  std::vector<std::string> active;  // the committed configuration: worker of each rank
  std::vector<std::string> group;   // the current generation's workers, by rank
  uint64_t gen = 0;
  Phase phase = Phase::kWaiting;
  std::set<std::string> pending;
  int64_t committed = 0;
  int64_t highest_committed = 0;
  int failed_generations = 0;
  std::map<int32_t, double> losses;
  std::map<std::string, std::string> kv;
  std::map<int64_t, PendingCheckpoint> checkpoints;
  std::set<size_t> fired;
  std::vector<std::string> events;  // short notes for the next progress line
  bool awaiting_recovery = false;
  absl::Time step_start, last_commit;
  double compute_seconds = 0;
  int64_t tokens = 0;
  JobReport report;
  std::ofstream commits;

  void Print(const std::string& line) { self->send(driver, progress_atom::value, line); }

  void Event(const std::string& e) {
    Print(absl::StrCat(absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::LocalTimeZone()),
                       "event: ", e));
  }

  std::string StatePath() const { return spec.work_dir + "/coordinator.state"; }

  // The committed-step record, written before any rank is told to commit (or to start a
  // generation): a restarted coordinator resumes from it. Atomic against a crash of this process
  // (temp + rename); a machine crash falls back to the checkpoints.
  void Save() {
    std::vector<std::string> f(fired.size());
    std::transform(fired.begin(), fired.end(), f.begin(), [](size_t i) { return absl::StrCat(i); });
    const std::string tmp = StatePath() + ".tmp";
    {
      std::ofstream o(tmp, std::ios::trunc);
      o << committed << " " << gen << " " << highest_committed << " " << report.steps_lost << " "
        << report.recovery_seconds << " " << (awaiting_recovery ? 1 : 0) << " "
        << report.generations << " " << (f.empty() ? "-" : absl::StrJoin(f, ",")) << " "
        << (active.empty() ? "-" : absl::StrJoin(active, ",")) << "\n";
    }
    std::rename(tmp.c_str(), StatePath().c_str());
  }

  bool Load() {
    std::ifstream in(StatePath());
    std::string fired_s, active_s;
    int awaiting = 0;
    if (!(in >> committed >> gen >> highest_committed >> report.steps_lost >>
          report.recovery_seconds >> awaiting >> report.generations >> fired_s >> active_s)) {
      committed = 0;
      gen = 0;
      return false;
    }
    awaiting_recovery = awaiting != 0;
    if (fired_s != "-") {
      for (absl::string_view v : absl::StrSplit(fired_s, ',')) {
        size_t i;
        if (absl::SimpleAtoi(v, &i)) fired.insert(i);
      }
    }
    if (active_s != "-") active = absl::StrSplit(active_s, ',');
    report.committed_steps = committed;
    return true;
  }

  int MaxWorld() const { return std::min(spec.max_workers, spec.model.microbatches); }

  void Fail(caf::event_based_actor* self, absl::Status s) {
    if (phase == Phase::kDone) return;
    phase = Phase::kDone;
    self->send(driver, failed_atom::value, s.ToString());
    self->quit();
  }

  void Abort(caf::event_based_actor* self, uint64_t new_gen) {
    for (auto& [w, m] : members) {
      if (m.alive) self->send(m.rank, abort_atom::value, new_gen);
    }
  }

  void NewGeneration(caf::event_based_actor* self, const std::string& why) {
    if (phase == Phase::kDone) return;
    if (++failed_generations > 20) {
      return Fail(self, absl::UnavailableError(absl::StrCat(
                            "gave up after 20 generations without progress; last: ", why)));
    }
    std::vector<std::string> next;
    for (const std::string& w : active) {
      const Member& m = members[w];
      if (m.alive && !m.draining && static_cast<int>(next.size()) < MaxWorld()) next.push_back(w);
    }
    for (const auto& [w, m] : members) {
      if (m.alive && !m.draining && static_cast<int>(next.size()) < MaxWorld() &&
          std::find(next.begin(), next.end(), w) == next.end()) {
        next.push_back(w);
      }
    }
    ++gen;
    Abort(self, gen);
    pending.clear();
    losses.clear();
    kv.clear();
    for (auto it = checkpoints.begin(); it != checkpoints.end();) {
      it = it->second.gen < gen ? checkpoints.erase(it) : std::next(it);
    }
    if (static_cast<int>(next.size()) < spec.min_workers) {
      phase = Phase::kWaiting;
      Event(absl::StrCat("waiting for workers: ", next.size(), " usable, min_workers ",
                         spec.min_workers));
      return;
    }
    GenerationPlan plan;
    plan.world = static_cast<int>(next.size());
    std::string source;
    std::vector<int> old_to_new;
    for (const std::string& w : active) {
      auto it = std::find(next.begin(), next.end(), w);
      old_to_new.push_back(it == next.end() ? -1 : static_cast<int>(it - next.begin()));
    }
    if (!active.empty() && MemoryRestorePossible(old_to_new)) {
      plan.source = RestoreSource::kMemory;
      plan.old_to_new = old_to_new;
      bool all_owners = std::find(old_to_new.begin(), old_to_new.end(), -1) == old_to_new.end();
      source = all_owners ? "memory (owners)" : "memory (owners + buddy mirrors)";
    } else {
      absl::StatusOr<Checkpoint> ckpt = store->LoadLatestValid();
      if (ckpt.ok() && ckpt->manifest().num_params == num_params) {
        plan.source = RestoreSource::kCheckpoint;
        plan.checkpoint_step = ckpt->step();
        source = absl::StrCat("checkpoint ", ckpt->dir());
        if (!active.empty()) report.steps_lost += std::max<int64_t>(0, committed - ckpt->step());
        committed = ckpt->step();
      } else {
        plan.source = RestoreSource::kInit;
        source = "initialisation (seed)";
        if (!active.empty()) report.steps_lost += committed;
        committed = 0;
      }
    }
    plan.committed_steps = committed;
    group = next;
    report.generations = static_cast<int>(gen);
    Event(absl::StrCat("generation ", gen, ": world ", group.size(), " [",
                       absl::StrJoin(group, " "), "] at step ", committed, ", state from ",
                       source, " — ", why));
    phase = Phase::kConfiguring;
    Save();
    for (int r = 0; r < plan.world; ++r) {
      plan.rank = r;
      pending.insert(group[r]);
      self->send(members[group[r]].rank, configure_atom::value, gen, EncodePlan(plan),
                 caf::actor_cast<caf::actor>(self));
    }
  }

  // A failure seen by a rank (not yet by membership): regenerate soon unless something else
  // (a down event) does it first.
  void Recover(caf::event_based_actor* self, const std::string& why) {
    if (phase != Phase::kConfiguring && phase != Phase::kStepping && phase != Phase::kFinishing)
      return;
    phase = Phase::kRecovering;
    Event(why);
    self->delayed_send(self, std::chrono::milliseconds(300), retry_atom::value, gen, why);
  }

  void Join(caf::event_based_actor* self, Member m) {
    if (members.count(m.worker) || phase == Phase::kDone) return;
    if (dead.count(m.worker)) {
      if (expected_joins != SIZE_MAX && expected_joins > 0) --expected_joins;
      return MaybeStart(self);
    }
    self->monitor(m.rank);
    const std::string worker = m.worker;
    members[worker] = std::move(m);
    if (phase != Phase::kWaiting) {
      Event(absl::StrCat("worker ", worker, " joined; folded in at the next step boundary"));
    }
    MaybeStart(self);
  }

  // Starts a generation once the ranks the driver announced are in and the head's membership
  // table has been read (a restarted coordinator must not count workers that died meanwhile).
  void MaybeStart(caf::event_based_actor* self) {
    if (phase != Phase::kWaiting || !membership_known || members.size() < expected_joins) return;
    int usable = 0;
    for (const auto& [w, mem] : members) usable += mem.alive && !mem.draining ? 1 : 0;
    // Every rank the driver started has joined (the embedded cluster: `workers` of them);
    // min_workers is enough to go.
    if (usable >= spec.min_workers) {
      NewGeneration(self, active.empty() ? "job start" : "enough workers");
    }
  }

  void MemberDown(caf::event_based_actor* self, const std::string& worker,
                  const std::string& why) {
    auto it = members.find(worker);
    if (it == members.end() || !it->second.alive) return;
    it->second.alive = false;
    const bool in_group = std::find(group.begin(), group.end(), worker) != group.end();
    if (in_group && phase != Phase::kWaiting && phase != Phase::kDone) {
      NewGeneration(self, absl::StrCat("worker ", worker, " down (", why, ")"));
    } else {
      Event(absl::StrCat("worker ", worker, " down (", why, ")"));
    }
  }

  // Every worker the head's membership table calls dead: remembered (it never joins) and down.
  void DownDeadInTable(caf::event_based_actor* self, const std::vector<runtime::MemberInfo>& table) {
    for (const runtime::MemberInfo& m : table) {
      if (m.kind != "worker" || m.state != "dead") continue;
      dead.insert(m.id);
      MemberDown(self, m.id, "dead in the table");
    }
  }

  int ArmRank(int requested) const {
    int r = requested < 0 ? 1 : requested;
    return std::min<int>(r, static_cast<int>(group.size()) - 1);
  }

  void FireFaults(caf::event_based_actor* self) {
    for (size_t i = 0; i < spec.faults.size(); ++i) {
      const Fault& f = spec.faults[i];
      if (fired.count(i) || f.step != committed || f.kind == "crash-in-checkpoint") continue;
      fired.insert(i);
      if (f.kind == "kill-worker" || f.kind == "stop-worker") {
        const int r = ArmRank(f.arg);
        const bool stop = f.kind == "stop-worker";
        self->send(members[group[r]].rank, arm_atom::value, f.step,
                   int32_t{stop ? SIGSTOP : SIGKILL});
        awaiting_recovery = true;
        Event(absl::StrCat("chaos: ", stop ? "SIGSTOP" : "kill -9", " of rank ", r, " (",
                           group[r], ") in the middle of step ", f.step, "'s gradient exchange"));
      } else if (f.kind == "kill-shard-and-buddy") {
        const int r = ArmRank(f.arg);
        const int buddy = (r + 1) % static_cast<int>(group.size());
        self->send(members[group[r]].rank, arm_atom::value, f.step, int32_t{SIGKILL});
        self->send(members[group[buddy]].rank, arm_atom::value, f.step, int32_t{SIGKILL});
        awaiting_recovery = true;
        Event(absl::StrCat("chaos: kill -9 of shard owner rank ", r, " and its buddy rank ",
                           buddy, " in step ", f.step));
      } else if (f.kind == "sigterm-node") {
        const Member& m = members[group[ArmRank(f.arg)]];
        if (m.node_pid > 0) kill(static_cast<pid_t>(m.node_pid), SIGTERM);
        Event(absl::StrCat("chaos: SIGTERM to node ", m.node, " (pid ", m.node_pid,
                           ") before step ", f.step));
      } else if (f.kind == "kill-coordinator") {
        Event(absl::StrCat("chaos: kill -9 of the coordinator's process before step ", f.step));
        awaiting_recovery = true;
        Save();
        std::ofstream(spec.work_dir + "/chaos.log", std::ios::app)
            << "killed coordinator step " << f.step << " at_ns " << absl::ToUnixNanos(absl::Now())
            << std::endl;
        raise(SIGKILL);
      } else if (f.kind == "join-worker") {
        self->send(driver, add_node_atom::value, absl::StrCat("join", f.step));
        Event(absl::StrCat("chaos: a node with one worker joins before step ", f.step));
      }
    }
  }

  void StartStep(caf::event_based_actor* self) {
    if (committed >= spec.steps) return Finish(self);
    for (const std::string& w : group) {
      if (members[w].draining) {
        return NewGeneration(self, absl::StrCat("node ", members[w].node,
                                                " is draining: its ranks leave at this step "
                                                "boundary"));
      }
    }
    int joiners = 0;
    for (const auto& [w, m] : members) {
      if (m.alive && !m.draining && std::find(group.begin(), group.end(), w) == group.end())
        ++joiners;
    }
    if (joiners > 0 && static_cast<int>(group.size()) < MaxWorld()) {
      return NewGeneration(self, "folding in workers that joined, at this step boundary");
    }
    FireFaults(self);
    phase = Phase::kStepping;
    step_start = absl::Now();
    for (const std::string& w : group) {
      pending.insert(w);
      self->send(members[w].rank, step_atom::value, gen, committed);
    }
  }

  int64_t CheckpointAt(int64_t step) const {
    if (step >= spec.steps) return step;
    return spec.checkpoint_every > 0 && step % spec.checkpoint_every == 0 ? step : -1;
  }

  void ExpectCheckpoint(int64_t step) {
    ShardLayout l = ShardLayout::Make(num_params, static_cast<int>(group.size()));
    PendingCheckpoint p{gen, l.world, 0, {}};
    for (int r = 0; r < l.world; ++r) p.expected += l.end(r) > l.begin(r) ? 1 : 0;
    checkpoints[step] = p;
  }

  void CommitStep(caf::event_based_actor* self, double grad_norm) {
    const absl::Time now = absl::Now();
    ++committed;
    highest_committed = std::max(highest_committed, committed);
    failed_generations = 0;
    const int64_t ckpt = CheckpointAt(committed);
    if (ckpt >= 0) ExpectCheckpoint(ckpt);
    report.committed_steps = committed;
    report.final_world = static_cast<int>(group.size());
    Save();
    for (const std::string& w : group) {
      self->send(members[w].rank, commit_atom::value, gen, ckpt);
    }
    commits << (committed - 1) << " " << gen << std::endl;
    std::vector<double> l;
    for (const auto& [k, v] : losses) l.push_back(v);
    const double loss = kernels::TreeSum(l.data(), static_cast<int64_t>(l.size())) /
                        static_cast<double>(l.size());
    losses.clear();
    report.losses.push_back(loss);
    const double secs = absl::ToDoubleSeconds(now - step_start);
    const int64_t step_tokens = int64_t{spec.model.microbatches} * tokens_per_microbatch;
    compute_seconds += secs;
    tokens += step_tokens;
    if (awaiting_recovery) {
      double kill_at = LastKillSeconds();
      if (kill_at > 0) {
        const double r = absl::ToDoubleSeconds(now - absl::UnixEpoch()) - kill_at;
        if (report.recovery_seconds < 0) report.recovery_seconds = r;
        events.push_back(absl::StrFormat("recovered: %.3f s from the fault to this commit", r));
        awaiting_recovery = false;
      }
    }
    std::string line = absl::StrFormat("step %4d/%d  loss %.4f  tok/s %7.0f  world %d  gen %d",
                                       committed, spec.steps, loss,
                                       step_tokens / std::max(secs, 1e-9), group.size(), gen);
    if (!events.empty()) absl::StrAppend(&line, "  | ", absl::StrJoin(events, "; "));
    Print(line);
    events.clear();
    last_commit = now;
    StartStep(self);
  }

  // The newest kill time the chaos hook wrote down (seconds since the epoch), or 0.
  double LastKillSeconds() const {
    std::ifstream in(spec.work_dir + "/chaos.log");
    std::string line;
    double last = 0;
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      int64_t ns;
      if (f.size() == 6 && absl::SimpleAtoi(f[5], &ns)) last = ns / 1e9;
    }
    return last;
  }

  // crash-in-checkpoint: this process dies inside the commit of checkpoint `step`, between its
  // manifest and LATEST.
  void ArmCheckpointCrash(int64_t step) {
    for (size_t i = 0; i < spec.faults.size(); ++i) {
      const Fault& f = spec.faults[i];
      if (f.kind != "crash-in-checkpoint" || fired.count(i) || f.step > step) continue;
      fired.insert(i);
      awaiting_recovery = true;
      Save();
      Event(absl::StrCat("chaos: kill -9 of the coordinator's process in the middle of committing ",
                         store->StepDir(step), " (manifest written, LATEST not yet moved)"));
      std::ofstream(spec.work_dir + "/chaos.log", std::ios::app)
          << "killed coordinator checkpoint " << step << " at_ns "
          << absl::ToUnixNanos(absl::Now()) << std::endl;
      runtime::ArmCrashPoint("checkpoint.publish");
      return;
    }
  }

  void ShardWritten(caf::event_based_actor* self, uint64_t g, int64_t step, int index,
                    ShardFileInfo info, bool ok, const std::string& error) {
    auto it = checkpoints.find(step);
    if (it == checkpoints.end() || it->second.gen != g) return;
    if (!ok) {
      Event(absl::StrCat("checkpoint step-", step, " dropped: shard ", index, ": ", error));
      checkpoints.erase(it);
    } else {
      it->second.shards[index] = std::move(info);
      if (static_cast<int>(it->second.shards.size()) == it->second.expected) {
        CheckpointManifest m;
        m.gpt_config = gpt_config;
        m.num_params = num_params;
        m.step = step;
        m.seed = spec.seed;
        m.world_size = it->second.world;
        m.generation = static_cast<int64_t>(g);
        m.optimizer_step = step;
        for (auto& [i, s] : it->second.shards) m.shards.push_back(s);
        ArmCheckpointCrash(step);
        absl::Status s = store->Commit(m);
        Event(s.ok() ? absl::StrCat("checkpoint ", store->StepDir(step), " committed")
                     : absl::StrCat("checkpoint step-", step, " failed: ", s.ToString()));
        checkpoints.erase(it);
      }
    }
    if (phase == Phase::kFinishing) Finish(self);
  }

  void Finish(caf::event_based_actor* self) {
    phase = Phase::kFinishing;
    // The last step is always checkpointed; if a failure lost that write, ask again.
    if (checkpoints.empty()) {
      absl::StatusOr<Checkpoint> latest = store->LoadLatestValid();
      if (!latest.ok() || latest->step() < committed) {
        ExpectCheckpoint(committed);
        for (const std::string& w : group) {
          self->send(members[w].rank, commit_atom::value, gen, committed);
        }
        return;
      }
      self->send(members[group[0]].rank, final_atom::value, gen);
    }
  }

  void Done(caf::event_based_actor* self, int64_t crc, int64_t n, int64_t steps) {
    phase = Phase::kDone;
    for (auto& [w, m] : members) {
      if (m.alive) self->send_exit(m.rank, caf::exit_reason::user_shutdown);
    }
    self->send(driver, report_atom::value, crc, n, steps,
               report.losses.empty() ? 0.0 : report.losses.back(),
               static_cast<int32_t>(report.generations), static_cast<int32_t>(report.final_world),
               report.recovery_seconds, report.steps_lost,
               compute_seconds > 0 ? tokens / compute_seconds : 0.0);
    self->quit();
  }
};

caf::behavior CoordinatorActor(runtime::Actor* self, const std::string& spec_text,
                               const caf::actor& driver) {
  auto c = std::make_shared<Coordinator>();
  c->self = self;
  c->driver = driver;
  absl::Status init = [&]() -> absl::Status {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(spec_text, "job spec from the driver");
    if (!spec.ok()) return spec.status();
    c->spec = *spec;
    absl::StatusOr<std::unique_ptr<Trainable>> probe =
        TrainableRegistry::Global().Create(c->spec.model);
    if (!probe.ok()) return probe.status();
    c->num_params = (*probe)->num_params();
    c->tokens_per_microbatch = (*probe)->tokens_per_microbatch();
    c->gpt_config = (*probe)->gpt_config();
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(
        {.dir = c->spec.CheckpointDir(), .keep_last = c->spec.keep_last,
         .warning = [c](const std::string& w) { c->Print("warning: " + w); }});
    if (!store.ok()) return store.status();
    c->store = std::move(*store);
    return absl::OkStatus();
  }();
  if (!init.ok()) {
    self->send(driver, failed_atom::value, init.ToString());
    self->quit(caf::make_error(caf::sec::runtime_error, std::string(init.message())));
    return {};
  }
  c->commits.open(c->spec.work_dir + "/commits.log", std::ios::app);
  if (c->Load()) {
    absl::StatusOr<Checkpoint> latest = c->store->LoadLatestValid();
    c->Event(absl::StrCat("coordinator restarted (pid ", getpid(),
                          "): resuming from the committed-step record (step ", c->committed,
                          ", generation ", c->gen, "); newest valid checkpoint: ",
                          latest.ok() ? latest->dir() : std::string(latest.status().message())));
  }
  self->send(driver, hello_atom::value, caf::actor_cast<caf::actor>(self));
  self->set_down_handler([self, c](caf::down_msg& m) {
    for (auto& [w, mem] : c->members) {
      if (mem.rank.address() == m.source) {
        c->MemberDown(self, w, absl::StrCat("its actor is down: ", self->system().render(m.reason)));
        return;
      }
    }
  });
  self->delayed_send(self, std::chrono::seconds(10), watchdog_atom::value, int64_t{-1});
  return {
      [self, c](join_atom, const std::string& worker, const std::string& node, int64_t node_pid,
                const std::string& rank_name) {
        if (c->members.count(worker) || c->phase == Phase::kDone || !c->head) return;
        self->request(c->head, std::chrono::seconds(10), runtime::directory_lookup_atom::value,
                      rank_name)
            .then(
                [self, c, worker, node, node_pid](const caf::actor& rank, uint64_t,
                                                  const std::string&) {
                  c->Join(self, Member{worker, node, node_pid, rank});
                },
                [c, worker](caf::error& e) {
                  c->Event(absl::StrCat("worker ", worker, ": its rank actor is gone (",
                                        c->self->system().render(e), ")"));
                  if (c->expected_joins != SIZE_MAX && c->expected_joins > 0) --c->expected_joins;
                });
      },
      [self, c](known_atom, int32_t n, const caf::actor& head) {
        c->expected_joins = static_cast<size_t>(n);
        c->head = head;
        self->request(head, std::chrono::seconds(10), runtime::members_table_atom::value)
            .then(
                [self, c](const std::vector<runtime::MemberInfo>& table) {
                  c->DownDeadInTable(self, table);
                  c->membership_known = true;
                  c->MaybeStart(self);
                },
                [self, c](caf::error& e) {
                  c->Fail(self, absl::UnavailableError(absl::StrCat(
                                    "cannot read the membership table from the head: ",
                                    self->system().render(e))));
                });
      },
      [self, c](runtime::membership_atom, const runtime::MembershipEvent& e) {
        if (e.kind == "worker_down") {
          c->MemberDown(self, e.subject, e.detail);
        } else if (e.kind == "node_draining") {
          for (auto& [w, m] : c->members) {
            if (m.node == e.subject && m.alive && !m.draining) {
              m.draining = true;
              c->Event(absl::StrCat("node ", e.subject, " draining (", e.detail, "): worker ", w,
                                    " leaves at the next step boundary"));
            }
          }
        } else if (e.kind == "node_dead") {
          for (auto& [w, m] : c->members) {
            if (m.node == e.subject) c->MemberDown(self, w, "its node is dead");
          }
        } else if (e.kind == "actor_hung") {
          for (auto& [w, m] : c->members) {
            if (e.detail.find(w) != std::string::npos && m.alive) {
              c->MemberDown(self, w, absl::StrCat("hung: ", e.detail));
            }
          }
        }
      },
      [self, c](configured_atom, uint64_t gen, const std::string& worker, bool ok,
                const std::string& error) {
        if (gen != c->gen || c->phase != Phase::kConfiguring) return;
        if (!ok) return c->Recover(self, absl::StrCat("configure failed on ", worker, ": ", error));
        c->pending.erase(worker);
        if (!c->pending.empty()) return;
        for (const std::string& w : c->group) {
          self->send(c->members[w].rank, commit_atom::value, gen, int64_t{-1});
        }
        c->active = c->group;
        c->StartStep(self);
      },
      [self, c](stepped_atom, uint64_t gen, int64_t step, const std::string& worker, bool ok,
                const std::string& error, const std::string& losses, double grad_norm) {
        if (gen != c->gen || step != c->committed || c->phase != Phase::kStepping) return;
        if (!ok) {
          return c->Recover(self, absl::StrCat("step ", step, " failed on ", worker, ": ", error));
        }
        for (absl::string_view kv : absl::StrSplit(losses, ',', absl::SkipEmpty())) {
          std::pair<std::string, std::string> p = absl::StrSplit(kv, ':');
          int32_t k;
          double v;
          if (absl::SimpleAtoi(p.first, &k) && absl::SimpleAtod(p.second, &v)) c->losses[k] = v;
        }
        c->pending.erase(worker);
        if (c->pending.empty()) c->CommitStep(self, grad_norm);
      },
      [self, c](shard_written_atom, uint64_t gen, int64_t step, int index, const std::string& name,
                int64_t begin, int64_t end, int64_t bytes, int64_t crc, bool ok,
                const std::string& error) {
        ShardFileInfo info{name, begin, end, static_cast<uint64_t>(bytes),
                           static_cast<uint32_t>(crc)};
        c->ShardWritten(self, gen, step, index, std::move(info), ok, error);
      },
      [self, c](final_atom, uint64_t gen, int64_t crc, int64_t n, int64_t steps) {
        if (gen != c->gen || c->phase != Phase::kFinishing) return;
        c->Done(self, crc, n, steps);
      },
      [self, c](retry_atom, uint64_t gen, const std::string& why) {
        if (gen != c->gen || c->phase != Phase::kRecovering) return;
        // Before the next generation, ask the head who is dead: a worker whose down event went
        // out before this coordinator subscribed (a restarted one) is known only to the table.
        auto regenerate = [self, c, gen, why] {
          if (gen == c->gen && c->phase == Phase::kRecovering) c->NewGeneration(self, why);
        };
        if (!c->head) return regenerate();
        self->request(c->head, std::chrono::seconds(2), runtime::members_table_atom::value)
            .then(
                [self, c, regenerate](const std::vector<runtime::MemberInfo>& table) {
                  c->DownDeadInTable(self, table);
                  regenerate();
                },
                [regenerate](caf::error&) { regenerate(); });
      },
      [self, c](watchdog_atom, int64_t seen) {
        // No commit for a long time with work to do: report rather than hang.
        if (c->phase == Phase::kDone) return;
        if (seen == c->committed && c->phase != Phase::kWaiting) {
          return c->Fail(self, absl::DeadlineExceededError(absl::StrCat(
                                   "no step committed for 120 s (stuck at step ", c->committed,
                                   ", generation ", c->gen, ")")));
        }
        self->delayed_send(self, std::chrono::seconds(120), watchdog_atom::value, c->committed);
      },
      [c](put_atom, const std::string& key, const std::string& value) {
        c->kv[key] = value;
        return true;
      },
      [c](get_atom, const std::string& key) {
        auto it = c->kv.find(key);
        return it == c->kv.end() ? std::make_tuple(false, std::string())
                                 : std::make_tuple(true, it->second);
      },
  };
}

}  // namespace

absl::Status RegisterCoordinator(runtime::ActorRegistry& registry) {
  return registry.Register<std::string, caf::actor>(kCoordinatorActorType, CoordinatorActor);
}

}  // namespace troupe::actors
