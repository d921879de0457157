// The head's side of jobs' ranks (job_gang_atom in cluster.h): a job's driver asks for its ranks
// as a gang; the head reserves them on free workers or queues the job with why, and asks running
// jobs of lower priority to give ranks up for a queued one.
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "head_actor.h"
#include "internal/resources.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime::internal {
namespace {

constexpr auto kReservationLife = std::chrono::seconds(30);
// A queued job whose driver has not asked for this long no longer holds its place.
constexpr auto kQueueStale = std::chrono::seconds(10);
// How long a job asked to give ranks up has to hand them over before it is asked again.
constexpr auto kShrinkPatience = std::chrono::seconds(10);

std::string RankName(const std::string& prefix, const std::string& worker) {
  return prefix + absl::StrReplaceAll(worker, {{"/", "."}});
}

}  // namespace

caf::message_handler HeadActor::GangHandlers() {
  return {
      [this](job_gang_atom, const RankGang& g) -> caf::result<RankGrant> {
        if (g.min < 1 || g.max < g.min) {
          return StatusToError(absl::InvalidArgumentError(
              absl::StrCat("job ", g.job, ": ranks expected 1 <= min <= max, got min ", g.min,
                           ", max ", g.max)));
        }
        const Job* j = jobs_.Find(g.job);
        if (j == nullptr || JobEnded(j->state)) {
          return StatusToError(absl::FailedPreconditionError(
              absl::StrCat("job '", g.job, "' is not running on this head: no ranks for it")));
        }
        return HandleGang(g);
      },
  };
}

RankGrant HeadActor::HandleGang(const RankGang& g) {
  const Clock::time_point now = Clock::now();
  DropReservations([now](const Reservation& r) { return r.until < now; });
  Gang& gang = gangs_[g.job];
  gang.min = g.min;
  gang.max = g.max;
  gang.priority = g.priority;
  gang.actors = g.actors;
  const int32_t held = RanksOf(g.job);
  RankGrant out;
  if (held >= g.max) return out;
  auto q = queued_.find(g.job);
  const uint64_t seq = q != queued_.end() ? q->second.seq : ++queue_seq_;
  // A running job below its min (it lost ranks) takes back its min before any queued job.
  const bool reclaim = g.grow && held < g.min;
  std::string why = reclaim ? "" : QueuedAhead(g, seq);
  int32_t fit = 0;
  if (why.empty()) {
    std::vector<std::string> got = ReserveUpTo(g, reclaim ? g.min : g.max, &why);
    fit = static_cast<int32_t>(got.size());
    if (g.grow || held + fit >= g.min) {
      if (q != queued_.end()) queued_.erase(q);
      if (!g.grow) {
        if (jobs_.Find(g.job)->state == JobState::kQueued) {
          aout(this) << "troupe-head: job " << g.job << " admitted: " << fit << " ranks"
                     << std::endl;
        }
        jobs_.Admitted(g.job, g.priority);
        PutJob(g.job);
      }
      out.workers = std::move(got);
      return out;
    }
    const std::set<std::string> mine(got.begin(), got.end());
    DropReservations([&](const Reservation& r) { return r.job == g.job && mine.count(r.worker); });
    why = absl::StrCat(held + fit, " fit now: ", why);
  }
  if (g.grow) {
    out.waiting = why;
    return out;
  }
  QueuedJob& qj = queued_[g.job];
  qj.priority = g.priority;
  qj.seq = seq;
  qj.asked = now;
  const int64_t capacity = RankCapacity(g.each);
  qj.can_fit = capacity >= g.min;
  const std::string each = g.each.resources.empty() ? "no resources" : g.each.resources;
  out.waiting = qj.can_fit ? absl::StrCat("needs min_workers=", g.min, " ranks (", each,
                                          ", a worker each) at once; ", why)
                           : absl::StrCat("can never fit: needs min_workers=", g.min, " ranks (",
                                          each, ", a worker each), and the alive nodes could hold ",
                                          capacity, " if nothing else ran");
  out.can_fit = qj.can_fit;
  if (qj.why != out.waiting) {
    qj.why = out.waiting;
    aout(this) << "troupe-head: job " << g.job << " queued: " << out.waiting << std::endl;
    jobs_.Queued(g.job, out.waiting, g.priority);
    PutJob(g.job);
  }
  qj.missing = g.min - held - fit;
  if (qj.can_fit && QueuedAhead(g, seq).empty()) ShrinkFor(g.job, qj);
  return out;
}

