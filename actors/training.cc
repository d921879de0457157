// The driver of a training job (see training.h): the cluster (embedded or remote), the rank
// actors on every worker, and the job supervisor whose child is the coordinator.
#include "troupe/actors/training.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "job_reporter.h"
#include "protocol.h"
#include "rank_spawner.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/corpus.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/runtime.h"
#include "troupe/runtime/supervisor.h"
#include "troupe/train/job_events.h"
#include "troupe/train/preempted.h"

namespace troupe::actors {

using internal::JobActorPrefix;
using internal::RankSpawner;
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

struct JoinInfo {
  std::string node;
  std::string domain;
  std::string rank;  // the rank actor's cluster-wide name
};

// What the driver actor shares with the driver thread.
struct DriverState {
  std::ostream* out = nullptr;
  DriverQueue* queue = nullptr;
  runtime::ClusterClient* client = nullptr;
  caf::actor head;  // the driver actor's copy: the driver thread swaps the client's (Reconnect)
  caf::actor coordinator;
  std::map<std::string, JoinInfo> ranks;  // live rank actors by worker id
  std::promise<absl::StatusOr<JobReport>> result;
  bool finished = false;
  std::atomic<int64_t> last_heard_ns{0};  // on base::MonotonicNow()'s clock: for the silence only
  // The job's event log (job_events.h): here the job supervisor's events (the coordinator's
  // starts, exits and restarts) and a process_exit event for every worker or node the head
  // reports dead; the coordinator and the ranks append their own.
  std::shared_ptr<train::EventLog> events;
  std::string events_path;
  caf::actor_addr supervisor;  // the job supervisor (StartJobSupervisor), once started
  std::string last_exit;       // why the coordinator last exited (the supervisor's event)
  JobReporter* reporter = nullptr;

