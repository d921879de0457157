// rank_spawner.h — private to actors/: a training job's ranks, as its driver (training.cc) asks
// the head for them (runtime::RankGang) and starts them.
#ifndef TROUPE_ACTORS_RANK_SPAWNER_H_
#define TROUPE_ACTORS_RANK_SPAWNER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "protocol.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/train/job_spec.h"
#include "troupe/train/trainable.h"

namespace troupe::actors::internal {

// A worker's failure domain: its node's zone label where it has one, else its host (two nodes
// on one machine share it), else the node.
inline std::string FailureDomain(const runtime::MemberInfo& m) {
  for (absl::string_view kv : absl::StrSplit(m.labels, ',', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&kv, "zone=")) return absl::StrCat("zone:", kv);
  }
  return m.host.empty() ? absl::StrCat("node:", m.node) : absl::StrCat("host:", m.host);
}

// The names of a job's actors on its cluster start so ("<spec name>.<job id>."): its ranks are
// "<prefix>rank.<worker>" (the head reads the job from a rank's name, runtime::RankGang).
inline std::string JobActorPrefix(const train::JobSpec& spec, const std::string& job_id) {
  return absl::StrCat(spec.name, ".", job_id, ".");
}

// The job's ranks: asked of the head as a gang (ClusterClient::ReserveRanks: between min_workers
// and the largest world at once, or the job waits queued, saying why), then a rank actor spawned
// on each worker granted; more as workers join or are freed, up to the largest world.
class RankSpawner {
 public:
  RankSpawner(runtime::ClusterClient& client, const train::JobSpec& spec, std::string spec_text,
              bool embedded, caf::actor driver, std::string job_id, std::ostream& out)
      : client_(client),
        spec_(spec),
        spec_text_(std::move(spec_text)),
        embedded_(embedded),
        driver_(std::move(driver)),
        job_id_(std::move(job_id)),
        out_(out) {}

  // Ranks it started that the coordinator never took (the job stopped while they started, or
  // failed before its coordinator ran) stop with it; the coordinator's own stop makes this moot.
  ~RankSpawner() {
    for (const auto& [w, rank] : handles_)
      caf::anon_send_exit(rank, caf::exit_reason::user_shutdown);
  }
  RankSpawner(const RankSpawner&) = delete;
  RankSpawner& operator=(const RankSpawner&) = delete;