// Each rank's node is the scheduler's pick (`each`'s strategy and spot preference) among the nodes
// with a free worker, in a failure domain (its zone, else the node) holding none of the job's
// ranks while there is one: a job's ranks spread over zones first, then nodes.
std::vector<std::string> HeadActor::ReserveUpTo(const RankGang& g, int32_t cap, std::string* why) {
  std::vector<std::string> got;
  std::vector<std::string> full;       // nodes whose alive workers all hold a rank
  std::set<std::string> nodes, zones;  // the job's ranks' nodes and zones
  auto note = [&](const std::string& node) {
    nodes.insert(node);
    std::optional<scheduler::NodeView> v = sched_.Node(node);
    if (!v) return;
    if (auto z = v->labels.find(scheduler::kZoneLabel); z != v->labels.end())
      zones.insert(z->second);
  };
  for (const auto& [name, job] : rank_job_) {
    const MemberInfo* w = job == g.job ? core_.Find(RankWorker(name)) : nullptr;
    if (w != nullptr) note(w->node);
  }
  const std::string probe = absl::StrCat(g.job, "#probe");
  auto place = [&](bool new_domain) -> absl::StatusOr<scheduler::ActorDecision> {
    absl::StatusOr<scheduler::ActorRequest> req = MakeActorRequest(probe, g.each, "");
    if (!req.ok()) return req.status();
    using Op = scheduler::LabelTerm::Op;
    if (!full.empty()) req->selector.push_back({kNodeLabel, Op::kNotIn, full});
    if (new_domain && !nodes.empty()) {
      req->selector.push_back({kNodeLabel, Op::kNotIn, {nodes.begin(), nodes.end()}});
    }
    if (new_domain && !zones.empty()) {
      req->selector.push_back({scheduler::kZoneLabel, Op::kNotIn, {zones.begin(), zones.end()}});
    }
    return sched_.PlaceActor(*req);
  };
  const int32_t held = RanksOf(g.job);
  while (held + static_cast<int32_t>(got.size()) < cap) {
    absl::StatusOr<scheduler::ActorDecision> d = place(true);
    if (d.ok() && !d->placed()) d = place(false);
    if (!d.ok() || !d->placed()) {
      *why = !d.ok() ? std::string(d.status().message()) : d->unschedulable->reason;
      if (!full.empty()) {
        absl::StrAppend(why, "; every worker of ", absl::StrJoin(full, ", "), " holds a rank");
      }
      break;
    }
    (void)sched_.ReleaseActor(probe);
    const std::string worker = FreeRankWorker(d->node, g.job);
    if (worker.empty()) {
      full.push_back(d->node);
      continue;
    }
    const std::string name = RankName(g.prefix, worker);
    absl::StatusOr<scheduler::ActorRequest> pinned = MakeActorRequest(name, g.each, d->node);
    absl::StatusOr<scheduler::ActorDecision> at =
        pinned.ok() ? sched_.PlaceActor(*pinned) : pinned.status();
    if (!at.ok() || !at->placed()) {
      *why = absl::StrCat("cannot hold a rank on ", d->node, ": ",
                          !at.ok() ? at.status().message() : at->unschedulable->reason);
      break;
    }
    reserved_[name] = Reservation{name, g.job, worker, Clock::now() + kReservationLife};
    rank_job_[name] = g.job;
    got.push_back(worker);
    note(d->node);
  }
  return got;
}