  // How the job ended, once: to the driver thread waiting in AwaitReport.
  void Finish(absl::StatusOr<JobReport> r) {
    if (finished) return;
    finished = true;
    result.set_value(std::move(r));
    queue->Push({"done", ""});
  }
};

// (head_atom, head) to the driver actor: the head that took over, once the driver reconnected.
using head_atom = caf::atom_constant<caf::atom("tr_drvhead")>;
// (watch_supervisor_atom, supervisor) to the driver actor: the job supervisor to watch.
using watch_supervisor_atom = caf::atom_constant<caf::atom("tr_drvsup")>;
// (supervision_line_atom, line, exit reason) to the driver actor: a coordinator exit or the
// supervisor's escalation, printed as it happens (the driver's only word that its coordinator
// cannot start).
using supervision_line_atom = caf::atom_constant<caf::atom("tr_drvsupl")>;

// Relays between the coordinator (wherever the supervisor placed it) and this process: prints its
// lines, replays the known ranks to every new incarnation, carries out its requests.
caf::behavior DriverActor(caf::event_based_actor* self, std::shared_ptr<DriverState> st) {
  auto heard = [st] { st->last_heard_ns.store(absl::ToUnixNanos(base::MonotonicNow())); };
  auto forward = [self, st](const std::string& w, const JoinInfo& j) {
    self->send(st->coordinator, RankJoined{w, j.node, j.domain, j.rank});
  };
  auto follow = [self, st](const caf::actor& head) {
    st->head = head;
    self->monitor(head);
    self->send(head, runtime::membership_subscribe_atom::value, caf::actor_cast<caf::actor>(self));
  };
  follow(st->client->head());
  // The head lost: the driver thread reconnects (AwaitReport) while the job pauses.
  self->set_down_handler([self, st](caf::down_msg& m) {
    if (st->finished) return;
    // The supervisor gave up on the coordinator (it exited or could not be placed more often
    // than its intensity allows): nothing will report, so the job fails now, not after
    // timeouts.driver_silence.
    if (m.source == st->supervisor) {
      st->Finish(absl::AbortedError(absl::StrCat(
          "training job failed: the job supervisor stopped (", self->system().render(m.reason),
          "): its coordinator could not be kept running",
          st->last_exit.empty() ? "" : absl::StrCat(" (its last exit: ", st->last_exit, ")"),
          "; its events: ", st->events_path)));
      return;
    }
    if (m.source != st->head.address()) return;
    st->queue->Push({"head_lost", self->system().render(m.reason)});
  });
  return {
      [self, st, heard, forward](const CoordinatorHello& h) {
        heard();
        st->coordinator = h.coordinator;
        self->send(h.coordinator, KnownRanks{static_cast<int32_t>(st->ranks.size()), st->head});
        for (const auto& [w, j] : st->ranks) forward(w, j);
      },
      [follow](head_atom, const caf::actor& head) { follow(head); },
      [self, st](watch_supervisor_atom, const caf::actor& sup) {
        st->supervisor = sup.address();
        self->monitor(sup);
      },
      [st](supervision_line_atom, const std::string& line, const std::string& exit) {
        if (!exit.empty()) st->last_exit = exit;
        if (!st->finished) *st->out << line << std::endl;
      },
      // `troupe job stop`, relayed by the head: the coordinator stops every rank and reports.
      [st](runtime::job_stop_atom, const std::string& id) {
        *st->out << "job " << id << ": stop asked (troupe job stop)" << std::endl;
        if (st->coordinator) {
          caf::anon_send(st->coordinator, runtime::job_stop_atom::value, id);
        } else {
          st->Finish(absl::CancelledError("stopped by `troupe job stop`"));
        }
      },
      // Ranks for a queued job of higher priority: the coordinator hands them over, says which.
      [st](runtime::job_shrink_atom, const std::string& id, int32_t n) {
        *st->out << "job " << id << ": giving up " << n
                 << " rank(s) to a queued job of higher priority" << std::endl;
        if (st->coordinator) caf::anon_send(st->coordinator, give_up_atom::value, n);
      },
      [st](give_up_atom, const std::string& worker) {
        st->ranks.erase(worker);
        st->queue->Push({"rank_gone", worker});
      },
      [st, forward](const RankJoined& j) {
        st->ranks[j.worker] = JoinInfo{j.node, j.domain, j.rank_name};
        if (st->coordinator) forward(j.worker, st->ranks[j.worker]);
      },
      [st](runtime::membership_atom, const runtime::MembershipEvent& e) {
        if (e.kind == runtime::MembershipKind::kWorkerAlive) st->queue->Push({"spawn", e.subject});
        if (e.kind == runtime::MembershipKind::kWorkerDown) st->ranks.erase(e.subject);
        if (e.kind == runtime::MembershipKind::kWorkerDown ||
            e.kind == runtime::MembershipKind::kWorkerExit) {
          st->queue->Push({"rank_gone", e.subject});
        }
        if (e.kind == runtime::MembershipKind::kWorkerDown ||
            e.kind == runtime::MembershipKind::kWorkerExit ||
            e.kind == runtime::MembershipKind::kNodeDead) {
          const base::SupervisionEvent exit = e.ToProcessExit("head");
          if (st->events) st->events->Write(exit);
          if (!st->finished) *st->out << train::EventProgressLine(exit) << std::endl;
        }
      },
      [st, heard](const ProgressLine& line) {
        heard();
        *st->out << line.text << std::endl;
      },
      [st](const AddNode& a) {
        st->queue->Push({"add_node", a.name});
      },
      [st](const JobReport& r) { st->Finish(r); },
      [st](const JobFailed& f) {
        const absl::Status s = f.status.ToStatus();
        // A preemption is no failure: it says so as it is (IsPreempted).
        st->Finish(
            train::IsPreempted(s)
                ? s
                : absl::Status(s.code(), absl::StrCat("training job failed: ", s.message())));
      },
  };
}

absl::Status PrepareData(train::JobSpec& spec, std::ostream& out) {
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
  // Into a private directory, then renamed into place: concurrent jobs sharing a data_dir never
  // read a half-written shard (the one that loses the race keeps the winner's, which is equal).
  const std::string tmp = absl::StrCat(spec.model.data_dir, ".tmp.", getpid());
  absl::StatusOr<model::PreparedDataset> ds = model::PrepareDataset(files, tmp, 512);
  if (!ds.ok()) return ds.status();
  std::filesystem::rename(tmp, spec.model.data_dir, ec);
  if (ec) std::filesystem::remove_all(tmp, ec);
  return absl::OkStatus();
}

}  // namespace

