// The coordinator actor and the driver of RunTrainingJob (see training.h).
#include "troupe/actors/training.h"

#include <signal.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
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
#include "troupe/model/corpus.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/runtime.h"

namespace troupe::actors {

using join_atom = caf::atom_constant<caf::atom("tr_join")>;
using retry_atom = caf::atom_constant<caf::atom("tr_retry")>;
using watchdog_atom = caf::atom_constant<caf::atom("tr_watch")>;

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

// Requests from the coordinator to the driver thread (which owns the cluster handle).
struct DriverRequest {
  std::string kind;  // "add_node" | "done"
  std::string arg;
};

class DriverQueue {
 public:
  void Push(DriverRequest r) {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(r));
    cv_.notify_all();
  }
  std::optional<DriverRequest> Pop(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, wait, [&] { return !q_.empty(); })) return std::nullopt;
    DriverRequest r = std::move(q_.front());
    q_.pop_front();
    return r;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DriverRequest> q_;
};

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
  std::ostream* out = nullptr;
  DriverQueue* driver = nullptr;
  std::promise<absl::StatusOr<JobReport>> result;

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
  std::vector<std::string> events;  // printed with the next line
  bool awaiting_recovery = false;
  absl::Time step_start, last_commit;
  double compute_seconds = 0;
  int64_t tokens = 0;
  JobReport report;
  std::ofstream commits;

  void Event(const std::string& e) {
    *out << absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::LocalTimeZone()) << "event: " << e
         << std::endl;
    events.push_back(e);
  }

  int MaxWorld() const { return std::min(spec.max_workers, spec.model.microbatches); }

  void Fail(caf::event_based_actor* self, absl::Status s) {
    if (phase == Phase::kDone) return;
    phase = Phase::kDone;
    result.set_value(s);
    driver->Push({"done", ""});
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

  int ArmRank(int requested) const {
    int r = requested < 0 ? 1 : requested;
    return std::min<int>(r, static_cast<int>(group.size()) - 1);
  }

  void FireFaults(caf::event_based_actor* self) {
    for (size_t i = 0; i < spec.faults.size(); ++i) {
      const Fault& f = spec.faults[i];
      if (fired.count(i) || f.step != committed) continue;
      fired.insert(i);
      if (f.kind == "kill-worker") {
        const int r = ArmRank(f.arg);
        self->send(members[group[r]].rank, arm_atom::value, f.step);
        awaiting_recovery = true;
        Event(absl::StrCat("chaos: kill -9 of rank ", r, " (", group[r],
                           ") in the middle of step ", f.step, "'s gradient exchange"));
      } else if (f.kind == "kill-shard-and-buddy") {
        const int r = ArmRank(f.arg);
        const int buddy = (r + 1) % static_cast<int>(group.size());
        self->send(members[group[r]].rank, arm_atom::value, f.step);
        self->send(members[group[buddy]].rank, arm_atom::value, f.step);
        awaiting_recovery = true;
        Event(absl::StrCat("chaos: kill -9 of shard owner rank ", r, " and its buddy rank ",
                           buddy, " in step ", f.step));
      } else if (f.kind == "sigterm-node") {
        const Member& m = members[group[ArmRank(f.arg)]];
        if (m.node_pid > 0) kill(static_cast<pid_t>(m.node_pid), SIGTERM);
        Event(absl::StrCat("chaos: SIGTERM to node ", m.node, " (pid ", m.node_pid,
                           ") before step ", f.step));
      } else if (f.kind == "join-worker") {
        driver->Push({"add_node", absl::StrCat("join", f.step)});
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
    report.committed_steps = committed;
    report.final_world = static_cast<int>(group.size());
    const double secs = absl::ToDoubleSeconds(now - step_start);
    const int64_t step_tokens = int64_t{spec.model.microbatches} * tokens_per_microbatch;
    compute_seconds += secs;
    tokens += step_tokens;
    if (awaiting_recovery) {
      double kill_at = LastKillSeconds();
      if (kill_at > 0) {
        const double r = absl::ToDoubleSeconds(now - absl::UnixEpoch()) - kill_at;
        if (report.recovery_seconds < 0) report.recovery_seconds = r;
        events.push_back(absl::StrFormat("recovered: %.3f s from kill -9 to this commit", r));
        awaiting_recovery = false;
      }
    }
    *out << absl::StrFormat("step %4d/%d  loss %.4f  tok/s %7.0f  world %d  gen %d",
                            committed, spec.steps, loss, step_tokens / std::max(secs, 1e-9),
                            group.size(), gen);
    if (!events.empty()) *out << "  | " << absl::StrJoin(events, "; ");
    *out << std::endl;
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
    report.final_params_crc32c = static_cast<uint32_t>(crc);
    report.num_params = n;
    report.committed_steps = steps;
    report.tokens_per_second = compute_seconds > 0 ? tokens / compute_seconds : 0;
    phase = Phase::kDone;
    for (auto& [w, m] : members) {
      if (m.alive) self->send_exit(m.rank, caf::exit_reason::user_shutdown);
    }
    result.set_value(report);
    driver->Push({"done", ""});
    self->quit();
  }
};

caf::behavior CoordinatorActor(caf::event_based_actor* self, std::shared_ptr<Coordinator> c) {
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
                const caf::actor& rank) {
        if (c->members.count(worker) || c->phase == Phase::kDone) return;
        self->monitor(rank);
        c->members[worker] = Member{worker, node, node_pid, rank};
        int usable = 0;
        for (const auto& [w, m] : c->members) usable += m.alive && !m.draining ? 1 : 0;
        if (c->phase == Phase::kWaiting &&
            usable >= (c->active.empty() ? c->spec.workers : c->spec.min_workers)) {
          c->NewGeneration(self, c->active.empty() ? "job start" : "enough workers again");
        } else if (c->phase != Phase::kWaiting) {
          c->Event(absl::StrCat("worker ", worker, " joined; folded in at the next step boundary"));
        }
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
        if (gen == c->gen && c->phase == Phase::kRecovering) c->NewGeneration(self, why);
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

absl::Status PrepareData(JobSpec& spec, std::ostream& out) {
  if (spec.model.type != "gpt") return absl::OkStatus();
  if (spec.model.data_dir.empty()) spec.model.data_dir = spec.work_dir + "/data";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(spec.model.data_dir, ec)) {
    if (e.path().filename().string().rfind("train-", 0) == 0) return absl::OkStatus();
  }
  std::vector<std::string> files = model::FortunesCorpusFiles();
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "model.data_dir: no token shards in '", spec.model.data_dir,
        "' and no corpus to prepare them from (install Debian's fortunes, or run `troupe data "
        "prepare`)"));
  }
  out << "preparing the fortunes corpus into " << spec.model.data_dir << " (vocab 512)"
      << std::endl;
  absl::StatusOr<model::PreparedDataset> ds =
      model::PrepareDataset(files, spec.model.data_dir, 512);
  return ds.status();
}

}  // namespace