std::string HeadActor::JobOfRank(const std::string& name) const {
  const size_t rank = name.find(".rank.");
  if (rank == std::string::npos || rank == 0) return "";
  const size_t dot = name.rfind('.', rank - 1);
  const std::string job = name.substr(dot == std::string::npos ? 0 : dot + 1,
                                      rank - (dot == std::string::npos ? 0 : dot + 1));
  const Job* j = jobs_.Find(job);
  return j != nullptr && !JobEnded(j->state) ? job : "";
}

absl::Status HeadActor::ClaimRankWorker(const std::string& name, const std::string& job,
                                        const std::string& worker) {
  const Clock::time_point until = Clock::now() + options_.spawn_timeout + kReservationLife;
  if (auto r = reserved_.find(name); r != reserved_.end() && r->second.worker == worker) {
    r->second.until = until;
    return absl::OkStatus();
  }
  for (const auto& [other, j] : rank_job_) {
    if (other != name && RankWorker(other) == worker) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", name, ": worker ", worker, " holds rank ", other, " of job ", j,
                       " (its reservation lapsed: ask the head for ranks again)"));
    }
  }
  reserved_[name] = Reservation{name, job, worker, until};
  rank_job_[name] = job;
  return absl::OkStatus();
}

std::string HeadActor::RankWorker(const std::string& name) const {
  if (auto r = reserved_.find(name); r != reserved_.end()) return r->second.worker;
  if (auto d = directory_.find(name); d != directory_.end()) return d->second.worker;
  return "";
}

std::string HeadActor::QueuedAhead(const RankGang& g, uint64_t seq) const {
  const Clock::time_point now = Clock::now();
  for (const auto& [id, q] : queued_) {
    if (id == g.job || !q.can_fit || now - q.asked > kQueueStale) continue;
    if (g.grow && q.priority >= g.priority) {
      return absl::StrCat("freed capacity goes to the queued job ", id, " first");
    }
    if (g.grow) continue;
    if (q.priority > g.priority || (q.priority == g.priority && q.seq < seq)) {
      return absl::StrCat("queued behind job ", id, " (priority ", q.priority,
                          q.priority == g.priority ? ", queued first)" : ")");
    }
  }
  return "";
}

std::string HeadActor::FreeRankWorker(const std::string& node, const std::string& job) const {
  std::set<std::string> busy = OtherJobsWorkers(job);
  for (const auto& [name, j] : rank_job_) busy.insert(RankWorker(name));
  return LeastLoadedWorker(node, "", busy);
}

std::string HeadActor::JobOfActor(const std::string& name) const {
  if (std::string job = JobOfRank(name); !job.empty()) return job;
  for (const auto& [id, gang] : gangs_) {
    if (!gang.actors.empty() && absl::StartsWith(name, gang.actors)) return id;
  }
  return "";
}

std::set<std::string> HeadActor::OtherJobsWorkers(const std::string& job) const {
  std::set<std::string> out;
  for (const auto& [name, j] : rank_job_) {
    if (j != job) out.insert(RankWorker(name));
  }
  for (const auto& [name, named] : directory_) {
    const std::string j = JobOfActor(name);
    if (!j.empty() && j != job) out.insert(named.worker);
  }
  return out;
}

int64_t HeadActor::RankCapacity(const Placement& each) const {
  absl::StatusOr<std::map<std::string, double>> demands = ParseResources(each.resources, "");
  absl::StatusOr<std::map<std::string, std::string>> labels = ParseLabels(each.labels, "");
  if (!demands.ok() || !labels.ok()) return 0;
  std::map<std::string, int64_t> workers_on;
  core_.ForEachMember([&](const MemberInfo& m) {
    if (m.kind == MemberKind::kWorker && m.state == MemberState::kAlive) ++workers_on[m.node];
  });
  int64_t total = 0;
  for (const auto& [node, workers] : workers_on) {
    std::optional<scheduler::NodeView> v = sched_.Node(node);
    if (!v || v->state != scheduler::NodeState::kAlive) continue;
    bool match = true;
    for (const auto& [k, want] : *labels) {
      auto l = v->labels.find(k);
      match &= l != v->labels.end() && l->second == want;
    }
    if (!match) continue;
    int64_t fit = workers;
    for (const auto& [r, amount] : *demands) {
      if (amount <= 0) continue;
      auto t = v->total.find(r);
      const double have = t == v->total.end() ? 0 : t->second;
      fit = std::min(fit, static_cast<int64_t>(std::floor(have / amount + 1e-9)));
    }
    total += fit;
  }
  return total;
}