runtime::RuntimeOptions DefaultDriverRuntimeOptions() {
  runtime::RuntimeOptions ro;
  ro.log_events = false;
  ro.shutdown_timeout = std::chrono::seconds(2);
  return ro;
}

namespace {

// The job's directories, per-run records and data, ready before any process starts; bad model
// settings fail here.
absl::Status PrepareJob(train::JobSpec& spec, std::ostream& out) {
  std::error_code ec;
  spec.work_dir = std::filesystem::absolute(spec.work_dir).lexically_normal().string();
  if (!spec.checkpoint_dir.empty()) {
    spec.checkpoint_dir = std::filesystem::absolute(spec.checkpoint_dir).string();
  }
  std::filesystem::create_directories(spec.work_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("job.work_dir: cannot create ", spec.work_dir, ": ", ec.message()));
  }
  // Per-run records start empty; checkpoints persist (a new run resumes from them).
  std::filesystem::remove_all(spec.work_dir + "/serve", ec);
  for (const char* f : {"/logs/events.log", "/coordinator.state", "/commits.log"}) {
    std::filesystem::remove(spec.work_dir + f, ec);
  }
  TROUPE_RETURN_IF_ERROR(PrepareData(spec, out));
  if (spec.model.type == "gpt") {
    spec.model.data_dir = std::filesystem::absolute(spec.model.data_dir).string();
  }
  // Bad model settings fail here, before any process starts — [eval] included (its shard opens
  // with the model; a model without EvalLoss is refused).
  auto probe = train::TrainableRegistry::Global().Create(spec.model);
  if (!probe.ok()) return probe.status();
  if (spec.eval_every > 0) {
    if (absl::StatusOr<double> e = (*probe)->EvalLoss(0); !e.ok()) {
      return absl::Status(e.status().code(),
                          absl::StrCat("eval.every = ", spec.eval_every, ": model.type \"",
                                       spec.model.type, "\": ", e.status().message()));
    }
  }
  return absl::OkStatus();
}

const std::vector<std::string> kNodeArgs = {"--grace", "5s"};

struct JobCluster {
  std::unique_ptr<runtime::LocalCluster> local;  // the embedded one, or null
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int gpus = 0;           // embedded, model on CUDA: this machine's GPUs
  int ranks_per_gpu = 1;  // worker nodes that may share one of them
  // Its spot nodes' arguments: with a spot-notice among the job's faults, each serves its cloud's
  // metadata itself (simulated AWS) and watches it, as a spot machine watches its cloud's.
  std::vector<std::string> spot_args = kNodeArgs;

  // An embedded worker node (spot); with GPUs, the first place no live node holds, GPUs filled
  // round-robin (every GPU's slot 0, then every GPU's slot 1, ...): a GPU is shared only once
  // every GPU has a rank.
  // [lowcomm] groups: the embedded cluster's worker nodes in that many zones — n<i> in g<i·G/W>;
  // a joining node (join-worker@S[:Z], named "join<S>" or "join<S>-g<Z>") in zone g<Z>, or in
  // the zones in turn.
  int zones = 0, workers = 0, joins = 0;
  std::string Labels(const std::string& name) {
    if (zones == 0) return "spot=true";
    int zone = 0;
    if (const size_t g = name.rfind("-g"); g != std::string::npos) {
      zone = std::atoi(name.c_str() + g + 2);
    } else if (name.size() > 1 && name[0] == 'n') {
      zone = std::atoi(name.c_str() + 1) * zones / std::max(1, workers);
    } else {
      zone = joins++ % zones;
    }
    return absl::StrCat("spot=true,zone=g", zone);
  }

  absl::StatusOr<pid_t> AddWorkerNode(const std::string& name) {
    if (gpus == 0) return local->AddNode(name, 1, "cpu=1", Labels(name), spot_args);
    for (int i = 0; i < gpus * ranks_per_gpu; ++i) {
      bool taken = false;
      for (const auto& [node, place] : place_of_) taken |= place == i && local->nodes().count(node);
      if (taken) continue;
      place_of_[name] = i;
      return local->AddNode(name, 1, "cpu=1,gpu=1", "spot=true", spot_args,
                            EmbeddedGpuEnvironment(i % gpus, i / gpus, ranks_per_gpu));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("node ", name, ": every one of this machine's ", gpus, " GPUs has ",
                     ranks_per_gpu, " node(s) ([elastic] ranks_per_gpu)"));
  }