absl::StatusOr<JobReport> RunTrainingJob(JobSpec spec, const TrainOptions& options) {
  std::ostream& out = options.progress != nullptr ? *options.progress : std::cout;
  std::error_code ec;
  spec.work_dir = std::filesystem::absolute(spec.work_dir).lexically_normal().string();
  if (!spec.checkpoint_dir.empty()) {
    spec.checkpoint_dir = std::filesystem::absolute(spec.checkpoint_dir).string();
  }
  std::filesystem::create_directories(spec.work_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("job.work_dir: ", spec.work_dir, ": ", ec.message()));
  // Per-run logs start empty; checkpoints persist (a new run resumes from them).
  std::filesystem::remove_all(spec.work_dir + "/serve", ec);
  std::filesystem::remove(spec.work_dir + "/chaos.log", ec);
  if (absl::Status s = PrepareData(spec, out); !s.ok()) return s;
  if (spec.model.type == "gpt") {
    spec.model.data_dir = std::filesystem::absolute(spec.model.data_dir).string();
  }

  auto coord = std::make_shared<Coordinator>();
  {
    absl::StatusOr<std::unique_ptr<Trainable>> probe = TrainableRegistry::Global().Create(spec.model);
    if (!probe.ok()) return probe.status();
    coord->num_params = (*probe)->num_params();
    coord->tokens_per_microbatch = (*probe)->tokens_per_microbatch();
    coord->gpt_config = (*probe)->gpt_config();
  }
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(
      {.dir = spec.CheckpointDir(), .keep_last = spec.keep_last,
       .warning = [&out](const std::string& w) { out << "warning: " << w << std::endl; }});
  if (!store.ok()) return store.status();
  coord->store = std::move(*store);
  coord->spec = spec;
  coord->out = &out;
  DriverQueue driver;
  coord->driver = &driver;
  coord->commits.open(spec.work_dir + "/commits.log", std::ios::trunc);
  std::future<absl::StatusOr<JobReport>> result = coord->result.get_future();

  // The cluster: a running one, or the embedded default (a head and one node per worker, so a
  // node can be preempted on its own).
  std::unique_ptr<runtime::LocalCluster> local;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  const std::vector<std::string> node_args = {"--grace", "5s"};
  if (options.head.empty()) {
    runtime::LocalCluster::Options lo;
    lo.binary = options.binary;
    lo.workers = 0;
    lo.cluster.log_dir = spec.work_dir + "/logs";
    absl::StatusOr<std::unique_ptr<runtime::LocalCluster>> c = runtime::LocalCluster::Start(lo);
    if (!c.ok()) return c.status();
    local = std::move(*c);
    port = local->port();
    for (int i = 0; i < spec.workers; ++i) {
      absl::StatusOr<pid_t> pid = local->AddNode(absl::StrCat("n", i), 1, "cpu=1", "", node_args);
      if (!pid.ok()) return pid.status();
    }
    out << "embedded cluster: head 127.0.0.1:" << port << ", " << spec.workers
        << " nodes with one worker each; logs in " << lo.cluster.log_dir << std::endl;
  } else {
    std::vector<std::string> hp = absl::StrSplit(options.head, ':');
    int p = 0;
    if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &p) || p <= 0 || p > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--head: expected HOST:PORT, got '", options.head, "'"));
    }
    host = hp[0];
    port = static_cast<uint16_t>(p);
  }

  runtime::ActorRegistry registry;
  runtime::RuntimeOptions ro;
  ro.network = true;
  ro.log_events = false;
  absl::StatusOr<std::unique_ptr<runtime::Runtime>> rt =
      runtime::Runtime::Create(std::move(registry), ro);
  if (!rt.ok()) return rt.status();
  absl::StatusOr<runtime::ClusterClient> client =
      runtime::ClusterClient::Connect(**rt, host, port);
  if (!client.ok()) return client.status();

  caf::actor coordinator = (*rt)->system().spawn(CoordinatorActor, coord);
  client->Subscribe(coordinator);
  // The driver's own view of membership: new workers get a rank actor.
  struct Seen {
    std::mutex mu;
    std::deque<runtime::MembershipEvent> events;
  };
  auto seen = std::make_shared<Seen>();
  caf::actor listener = (*rt)->system().spawn(
      [](caf::event_based_actor*, std::shared_ptr<Seen> s) -> caf::behavior {
        return {[s](runtime::membership_atom, const runtime::MembershipEvent& e) {
          std::lock_guard<std::mutex> l(s->mu);
          s->events.push_back(e);
        }};
      },
      seen);
  client->Subscribe(listener);

  const std::string spec_text = spec.ToToml();
  std::set<std::string> spawned;
  int run_id = static_cast<int>(getpid());
  auto spawn_ranks = [&] {
    absl::StatusOr<std::vector<runtime::MemberInfo>> members = client->Members();
    if (!members.ok()) return;
    std::map<std::string, int64_t> node_pids;
    for (const runtime::MemberInfo& m : *members) {
      if (m.kind == "node") node_pids[m.id] = m.pid;
    }
    if (local != nullptr) {
      for (const auto& [name, pid] : local->nodes()) node_pids[name] = pid;
    }
    for (const runtime::MemberInfo& m : *members) {
      if (m.kind != "worker" || m.state != "alive" || spawned.count(m.id)) continue;
      spawned.insert(m.id);
      const std::string name =
          absl::StrCat(spec.name, ".", run_id, ".rank.", absl::StrReplaceAll(m.id, {{"/", "."}}));
      absl::StatusOr<runtime::ActorRef> ref =
          client->Spawn(kRankActorType, caf::make_message(spec_text, m.id), name,
                        absl::StrCat("worker=", m.id));
      if (!ref.ok()) {
        out << "warning: cannot start a rank on " << m.id << ": " << ref.status() << std::endl;
        continue;
      }
      caf::anon_send(coordinator, join_atom::value, m.id, m.node, node_pids[m.node], ref->handle);
    }
  };
  spawn_ranks();
  while (result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    std::optional<DriverRequest> req = driver.Pop(std::chrono::milliseconds(50));
    if (req && req->kind == "add_node" && local != nullptr) {
      absl::StatusOr<pid_t> pid = local->AddNode(req->arg, 1, "cpu=1", "", node_args);
      if (!pid.ok()) out << "warning: adding node " << req->arg << ": " << pid.status() << std::endl;
    }
    bool joined = false;
    {
      std::lock_guard<std::mutex> l(seen->mu);
      for (const auto& e : seen->events) joined = joined || e.kind == "worker_alive";
      seen->events.clear();
    }
    if (joined) spawn_ranks();
  }
  absl::StatusOr<JobReport> report = result.get();
  caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  if (report.ok()) {
    out << absl::StrFormat(
               "done: %d steps, final loss %.4f, world %d, %d generations, params crc32c "
               "%08x, steps lost %d",
               report->committed_steps, report->losses.empty() ? 0.0 : report->losses.back(),
               report->final_world, report->generations, report->final_params_crc32c,
               report->steps_lost)
        << (report->recovery_seconds >= 0
                ? absl::StrFormat(", recovery %.3f s", report->recovery_seconds)
                : std::string())
        << std::endl;
  }
  return report;
}

}  // namespace troupe::actors
