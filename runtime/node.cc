// The node agent role: registers with the head, starts its worker processes from the main
// thread (PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it must be the one
// that lives longest), reaps them, and turns a preemption notice (SIGTERM, or the cloud's metadata
// service: internal/preemption.h) into a drain with a grace period.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/context.h"
#include "internal/preemption.h"
#include "internal/process.h"
#include "internal/resources.h"
#include "internal/roles.h"
#include "internal/tls.h"
#include "troupe/runtime/log.h"
#include "troupe/runtime/metadata_sim.h"

namespace troupe::runtime::internal {
namespace {

using Clock = std::chrono::steady_clock;

struct Workers {
  std::mutex mu;
  std::map<pid_t, std::string> ids;  // live worker pids
  std::map<std::string, std::string> stderr_paths;
  std::set<std::string> fenced;  // workers this agent killed because the head fenced them
  std::atomic<bool> release{false};
  std::atomic<bool> head_lost{false};
  std::atomic<bool> rejoin{false};  // the head declared this node dead; join again
  int64_t incarnation = 0;          // joins so far - 1: worker ids start at incarnation * workers
  std::optional<PreemptionNotice> notice;  // from the cloud's metadata (under mu), until drained
  // --metadata_endpoint=simulate: the cloud's metadata this node serves itself (spot-notice).
  std::unique_ptr<MetadataSimulator> metadata;
  // Jobs' drivers (`troupe train --job ID`) the head placed here: to start (under mu), running.
  std::vector<std::pair<std::string, std::string>> jobs_to_start;  // (id, spec TOML)
  std::map<pid_t, std::string> jobs;                               // pid -> job id

  pid_t PidOf(const std::string& id) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [pid, wid] : ids)
      if (wid == id) return pid;
    return 0;
  }
};

caf::behavior AgentBehavior(caf::event_based_actor* self, std::shared_ptr<Workers> w,
                            caf::actor head, std::shared_ptr<Context> ctx) {
  self->monitor(head);
  self->set_down_handler([w](caf::down_msg&) { w->head_lost = true; });
  return {
      // The head that took over after a loss: its loss is the next one.
      [self](new_head_atom, const caf::actor& h) { self->monitor(h); },
      [w](fence_atom, const std::string& id) {
        std::lock_guard<std::mutex> l(w->mu);
        for (const auto& [pid, wid] : w->ids) {
          if (wid != id) continue;
          // Its exit is reported as fenced, not as a bare SIGKILL — unless it was already killed
          // (by a fault, or from outside) and is only slow to finish dying: that cause stands.
          if (AlreadyDying(pid)) continue;
          w->fenced.insert(id);
          kill(pid, SIGKILL);
        }
      },
      [w](release_atom) { w->release = true; },
      [w](job_run_atom, const std::string& id, const std::string& spec) {
        std::lock_guard<std::mutex> l(w->mu);
        w->jobs_to_start.emplace_back(id, spec);
      },
      [w](rejoin_atom) { w->rejoin = true; },
      [ctx](heartbeat_sync_atom) { ctx->RequestFullHeartbeat(); },
      // Chaos on this host: a preemption notice, delivered as the cloud's would be (SIGTERM to
      // this agent), or a network fault on its links.
      [w](node_fault_atom, const NodeFault& f) {
        if (f.kind == NodeFaultKind::kPreempt) {
          kill(getpid(), SIGTERM);
          return;
        }
        if (f.kind == NodeFaultKind::kSpotNotice) {
          // The cloud's own notice, as the watcher reads it (HTTP, the provider's format).
          if (w->metadata == nullptr) {
            LogError("node",
                     "chaos: spot-notice needs a simulated metadata endpoint "
                     "(--preemption_source aws|gce --metadata_endpoint simulate)");
            return;
          }
          w->metadata->Preempt();
          LogWarn("node", "chaos: spot notice on this node's (simulated) metadata endpoint");
          return;
        }
        absl::Status s = StartNetworkFault(f);
        if (s.ok()) {
          std::string what =
              absl::StrCat(to_string(f.kind), " of this host's links for ", f.duration_ms, " ms");
          if (f.kind == NodeFaultKind::kDelay) {
            absl::StrAppend(&what, " (", f.delay_us / 1000.0, " ms ± ", f.jitter_us / 1000.0,
                            " ms each way)");
          }
          if (f.kind == NodeFaultKind::kFlap) {
            absl::StrAppend(&what, " (cut and restored every ", f.period_ms, " ms)");
          }
          LogWarn("node", "chaos: " + what);
        } else {
          LogError("node", std::string(s.message()));
        }
      },
  };
}