 private:
  std::map<std::string, int> place_of_;  // node -> slot * gpus + gpu
};

// The cluster: a running one, or the embedded default — a head, one spot node per worker (so a
// node can be preempted on its own) and an on-demand node for the coordinator.
absl::StatusOr<JobCluster> StartCluster(const train::JobSpec& spec, const TrainOptions& options,
                                        std::ostream& out) {
  JobCluster c;
  if (options.head.empty()) {
    runtime::LocalCluster::Options lo;
    lo.binary = options.binary;
    lo.workers = 0;
    lo.cluster.log_dir = spec.work_dir + "/logs";
    lo.cluster.head_grace = options.head_grace;
    // Every process of the job on this machine: a head, a node agent and a worker per worker
    // and for the coordinator, the driver.
    lo.cluster.ScaleForSharedHost(2 * spec.workers + 4,
                                  static_cast<int>(std::thread::hardware_concurrency()));
    // A head that dies is started again from its store (as systemd would): the job goes on.
    lo.head_store = true;
    lo.keep_head = true;
    lo.extra_args = options.runtime.TlsArgs();  // head, nodes and workers: the driver's files
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::LocalCluster> c_or,
                            runtime::LocalCluster::Start(lo));
    c.local = std::move(c_or);
    c.port = c.local->port();
    for (const train::Fault& f : spec.faults) {
      if (f.kind != train::FaultKind::kSpotNotice || c.spot_args.size() > kNodeArgs.size())
        continue;
      c.spot_args.insert(c.spot_args.end(), {"--preemption_source", "aws", "--metadata_endpoint",
                                             "simulate", "--preemption_poll", "200ms"});
    }
    // A model on CUDA: each worker node gets a GPU of its own, or a share of one (ranks_per_gpu).
    absl::StatusOr<train::Device> device = train::ParseDevice(spec.model.device);
    if (device.ok() && device->is_cuda()) {
      absl::StatusOr<int> gpus = train::CudaDeviceCount();
      if (!gpus.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("model.device = \"", spec.model.device, "\": ", gpus.status().message()));
      }
      TROUPE_RETURN_IF_ERROR(CheckEmbeddedGpuCount(spec, *gpus));
      c.gpus = *gpus;
      c.ranks_per_gpu = spec.ranks_per_gpu;
    }
    c.zones = spec.lowcomm_groups;
    c.workers = spec.workers;
    for (int i = 0; i < spec.workers; ++i) {
      absl::StatusOr<pid_t> pid = c.AddWorkerNode(absl::StrCat("n", i));
      if (!pid.ok()) return pid.status();
    }
    absl::StatusOr<pid_t> pid = c.local->AddNode("coord", 1, "cpu=1", "", kNodeArgs);
    if (!pid.ok()) return pid.status();
    out << "embedded cluster: head 127.0.0.1:" << c.port
        << (options.runtime.tls() ? " (mutual TLS), " : ", ") << spec.workers
        << " worker nodes and a coordinator node; logs in " << lo.cluster.log_dir << std::endl;
  } else {
    TROUPE_ASSIGN_OR_RETURN(auto hp, runtime::ParseHostPort(options.head));
    c.host = hp.first;
    c.port = hp.second;
  }
  return c;
}

// Workers register asynchronously: waits for all of the embedded cluster's `want` workers.
absl::Status WaitForWorkers(runtime::ClusterClient& client, const train::JobSpec& spec,
                            size_t want) {
  const absl::Time deadline = base::MonotonicNow() + spec.timeouts.cluster_start;
  size_t alive = 0;
  while (base::MonotonicNow() < deadline) {
    absl::StatusOr<std::vector<runtime::MemberInfo>> members = client.Members();
    alive = 0;
    if (members.ok()) {
      for (const runtime::MemberInfo& m : *members) {
        if (m.kind == runtime::MemberKind::kWorker && m.state == runtime::MemberState::kAlive) {
          ++alive;
        }
      }
    }
    if (alive >= want) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("embedded cluster: ", alive, " of ", want, " workers alive within ",
                   absl::FormatDuration(spec.timeouts.cluster_start),
                   " (timeouts.cluster_start; logs in ", spec.work_dir, "/logs)"));
}