  // Until the head grants the job its minimum, or `done` (the job was stopped while it waited).
  // A head lost meanwhile is rejoined (`rejoin`), and the job asks the head now there.
  absl::Status Admit(const std::function<bool()>& done,
                     const std::function<absl::Status(const absl::Status&)>& rejoin) {
    std::string said;
    while (!done()) {
      absl::StatusOr<runtime::RankGrant> g = client_.ReserveRanks(Gang(false));
      if (!g.ok() && (absl::IsUnavailable(g.status()) || absl::IsDeadlineExceeded(g.status()))) {
        TROUPE_RETURN_IF_ERROR(rejoin(g.status()));
        continue;
      }
      if (!g.ok()) return g.status();
      if (!g->workers.empty()) {
        if (!said.empty()) out_ << "admitted: " << g->workers.size() << " ranks" << std::endl;
        Spawn(g->workers);
        return absl::OkStatus();
      }
      if (g->waiting != said) out_ << "queued: " << g->waiting << std::endl;
      said = g->waiting;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return absl::OkStatus();
  }

  // More ranks where the head grants them (a worker joined, another job freed some). A head
  // that does not answer within a second is asked again later (a lost one is rejoined
  // meanwhile, AwaitReport).
  void Grow() {
    if (static_cast<int32_t>(spawned_.size()) >= MaxRanks()) return;
    absl::StatusOr<runtime::RankGrant> g =
        client_.ReserveRanks(Gang(true), std::chrono::seconds(1));
    if (g.ok()) Spawn(g->workers);
  }
  // On a shared cluster capacity freed by another job reaches the driver as no event.
  bool ShouldPoll() const { return !embedded_ && !Full(); }
  // `worker`'s rank is gone (its worker died, or the rank was handed over).
  void Forget(const std::string& worker) {
    spawned_.erase(worker);
    handles_.erase(worker);
  }
  bool Full() const { return static_cast<int32_t>(spawned_.size()) >= MaxRanks(); }

 private:
  int32_t MaxRanks() const {
    return static_cast<int32_t>(std::min<int64_t>(
        spec_.max_workers, int64_t{spec_.model.microbatches} * spec_.pipeline_stages));
  }
  runtime::RankGang Gang(bool grow) const {
    runtime::RankGang g;
    g.job = job_id_;
    g.prefix = absl::StrCat(JobActorPrefix(spec_, job_id_), "rank.");
    // On a shared cluster the coordinator lives beside one of the job's own ranks; the embedded
    // cluster keeps a node for it.
    if (!embedded_) g.actors = JobActorPrefix(spec_, job_id_);
    g.min = std::min(spec_.min_workers, MaxRanks());
    g.max = MaxRanks();
    g.priority = spec_.priority;
    g.grow = grow;
    // A rank takes a cpu slot of its node by default (the coordinator takes none, so spread
    // placement puts it where no rank is); on the embedded cluster, only the worker nodes (spot),
    // never the coordinator's.
    absl::StatusOr<train::Device> device = train::ParseDevice(spec_.model.device);
    g.each.resources = !spec_.rank_resources.empty()      ? spec_.rank_resources
                       : device.ok() && device->is_cuda() ? "cpu=1,gpu=1"
                                                          : "cpu=1";
    g.each.strategy = runtime::PlacementStrategy::kSpread;
    g.each.spot = spec_.rank_spot == "avoid"  ? runtime::SpotPreference::kAvoid
                  : spec_.rank_spot == "none" ? runtime::SpotPreference::kNone
                                              : runtime::SpotPreference::kPrefer;
    g.each.labels = embedded_ ? "spot=true" : spec_.rank_labels;
    return g;
  }

  void Spawn(const std::vector<std::string>& workers) {
    if (workers.empty()) return;
    absl::StatusOr<std::vector<runtime::MemberInfo>> members = client_.Members();
    if (!members.ok()) return;  // the reservations lapse; asked again at the next Grow
    const runtime::RankGang gang = Gang(false);
    for (const std::string& w : workers) {
      auto m = std::find_if(members->begin(), members->end(),
                            [&](const runtime::MemberInfo& x) { return x.id == w; });
      if (m == members->end() || spawned_.count(w)) continue;
      spawned_.insert(w);
      const std::string name = gang.prefix + absl::StrReplaceAll(w, {{"/", "."}});
      runtime::Placement at = gang.each;
      at.worker = w;
      absl::StatusOr<runtime::ActorRef> ref =
          client_.Spawn(kRankActorType, caf::make_message(spec_text_, w, m->address), name, at);
      if (!ref.ok()) {
        out_ << "warning: cannot start a rank on " << w << ": " << ref.status() << std::endl;
        spawned_.erase(w);
        continue;
      }
      handles_[w] = ref->handle;
      // The labels are the node's (a worker's member record has none of its own).
      auto node = std::find_if(members->begin(), members->end(),
                               [&](const runtime::MemberInfo& x) { return x.id == m->node; });
      caf::anon_send(driver_, RankJoined{w, m->node,
                                         FailureDomain(node != members->end() ? *node : *m), name});
    }
  }

  runtime::ClusterClient& client_;
  const train::JobSpec& spec_;
  const std::string spec_text_;
  const bool embedded_;
  caf::actor driver_;
  const std::string job_id_;
  std::ostream& out_;
  std::set<std::string> spawned_;
  std::map<std::string, caf::actor> handles_;  // by worker
};

}  // namespace troupe::actors::internal

#endif  // TROUPE_ACTORS_RANK_SPAWNER_H_
