// The driver of a training job (see training.h): the cluster (embedded or remote), the rank
// actors on every worker, and the job supervisor whose child is the coordinator.
#include "troupe/actors/training.h"

#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "protocol.h"
#include "troupe/model/corpus.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/runtime.h"
#include "troupe/runtime/supervisor.h"

namespace troupe::actors {
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
  int64_t node_pid = 0;
  std::string rank;  // the rank actor's cluster-wide name
};

// What the driver actor shares with the driver thread.
struct DriverState {
  std::ostream* out = nullptr;
  DriverQueue* queue = nullptr;
  runtime::ClusterClient* client = nullptr;
  caf::actor coordinator;
  std::map<std::string, JoinInfo> ranks;  // live rank actors by worker id
  std::promise<absl::StatusOr<JobReport>> result;
  bool finished = false;
  std::atomic<int64_t> last_heard_ns{0};
};

// Relays between the coordinator (wherever the supervisor placed it) and this process: prints its
// lines, replays the known ranks to every new incarnation, carries out its requests.
caf::behavior DriverActor(caf::event_based_actor* self, std::shared_ptr<DriverState> st) {
  auto heard = [st] { st->last_heard_ns.store(absl::ToUnixNanos(absl::Now())); };
  auto forward = [self, st](const std::string& w, const JoinInfo& j) {
    self->send(st->coordinator, join_atom::value, w, j.node, j.node_pid, j.rank);
  };
  // Without the head nothing can be placed, restarted or reported: fail at once rather than wait
  // out the silence limit.
  self->monitor(st->client->head());
  self->set_down_handler([self, st](caf::down_msg& m) {
    if (st->finished || m.source != st->client->head()) return;
    st->finished = true;
    st->result.set_value(absl::UnavailableError(absl::StrCat(
        "training job failed: lost the cluster's head (", self->system().render(m.reason), ")")));
    st->queue->Push({"done", ""});
  });
  return {
      [self, st, heard, forward](hello_atom, const caf::actor& coordinator) {
        heard();
        st->coordinator = coordinator;
        st->client->Subscribe(coordinator);
        self->send(coordinator, known_atom::value, static_cast<int32_t>(st->ranks.size()),
                   st->client->head());
        for (const auto& [w, j] : st->ranks) forward(w, j);
      },
      [st, forward](join_atom, const std::string& worker, const std::string& node,
                    int64_t node_pid, const std::string& rank) {
        st->ranks[worker] = JoinInfo{node, node_pid, rank};
        if (st->coordinator) forward(worker, st->ranks[worker]);
      },
      [st](runtime::membership_atom, const runtime::MembershipEvent& e) {
        if (e.kind == "worker_alive") st->queue->Push({"spawn", e.subject});
        if (e.kind == "worker_down") st->ranks.erase(e.subject);
      },
      [st, heard](progress_atom, const std::string& line) {
        heard();
        *st->out << line << std::endl;
      },
      [st](add_node_atom, const std::string& name) { st->queue->Push({"add_node", name}); },
      [st](report_atom, int64_t crc, int64_t n, int64_t steps, double last_loss, int32_t gens,
           int32_t world, double recovery, int64_t lost, double tokens_per_second) {
        if (st->finished) return;
        st->finished = true;
        JobReport r;
        r.final_params_crc32c = static_cast<uint32_t>(crc);
        r.num_params = n;
        r.committed_steps = steps;
        r.losses = {last_loss};
        r.generations = gens;
        r.final_world = world;
        r.recovery_seconds = recovery;
        r.steps_lost = lost;
        r.tokens_per_second = tokens_per_second;
        st->result.set_value(r);
        st->queue->Push({"done", ""});
      },
      [st](failed_atom, const std::string& why) {
        if (st->finished) return;
        st->finished = true;
        st->result.set_value(absl::UnavailableError(absl::StrCat("training job failed: ", why)));
        st->queue->Push({"done", ""});
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

absl::StatusOr<JobReport> RunTrainingJob(JobSpec spec, const TrainOptions& options) {
  std::ostream& out = options.progress != nullptr ? *options.progress : std::cout;
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
  for (const char* f : {"/chaos.log", "/coordinator.state", "/commits.log"}) {
    std::filesystem::remove(spec.work_dir + f, ec);
  }
  if (absl::Status s = PrepareData(spec, out); !s.ok()) return s;
  if (spec.model.type == "gpt") {
    spec.model.data_dir = std::filesystem::absolute(spec.model.data_dir).string();
  }
  // Bad model settings fail here, before any process starts.
  if (auto probe = TrainableRegistry::Global().Create(spec.model); !probe.ok()) {
    return probe.status();
  }
  const std::string spec_text = spec.ToToml();

  // The cluster: a running one, or the embedded default — a head, one spot node per worker (so a
  // node can be preempted on its own) and an on-demand node for the coordinator.
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
      absl::StatusOr<pid_t> pid =
          local->AddNode(absl::StrCat("n", i), 1, "cpu=1", "spot=true", node_args);
      if (!pid.ok()) return pid.status();
    }
    absl::StatusOr<pid_t> pid = local->AddNode("coord", 1, "cpu=1", "", node_args);
    if (!pid.ok()) return pid.status();
    out << "embedded cluster: head 127.0.0.1:" << port << ", " << spec.workers
        << " worker nodes and a coordinator node; logs in " << lo.cluster.log_dir << std::endl;
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
  if (absl::Status s = RegisterTrainingActors(registry); !s.ok()) return s;
  runtime::RuntimeOptions ro;
  ro.network = true;
  ro.log_events = false;
  // This process owns only the driver relay and the job supervisor, neither with state to save;
  // when the cluster is gone, waiting long for their remote children to confirm helps no one.
  ro.shutdown_timeout = std::chrono::seconds(2);
  absl::StatusOr<std::unique_ptr<runtime::Runtime>> rt =
      runtime::Runtime::Create(std::move(registry), ro);
  if (!rt.ok()) return rt.status();
  absl::StatusOr<runtime::ClusterClient> client =
      runtime::ClusterClient::Connect(**rt, host, port);
  if (!client.ok()) return client.status();

  DriverQueue queue;
  auto st = std::make_shared<DriverState>();
  st->out = &out;
  st->queue = &queue;
  st->client = &*client;
  st->last_heard_ns = absl::ToUnixNanos(absl::Now());
  std::future<absl::StatusOr<JobReport>> result = st->result.get_future();
  caf::actor driver = (*rt)->system().spawn(DriverActor, st);
  client->Subscribe(driver);

  // The embedded cluster's workers register asynchronously: wait for all of them.
  if (local != nullptr) {
    const size_t want = static_cast<size_t>(spec.workers) + 1;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    size_t alive = 0;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<runtime::MemberInfo>> members = client->Members();
      alive = 0;
      if (members.ok()) {
        for (const runtime::MemberInfo& m : *members) {
          alive += m.kind == "worker" && m.state == "alive" ? 1 : 0;
        }
      }
      if (alive >= want) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (alive < want) {
      return absl::DeadlineExceededError(absl::StrCat(
          "embedded cluster: ", alive, " of ", want, " workers joined within 60 s (logs in ",
          spec.work_dir, "/logs)"));
    }
  }

  // A rank actor on every live worker not yet serving this job (except the coordinator's node).
  std::set<std::string> spawned;
  const int run_id = static_cast<int>(getpid());
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
      if (local != nullptr && m.node == "coord") continue;
      spawned.insert(m.id);
      const std::string name =
          absl::StrCat(spec.name, ".", run_id, ".rank.", absl::StrReplaceAll(m.id, {{"/", "."}}));
      // A rank takes a cpu slot of its node (the coordinator takes none, so spread placement
      // puts it where no rank is).
      runtime::Placement at;
      at.worker = m.id;
      at.resources = "cpu=1";
      absl::StatusOr<runtime::ActorRef> ref =
          client->Spawn(kRankActorType, caf::make_message(spec_text, m.id), name, at);
      if (!ref.ok()) {
        out << "warning: cannot start a rank on " << m.id << ": " << ref.status() << std::endl;
        continue;
      }
      caf::anon_send(driver, join_atom::value, m.id, m.node, node_pids[m.node], name);
    }
  };
  spawn_ranks();

  // The job supervisor: the coordinator, restarted (on another worker, placed by the scheduler)
  // if its process dies. It avoids spot nodes while an on-demand one can take it.
  runtime::SupervisorSpec sup;
  sup.name = absl::StrCat(spec.name, ".", run_id, ".job");
  sup.strategy = runtime::Strategy::kOneForOne;
  runtime::ChildSpec coordinator = runtime::ChildSpec::Actor(
      absl::StrCat(spec.name, ".", run_id, ".coordinator"), kCoordinatorActorType,
      caf::make_message(spec_text, driver), runtime::RestartType::kTransient);
  runtime::Placement where;
  where.strategy = "spread";
  where.spot = "avoid";
  coordinator.placement = where;
  coordinator.backoff.initial = std::chrono::milliseconds(1);
  coordinator.backoff.max = std::chrono::seconds(1);
  sup.intensity = {10, std::chrono::seconds(30)};
  sup.children.push_back(coordinator);
  if (absl::StatusOr<runtime::ActorRef> s = (*rt)->StartSupervisor(sup); !s.ok()) return s.status();

  constexpr int64_t kSilenceLimitNs = int64_t{180} * 1000000000;
  while (result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    std::optional<DriverRequest> req = queue.Pop(std::chrono::milliseconds(50));
    if (req && req->kind == "add_node" && local != nullptr) {
      absl::StatusOr<pid_t> pid = local->AddNode(req->arg, 1, "cpu=1", "spot=true", node_args);
      if (!pid.ok()) out << "warning: adding node " << req->arg << ": " << pid.status() << std::endl;
    } else if (req && req->kind == "spawn") {
      spawn_ranks();
    }
    if (absl::ToUnixNanos(absl::Now()) - st->last_heard_ns.load() > kSilenceLimitNs) {
      caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
      return absl::DeadlineExceededError(
          "no word from the coordinator for 180 s (is any worker left to run it?)");
    }
  }
  absl::StatusOr<JobReport> report = result.get();
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
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