// The job supervisor: the coordinator, restarted (on another worker, placed by the scheduler)
// if its process dies. It avoids spot nodes while an on-demand one can take it.
absl::StatusOr<runtime::ActorRef> StartJobSupervisor(runtime::Runtime& rt,
                                                     const train::JobSpec& spec,
                                                     const std::string& spec_text,
                                                     const caf::actor& driver,
                                                     const std::string& job_id) {
  const std::string prefix = JobActorPrefix(spec, job_id);
  runtime::SupervisorSpec sup;
  sup.name = absl::StrCat(prefix, "job");
  sup.strategy = runtime::Strategy::kOneForOne;
  runtime::ChildSpec coordinator = runtime::ChildSpec::Actor(
      absl::StrCat(prefix, "coordinator"), kCoordinatorActorType,
      caf::make_message(spec_text, driver), runtime::RestartType::kTransient);
  runtime::Placement where;
  where.strategy = runtime::PlacementStrategy::kSpread;
  where.spot = runtime::SpotPreference::kAvoid;
  coordinator.placement = where;
  coordinator.backoff.initial = std::chrono::milliseconds(1);
  coordinator.backoff.max = std::chrono::seconds(1);
  sup.intensity = {10, std::chrono::seconds(30)};
  sup.children.push_back(coordinator);
  return rt.StartSupervisor(sup);
}

// The head lost (`why`): connects again within options.head_grace and points the driver actor
// and the job's reporter at the head now there.
absl::Status RejoinHead(const std::string& why, const TrainOptions& options,
                        runtime::ClusterClient& client, const caf::actor& driver, DriverState& st,
                        std::ostream& out) {
  out << "head lost (" << why << "): rejoining " << client.address() << " within "
      << absl::FormatDuration(absl::FromChrono(options.head_grace)) << std::endl;
  const auto t0 = std::chrono::steady_clock::now();
  if (absl::Status s = client.Reconnect(options.head_grace); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("training job failed: ", s.message()));
  }
  caf::anon_send(driver, head_atom::value, client.head());
  if (st.reporter != nullptr) st.reporter->SetHead(client.head());
  out << "head back: rejoined " << client.address() << " after "
      << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
             .count()
      << " ms" << std::endl;
  return absl::OkStatus();
}

// Until the coordinator reports: carries out its requests (nodes to add, ranks to spawn) and
// gives up on a coordinator silent for timeouts.driver_silence.
absl::StatusOr<JobReport> AwaitReport(const train::JobSpec& spec, const TrainOptions& options,
                                      JobCluster& cluster, runtime::ClusterClient& client,
                                      const caf::actor& driver, DriverState& st, DriverQueue& queue,
                                      RankSpawner& ranks,
                                      std::future<absl::StatusOr<JobReport>>& result,
                                      std::ostream& out) {
  const int64_t silence_ns = absl::ToInt64Nanoseconds(spec.timeouts.driver_silence);
  absl::Time next_grow = base::MonotonicNow() + absl::Seconds(1);
  while (result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    std::optional<DriverRequest> req = queue.Pop(std::chrono::milliseconds(50));
    // Capacity freed by another job reaches no event here: asked again every second.
    if (base::MonotonicNow() >= next_grow && ranks.ShouldPoll()) {
      ranks.Grow();
      next_grow = base::MonotonicNow() + absl::Seconds(1);
    }
    if (req && req->kind == "add_node" && cluster.local != nullptr) {
      absl::StatusOr<pid_t> pid = cluster.AddWorkerNode(req->arg);
      if (!pid.ok())
        out << "warning: adding node " << req->arg << ": " << pid.status() << std::endl;
    } else if (req && req->kind == "spawn") {
      ranks.Grow();
    } else if (req && req->kind == "rank_gone") {
      ranks.Forget(req->arg);
    } else if (req && req->kind == "head_lost") {
      TROUPE_RETURN_IF_ERROR(RejoinHead(req->arg, options, client, driver, st, out));
      st.last_heard_ns = absl::ToUnixNanos(base::MonotonicNow());
    }
    if (absl::ToUnixNanos(base::MonotonicNow()) - st.last_heard_ns.load() > silence_ns) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no word from the coordinator for ", absl::FormatDuration(spec.timeouts.driver_silence),
          " (timeouts.driver_silence; is any worker left to run it?)"));
    }
  }
  return result.get();
}