// The "gpu" amount of --resources (0 when absent; a malformed list is the head's to refuse).
int GpuCount(const std::string& resources) {
  auto r = ParseResources(resources, "--resources");
  if (!r.ok() || !r->count("gpu")) return 0;
  return static_cast<int>(r->at("gpu"));
}

// Every worker that ended: a process_exit event here (this agent's log) and an exit report to
// the head, which publishes it (worker_down) with the same cause.
void Reap(Workers& w, const caf::actor& head, Context& ctx, const std::string& node) {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    std::string id, err;
    bool fenced = false;
    {
      std::lock_guard<std::mutex> l(w.mu);
      if (auto job = w.jobs.find(pid); job != w.jobs.end()) {
        caf::anon_send(head, job_exit_atom::value, job->second, static_cast<int64_t>(pid),
                       static_cast<int32_t>(status), TailFile(w.stderr_paths[job->second], 20));
        w.jobs.erase(job);
        continue;
      }
      auto it = w.ids.find(pid);
      if (it == w.ids.end()) continue;
      id = it->second;
      err = w.stderr_paths[id];
      fenced = w.fenced.erase(id) > 0;
      w.ids.erase(it);
    }
    base::SupervisionEvent e = base::ProcessExitEvent("node:" + node, id, pid, status, fenced);
    ctx.Emit(e);
    caf::anon_send(head, wexit_atom::value, id, static_cast<int64_t>(pid), e.reason,
                   TailFile(err, 20), static_cast<int32_t>(status), fenced);
  }
}

// Reaps workers for up to `limit`; true once none is left.
bool ReapAll(Workers& w, const caf::actor& head, Context& ctx, const std::string& node,
             Duration limit) {
  const auto deadline = Clock::now() + limit;
  while (true) {
    Reap(w, head, ctx, node);
    {
      std::lock_guard<std::mutex> l(w.mu);
      if (w.ids.empty()) return true;
    }
    if (Clock::now() >= deadline) return false;
    usleep(10000);
  }
}

void StopWorkers(Workers& w, const caf::actor& head, Context& ctx, const std::string& node) {
  {
    std::lock_guard<std::mutex> l(w.mu);
    for (const auto& [pid, id] : w.ids) kill(pid, SIGTERM);
  }
  if (ReapAll(w, head, ctx, node, std::chrono::seconds(1))) return;
  {
    std::lock_guard<std::mutex> l(w.mu);
    for (const auto& [pid, id] : w.ids) kill(pid, SIGKILL);
  }
  usleep(50000);
  Reap(w, head, ctx, node);
}

struct NodeConfig {
  RuntimeOptions ro;
  ClusterOptions co;
  std::string head_addr, name, resources = "cpu=1", labels, advertise;
  int64_t workers = 1;
  Duration grace = std::chrono::seconds(30);
  std::string preemption_source = "sigterm", metadata_endpoint;
  PreemptionSource source = PreemptionSource::kSigterm;
  Duration preemption_poll = std::chrono::seconds(5);
};