std::string HeadActor::JobActorWorker(const std::string& name) const {
  const std::string job = JobOfActor(name);
  if (job.empty()) return "";
  const std::set<std::string> others = OtherJobsWorkers(job);
  std::set<std::string> own;
  for (const auto& [rank, j] : rank_job_) {
    if (j == job) own.insert(RankWorker(rank));
  }
  std::string best;
  std::tuple<bool, bool, size_t> best_rank;
  core_.ForEachMember([&](const MemberInfo& w) {
    const MemberInfo* n = w.kind == MemberKind::kWorker ? core_.Find(w.node) : nullptr;
    // Never onto a draining node (the coordinator moves off a noticed one).
    if (n == nullptr || w.state != MemberState::kAlive || n->state != MemberState::kAlive ||
        others.count(w.id)) {
      return;
    }
    auto h = hosted_.find(w.id);
    const std::tuple<bool, bool, size_t> r{IsSpot(*n), own.count(w.id) == 0,
                                           h == hosted_.end() ? 0 : h->second};
    if (best.empty() || r < best_rank) {
      best = w.id;
      best_rank = r;
    }
  });
  return best;
}

int32_t HeadActor::RanksOf(const std::string& job) const {
  int32_t n = 0;
  for (const auto& [name, j] : rank_job_) n += j == job;
  return n;
}

void HeadActor::ShrinkFor(const std::string& job, const QueuedJob& q) {
  struct Victim {
    int32_t priority;
    double started;
    std::string id;
    int32_t spare;
  };
  std::vector<Victim> victims;
  for (const auto& [id, gang] : gangs_) {
    const Job* j = jobs_.Find(id);
    if (id == job || j == nullptr || j->state != JobState::kRunning || gang.priority >= q.priority)
      continue;
    const int32_t spare = RanksOf(id) - gang.min;
    if (spare > 0) victims.push_back({gang.priority, j->started_at, id, spare});
  }
  // The lowest priority first; within one, the job started last.
  std::sort(victims.begin(), victims.end(), [](const Victim& a, const Victim& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.started > b.started;
  });
  const Clock::time_point now = Clock::now();
  int32_t need = q.missing;
  int32_t spare = 0;
  for (const Victim& v : victims) spare += drivers_.count(v.id) ? v.spare : 0;
  if (spare < need) return;  // shrinking them all would not make it fit: nobody is asked
  for (const Victim& v : victims) {
    auto d = drivers_.find(v.id);
    if (need <= 0) break;
    if (d == drivers_.end()) continue;
    Gang& gang = gangs_[v.id];
    const int32_t n = std::min(need, v.spare);
    need -= n;
    if (now - gang.asked_shrink < kShrinkPatience) continue;  // handing over already
    gang.asked_shrink = now;
    aout(this) << "troupe-head: job " << v.id << " (priority " << v.priority << ") gives up " << n
               << " rank(s) for job " << job << " (priority " << q.priority << ")" << std::endl;
    send(d->second, job_shrink_atom::value, v.id, n);
  }
}

void HeadActor::DropReservations(const std::function<bool(const Reservation&)>& which) {
  for (auto r = reserved_.begin(); r != reserved_.end();) {
    if (!which(r->second)) {
      ++r;
      continue;
    }
    (void)sched_.ReleaseActor(r->first);
    rank_job_.erase(r->first);
    r = reserved_.erase(r);
  }
}

void HeadActor::EndGang(const std::string& job) {
  DropReservations([&](const Reservation& r) { return r.job == job; });
  queued_.erase(job);
  gangs_.erase(job);
}

}  // namespace troupe::runtime::internal