// Stops an actor when the scope ends and waits (up to 5 s) until it is gone.
class StopOnExit {
 public:
  StopOnExit(caf::actor_system& sys, caf::actor actor) : sys_(sys), actor_(std::move(actor)) {}
  ~StopOnExit() {
    caf::scoped_actor self{sys_};
    self->monitor(actor_);
    self->send_exit(actor_, caf::exit_reason::user_shutdown);
    self->receive([](caf::down_msg&) {}, caf::after(std::chrono::seconds(5)) >> [] {});
  }
  StopOnExit(const StopOnExit&) = delete;
  StopOnExit& operator=(const StopOnExit&) = delete;

 private:
  caf::actor_system& sys_;
  caf::actor actor_;
};

void PrintSummary(const JobReport& r, std::ostream& out) {
  out << absl::StrFormat(
             "done: %d steps, final loss %.4f, world %d, %d generations, params crc32c "
             "%08x, steps lost %d",
             r.committed_steps, r.losses.empty() ? 0.0 : r.losses.back(), r.final_world,
             r.generations, r.final_params_crc32c, r.steps_lost)
      << (r.recovery_seconds >= 0 ? absl::StrFormat(", recovery %.3f s", r.recovery_seconds)
                                  : std::string())
      << std::endl;
}

// From the cluster's workers to the job's report: ranks, the coordinator, the wait.
absl::StatusOr<JobReport> Drive(const train::JobSpec& spec, const std::string& spec_text,
                                const TrainOptions& options, JobCluster& cluster,
                                runtime::ClusterClient& client, runtime::Runtime& rt,
                                const caf::actor& driver, DriverState& st, DriverQueue& queue,
                                std::future<absl::StatusOr<JobReport>>& result,
                                const std::string& job_id, std::ostream& out) {
  // A running cluster's job waits for its ranks in the head's queue (RankSpawner::Admit), with
  // no deadline: it says why it waits.
  if (cluster.local != nullptr) {
    TROUPE_RETURN_IF_ERROR(WaitForWorkers(client, spec, static_cast<size_t>(spec.workers) + 1));
  }
  RankSpawner ranks(client, spec, spec_text, cluster.local != nullptr, driver, job_id, out);
  TROUPE_RETURN_IF_ERROR(ranks.Admit(
      [&result] { return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
      [&](const absl::Status& why) {
        return RejoinHead(std::string(why.message()), options, client, driver, st, out);
      }));
  if (result.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return result.get();
  TROUPE_ASSIGN_OR_RETURN(runtime::ActorRef sup,
                          StartJobSupervisor(rt, spec, spec_text, driver, job_id));
  caf::anon_send(driver, watch_supervisor_atom::value, sup.handle);
  absl::StatusOr<JobReport> report =
      AwaitReport(spec, options, cluster, client, driver, st, queue, ranks, result, out);
  if (report.ok()) PrintSummary(*report, out);
  return report;
}

}  // namespace

absl::Status CheckEmbeddedGpuCount(const train::JobSpec& spec, int gpus) {
  if (gpus <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("model.device = \"", spec.model.device,
                                                      "\": this machine has no CUDA device"));
  }
  if (int64_t{gpus} * spec.ranks_per_gpu >= spec.workers) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("elastic.workers: expected at most ", int64_t{gpus} * spec.ranks_per_gpu,
                   " with model.device = \"", spec.model.device, "\" (this machine has ", gpus,
                   " GPU(s) and elastic.ranks_per_gpu = ", spec.ranks_per_gpu,
                   "; set [elastic] ranks_per_gpu = ", (spec.workers + gpus - 1) / gpus,
                   " to let that many ranks share a GPU), got ", spec.workers));
}