// Flags and TROUPE_* variables; >= 0: exit with it now (help, or a bad option).
int ParseNodeConfig(const std::vector<std::string>& args, NodeConfig& c) {
  ConfigRegistry config;
  c.ro.Register(config);
  c.co.Register(config);
  config.AddString("head", &c.head_addr, "head address HOST:PORT");
  config.AddString("name", &c.name, "this node's name (default: the host name)");
  config.AddString("resources", &c.resources, "resources, e.g. cpu=2,gpu=0,memory=8G");
  config.AddString("labels", &c.labels, "labels, e.g. spot=true,zone=a");
  config.AddString("advertise", &c.advertise,
                   "the IPv4 address other hosts reach this node's workers by (default: this "
                   "host's address on the route to the head)");
  config.AddInt("workers", &c.workers, "worker processes to start", InRange(0, 256));
  config.AddDuration("grace", &c.grace,
                     "on a preemption notice: drain, then leave after at most this long (or when "
                     "the cloud says it takes the machine, if sooner)");
  config.AddString("preemption_source", &c.preemption_source,
                   "where notices come from: sigterm (Kubernetes), aws (IMDSv2 spot "
                   "instance-action), gce (instance/preempted), none (SIGTERM stops at once); aws "
                   "and gce drain on SIGTERM too",
                   OneOf({"none", "sigterm", "aws", "gce"}));
  config.AddString("metadata_endpoint", &c.metadata_endpoint,
                   "the cloud's metadata server, http://HOST[:PORT] (default: aws "
                   "http://169.254.169.254, gce http://metadata.google.internal); simulate: "
                   "this node serves one itself on loopback, which chaos's spot-notice flips");
  config.AddDuration("preemption_poll", &c.preemption_poll,
                     "between polls of the metadata server (gce: the longest wait for a change)");
  if (int rc = ParseCommandLine("node",
                                "usage: troupe node --head HOST:P [--resources cpu=2,gpu=0] "
                                "[--labels k=v] [--preemption_source sigterm|aws|gce|none]",
                                args, config);
      rc >= 0)
    return rc;
  if (c.name.empty()) c.name = HostName();
  c.source = *ParsePreemptionSource(c.preemption_source);  // OneOf above checked it
  if (c.metadata_endpoint == "simulate" && c.source != PreemptionSource::kAws &&
      c.source != PreemptionSource::kGce) {
    std::cerr << "troupe node: --metadata_endpoint: expected an http://HOST[:PORT] endpoint, or "
                 "simulate with --preemption_source aws or gce, got simulate with "
              << c.preemption_source << std::endl;
    return 2;
  }
  return -1;
}

// The node's GPU ids: the agent's own CUDA_VISIBLE_DEVICES where it was given one (SLURM, a
// Kubernetes device plugin, the embedded cluster), else 0 .. gpus - 1.
std::vector<std::string> GpuIds(int gpus) {
  std::vector<std::string> ids;
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr && *visible != '\0') {
    ids = absl::StrSplit(visible, ',', absl::SkipWhitespace());
  }
  for (int g = static_cast<int>(ids.size()); g < gpus; ++g) ids.push_back(absl::StrCat(g));
  return ids;
}