std::map<std::string, std::string> EmbeddedGpuEnvironment(int gpu, int slot, int ranks_per_gpu) {
  std::map<std::string, std::string> env = {{"CUDA_VISIBLE_DEVICES", absl::StrCat(gpu)}};
  if (ranks_per_gpu > 1) {
    // Per slot, not per GPU: ranks that share a GPU are different hosts to NCCL, while ranks on
    // different GPUs (one slot) stay one host, with NCCL's direct paths between their GPUs.
    env["NCCL_HOSTID"] = absl::StrCat("troupe-slot", slot);
    env["NCCL_SOCKET_IFNAME"] = "lo";
    env["NCCL_IB_DISABLE"] = "1";
  }
  return env;
}

absl::StatusOr<JobReport> RunTrainingJob(train::JobSpec spec, const TrainOptions& options) {
  // Every line printed also goes to the job's record on the head (`troupe job logs`).
  JobReporter reporter(spec, options.job_id);
  LineTee tee(options.progress != nullptr ? *options.progress : std::cout,
              [&reporter](std::string line) { reporter.Line(std::move(line)); });
  std::ostream out(&tee);
  TROUPE_RETURN_IF_ERROR(PrepareJob(spec, out));
  const std::string spec_text = spec.ToToml();
  TROUPE_ASSIGN_OR_RETURN(JobCluster cluster, StartCluster(spec, options, out));
  runtime::ActorRegistry registry;
  TROUPE_RETURN_IF_ERROR(RegisterTrainingActors(registry));
  runtime::RuntimeOptions ro = options.runtime;
  ro.network = true;
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Runtime> rt,
                          runtime::Runtime::Create(std::move(registry), ro));
  const std::string events_path = train::EventLogPath(spec.work_dir);
  auto events = std::make_shared<train::EventLog>(events_path);
  rt->SetEventSink([events](const base::SupervisionEvent& e) { events->Write(e); });
  TROUPE_ASSIGN_OR_RETURN(runtime::ClusterClient client,
                          runtime::ClusterClient::Connect(*rt, cluster.host, cluster.port));

  DriverQueue queue;
  auto st = std::make_shared<DriverState>();
  st->out = &out;
  st->queue = &queue;
  st->client = &client;
  st->last_heard_ns = absl::ToUnixNanos(base::MonotonicNow());
  st->events = events;
  st->events_path = events_path;
  std::future<absl::StatusOr<JobReport>> result = st->result.get_future();
  // Messages between this process and the coordinator or ranks take connections of their own,
  // not the head's: they go on while a lost head is replaced.
  client.ConnectDirectly();
  caf::actor driver = rt->system().spawn(DriverActor, st);
  // From here the driver actor also prints the coordinator's exits that the supervisor restarts
  // and its escalation (by the driver's address: the runtime's sink keeps no actor alive).
  rt->SetEventSink([events, to = driver.address()](const base::SupervisionEvent& e) {
    events->Write(e);
    const bool restart = e.event == "exit" && !absl::StartsWith(e.decision, "no restart");
    if (!restart && e.event != "escalate") return;
    if (caf::actor d = caf::actor_cast<caf::actor>(to)) {
      caf::anon_send(d, supervision_line_atom::value, train::EventProgressLine(e),
                     restart ? e.reason : std::string());
    }
  });
  // On every way out of here, the driver actor is gone before the locals it points to are (and
  // before the runtime's shutdown, which waits for every actor).
  StopOnExit stop_driver(rt->system(), driver);
  TROUPE_RETURN_IF_ERROR(reporter.Connect(rt->system(), client.head(), driver));
  st->reporter = &reporter;
  out << "job " << reporter.id() << " on the head at " << client.address() << std::endl;
  absl::StatusOr<JobReport> report = Drive(spec, spec_text, options, cluster, client, *rt, driver,
                                           *st, queue, result, reporter.id(), out);
  reporter.End(report);
  return report;
}

}  // namespace troupe::actors