// The node's worker processes, each with its share of the GPUs and its own log files.
// Chaos's clock steps (clock-step): with TROUPE_CLOCK_STEP_DIR set, each worker runs with
// libtroupe_clock_step.so preloaded (tools/clock_step.cc, beside the troupe binary): its wall
// clock is offset by the nanoseconds in <dir>/<worker id>.offset, which the worker itself writes
// when the fault strikes it. Its monotonic clock is untouched, as under an NTP step.
// (libfaketime cannot do this: with its monotonic clock left alone, its absolute monotonic
// sleeps fail with EINVAL and its monotonic condition-variable waits time out at once.)
void ClockStepEnvironment(const std::string& worker, std::map<std::string, std::string>* env) {
  const char* dir = getenv("TROUPE_CLOCK_STEP_DIR");
  if (dir == nullptr || *dir == '\0') return;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return;
  std::string lib(exe, static_cast<size_t>(n));
  lib = lib.substr(0, lib.rfind('/') + 1) + "libtroupe_clock_step.so";
  if (access(lib.c_str(), R_OK) != 0) {
    LogError("node", "TROUPE_CLOCK_STEP_DIR is set but " + lib + " is missing: no clock steps");
    return;
  }
  mkdir(dir, 0755);
  const std::string file =
      absl::StrCat(dir, "/", absl::StrReplaceAll(worker, {{"/", "_"}}), ".offset");
  std::ofstream(file) << "0\n";
  // After whatever is preloaded already (a sanitizer's runtime must come first).
  const char* preloaded = getenv("LD_PRELOAD");
  (*env)["LD_PRELOAD"] = preloaded && *preloaded ? absl::StrCat(preloaded, ":", lib) : lib;
  (*env)["TROUPE_CLOCK_STEP_FILE"] = file;
}

void StartWorkers(const NodeConfig& c, Workers& w) {
  mkdir(c.co.log_dir.c_str(), 0755);
  const int gpus = GpuCount(c.resources);
  const int per_worker = c.workers > 0 ? gpus / static_cast<int>(c.workers) : 0;
  const std::vector<std::string> gpu_ids = GpuIds(gpus);
  for (int64_t i = 0; i < c.workers; ++i) {
    const int64_t index = w.incarnation * c.workers + i;
    std::string id = absl::StrCat(c.name, "/w", index);
    std::string file = absl::StrCat(c.co.log_dir, "/", c.name, "-w", index);
    ProcessSpec spec;
    spec.args = {"worker",
                 "--head",
                 c.head_addr,
                 "--node",
                 c.name,
                 "--id",
                 id,
                 "--heartbeat_interval",
                 FormatDuration(c.co.heartbeat_interval),
                 "--threads",
                 absl::StrCat(c.ro.threads),
                 "--head_grace",
                 FormatDuration(c.co.head_grace),
                 "--address",
                 c.advertise};
    if (!c.co.build_id.empty()) spec.args.insert(spec.args.end(), {"--build_id", c.co.build_id});
    for (const std::string& a : c.ro.TlsArgs()) spec.args.push_back(a);
    std::string visible;
    for (int g = 0; g < per_worker; ++g) {
      absl::StrAppend(&visible, g ? "," : "", gpu_ids[i * per_worker + g]);
    }
    spec.env["CUDA_VISIBLE_DEVICES"] = visible;
    ClockStepEnvironment(id, &spec.env);
    spec.stdout_path = file + ".out";
    spec.stderr_path = file + ".err";
    auto pid = StartProcess(spec);
    if (!pid.ok()) {
      LogError(absl::StrCat("node ", c.name),
               absl::StrCat("cannot start worker ", id, ": ", pid.status().message()));
      continue;
    }
    std::lock_guard<std::mutex> l(w.mu);
    w.ids[*pid] = id;
    w.stderr_paths[id] = spec.stderr_path;
  }
}

// The drivers of the jobs the head placed here since the last call: `troupe train --job ID` with
// the job's spec, this node's head and certificates; its output in <log_dir>/<node>-<id>.out/.err.
void StartJobDrivers(const NodeConfig& c, Workers& w, const caf::actor& head) {
  std::vector<std::pair<std::string, std::string>> start;
  {
    std::lock_guard<std::mutex> l(w.mu);
    start.swap(w.jobs_to_start);
  }
  for (const auto& [id, spec_toml] : start) {
    const std::string file = absl::StrCat(c.co.log_dir, "/", c.name, "-", id);
    std::ofstream(file + ".toml") << spec_toml;
    ProcessSpec spec;
    spec.args = {"train",
                 "--head",
                 c.head_addr,
                 "--job",
                 id,
                 "--spec",
                 file + ".toml",
                 "--head_grace",
                 FormatDuration(c.co.head_grace)};
    for (const std::string& a : c.ro.TlsArgs()) spec.args.push_back(a);
    spec.stdout_path = file + ".out";
    spec.stderr_path = file + ".err";
    absl::StatusOr<pid_t> pid = StartProcess(spec);
    if (!pid.ok()) {
      caf::anon_send(head, job_exit_atom::value, id, int64_t{0}, int32_t{127 << 8},
                     std::string(pid.status().message()));
      continue;
    }
    PrintLine(
        absl::StrCat("troupe node ", c.name, ": job ", id, ": its driver runs as pid ", *pid));
    std::lock_guard<std::mutex> l(w.mu);
    w.jobs[*pid] = id;
    w.stderr_paths[id] = spec.stderr_path;
  }
}

// The registration a node agent sends after its hello (see JoinCluster).
caf::message Registration(const NodeConfig& c, const caf::actor& agent) {
  return caf::make_message(reg_node_atom::value, c.name, c.resources, c.labels, c.advertise,
                           HostName(), agent);
}

// The head declared this node dead while it was cut off and now hears from it again: its workers
// were fenced (a new generation went on without them), so they are killed, and the node joins
// again as a new member with new workers under new ids (a worker once dead is never planned again).
void Rejoin(const NodeConfig& c, Workers& w, const caf::actor& head, const caf::actor& agent,
            Context& ctx, caf::actor_system& sys) {
  LogWarn(absl::StrCat("node ", c.name),
          "the head declared this node dead; fencing its workers and joining again");
  {
    std::lock_guard<std::mutex> l(w.mu);
    for (const auto& [pid, id] : w.ids) {
      if (AlreadyDying(pid)) continue;
      w.fenced.insert(id);
      kill(pid, SIGKILL);
    }
  }
  if (!ReapAll(w, head, ctx, c.name, std::chrono::seconds(5))) {
    LogWarn(absl::StrCat("node ", c.name), "a fenced worker outlived 5s after SIGKILL");
  }
  auto joined = JoinCluster(sys, head, c.co, "node", c.name, Registration(c, agent));
  if (!joined.ok()) ExitRole("node", c.name, joined.status());
  ++w.incarnation;
  PrintLine(
      absl::StrCat("troupe node ", c.name, ": joined again, starting ", c.workers, " new workers"));
  StartWorkers(c, w);
}

// Reaps workers until a preemption notice (a drain of at most `grace`, or until the head releases
// the node) or the head is lost; then stops the workers and exits the process. With
// --preemption_source none, SIGTERM stops the node at once.
[[noreturn]] void ServeUntilGone(const NodeConfig& c, Workers& w, caf::actor head,
                                 const caf::actor& agent, Context& ctx, caf::actor_system& sys,
                                 Runtime& runtime, HeartbeatSender& heartbeats) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  bool draining = false;
  Clock::time_point deadline;
  while (true) {
    timespec ts{0, 20 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGCHLD) Reap(w, head, ctx, c.name);
    StartJobDrivers(c, w, head);
    if (w.rejoin.exchange(false) && !draining) Rejoin(c, w, head, agent, ctx, sys);
    std::optional<PreemptionNotice> notice;
    {
      std::lock_guard<std::mutex> l(w.mu);
      notice.swap(w.notice);
    }
    if ((sig == SIGTERM || sig == SIGINT) && !draining) {
      if (c.source == PreemptionSource::kNone) break;
      notice = PreemptionNotice{c.grace, sig == SIGTERM ? "SIGTERM" : "SIGINT"};
    }
    if (notice && !draining) {
      draining = true;
      const Duration grace = std::min(c.grace, notice->left);
      deadline = Clock::now() + grace;
      const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(grace).count();
      PrintLine(absl::StrCat("troupe node ", c.name, ": preemption notice (", notice->detail,
                             "), draining for ", ms, "ms"));
      caf::anon_send(head, drain_atom::value, c.name, ms, notice->detail);
    }
    if (w.head_lost) {
      // The workers go on (they rejoin by themselves) while this agent joins the head that takes
      // over; without one within head_grace, the node stops.
      LogWarn(absl::StrCat("node ", c.name),
              absl::StrCat("lost the head; rejoining within ", FormatDuration(c.co.head_grace)));
      absl::StatusOr<caf::actor> again =
          RejoinHead(runtime, c.head_addr, c.co, "node", c.name, Registration(c, agent));
      if (!again.ok()) {
        LogError(absl::StrCat("node ", c.name), std::string(again.status().message()));
        StopWorkers(w, head, ctx, c.name);
        std::fflush(nullptr);
        _exit(1);
      }
      head = *again;
      w.head_lost = false;
      caf::anon_send(agent, new_head_atom::value, head);
      heartbeats.SetHead(head);
      PrintLine(absl::StrCat("troupe node ", c.name, ": rejoined the head at ", c.head_addr));
      Reap(w, head, ctx, c.name);  // exits while it was away
    }
    if (draining && (w.release || Clock::now() >= deadline)) break;
  }
  StopWorkers(w, head, ctx, c.name);
  {
    caf::scoped_actor self{sys};
    self->send(head, leave_atom::value, c.name);
  }
  PrintLine(absl::StrCat("troupe node ", c.name, ": left"));
  std::fflush(nullptr);
  usleep(100000);  // let the leave message go out
  _exit(0);
}

}  // namespace

int NodeMain(const std::vector<std::string>& args, ActorRegistry registry) {
  NodeConfig c;
  if (int rc = ParseNodeConfig(args, c); rc >= 0) return rc;
  BlockRoleSignals();
  auto m = StartMember(c.head_addr, c.ro, std::move(registry), c.co.join_timeout);
  if (!m.ok()) ExitRole("node", c.name, m.status());
  auto& sys = m->runtime->system();
  if (c.advertise.empty()) {
    auto address = AddressTowards(c.head_addr);
    if (!address.ok()) ExitRole("node", c.name, address.status());
    c.advertise = *address;
  }
  auto w = std::make_shared<Workers>();
  std::unique_ptr<PreemptionWatcher> watcher;
  if (c.metadata_endpoint == "simulate") {
    w->metadata = std::make_unique<MetadataSimulator>();
    c.metadata_endpoint = w->metadata->endpoint();
  }
  if (c.source == PreemptionSource::kAws || c.source == PreemptionSource::kGce) {
    auto started = PreemptionWatcher::Start({c.source, c.metadata_endpoint, c.preemption_poll},
                                            [w](const PreemptionNotice& n) {
                                              std::lock_guard<std::mutex> l(w->mu);
                                              w->notice = n;
                                            });
    if (!started.ok()) ExitRole("node", c.name, started.status());
    watcher = std::move(*started);
  }
  caf::actor agent = sys.spawn(AgentBehavior, w, m->head, m->runtime->internal_context());
  auto joined = JoinCluster(sys, m->head, c.co, "node", c.name, Registration(c, agent));
  if (!joined.ok()) ExitRole("node", c.name, joined.status());
  PrintLine(absl::StrCat("troupe node ", c.name, ": joined ", c.head_addr, " with ", c.resources,
                         " as ", c.advertise, ", starting ", c.workers, " workers"));
  // Heartbeats first: starting the workers can take longer than the head's heartbeat timeout on a
  // loaded machine (a node was once declared dead a second after it joined).
  HeartbeatSender heartbeats(*m->runtime, m->head, c.name, c.co.heartbeat_interval);
  StartWorkers(c, *w);
  ServeUntilGone(c, *w, m->head, agent, *m->runtime->internal_context(), sys, *m->runtime,
                 heartbeats);
}

}  // namespace troupe::runtime::internal
