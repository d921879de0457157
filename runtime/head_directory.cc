// The head's named-actor directory: where each named actor runs (spawned through the head, or
// re-registered by a worker that rejoined), lookups, leases on a name, and the remote spawn and
// placement groups that fill it (the scheduler decides where).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "head_actor.h"
#include "internal/resources.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime::internal {

// An unschedulable request: ResourceExhausted when waiting for resources may help,
// FailedPrecondition when no node could ever fit (what ClusterClient callers branch on).
absl::Status Unschedulable(const scheduler::Unschedulable& u, const std::string& what) {
  std::string m = absl::StrCat("unschedulable (",
                               u.retry_can_help ? "waiting may help" : "no node could ever fit",
                               "): ", what, " ", u.reason);
  return u.retry_can_help ? absl::ResourceExhaustedError(m) : absl::FailedPreconditionError(m);
}

absl::StatusOr<scheduler::ActorRequest> MakeActorRequest(const std::string& id,
                                                         const Placement& where,
                                                         const std::string& node_pin) {
  scheduler::ActorRequest r;
  r.actor = id;
  TROUPE_ASSIGN_OR_RETURN(auto demands, ParseResources(where.resources, "resources"));
  r.demands = demands;
  TROUPE_ASSIGN_OR_RETURN(auto labels, ParseLabels(where.labels, "labels"));
  for (const auto& [k, v] : labels) r.selector.push_back({k, scheduler::LabelTerm::Op::kIn, {v}});
  if (!node_pin.empty()) {
    r.selector.push_back({kNodeLabel, scheduler::LabelTerm::Op::kIn, {node_pin}});
  }
  switch (where.strategy) {
    case PlacementStrategy::kPack:
      r.strategy = scheduler::Strategy::kPack;
      break;
    case PlacementStrategy::kSpread:
      r.strategy = scheduler::Strategy::kSpread;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "placement strategy: expected pack or spread, got ", static_cast<int>(where.strategy)));
  }
  switch (where.spot) {
    case SpotPreference::kNone:
      r.spot = scheduler::SpotPreference::kNone;
      break;
    case SpotPreference::kPrefer:
      r.spot = scheduler::SpotPreference::kPreferSpot;
      break;
    case SpotPreference::kAvoid:
      r.spot = scheduler::SpotPreference::kPreferOnDemand;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "placement spot: expected none, prefer or avoid, got ", static_cast<int>(where.spot)));
  }
  r.group = where.group;
  r.bundle = static_cast<int>(where.bundle);
  return r;
}

caf::message_handler HeadActor::DirectoryHandlers() {
  return {
      [this](reg_actor_atom, const std::string& worker, const std::string& name, uint64_t gen,
             const caf::actor& h) { HandleRegisterActor(worker, name, gen, h); },
      [this](spawn_atom, const std::string& type, const caf::message& args, const std::string& name,
             uint64_t gen,
             const Placement& where) -> caf::result<caf::actor, std::string, std::string> {
        return HandleSpawn(type, args, name, gen, where);
      },
      [this](pg_atom, const std::string& name, const std::vector<std::string>& bundles,
             GroupStrategy strategy,
             const std::string& domain_key) -> caf::result<std::vector<std::string>> {
        return HandlePlacementGroup(name, bundles, strategy, domain_key);
      },
      [this](lookup_atom, const std::string& name)
          -> caf::result<caf::actor, uint64_t, std::string, std::string> {
        auto it = directory_.find(name);
        if (it == directory_.end()) {
          return StatusToError(
              absl::NotFoundError(absl::StrCat("no actor named '", name, "' in the cluster")));
        }
        return {it->second.handle, it->second.generation, it->second.worker,
                DirectEndpoint(it->second.worker)};
      },
      [this](lease_atom, const std::string& name) -> caf::result<uint64_t, int64_t> {
        return HandleLease(name);
      },
  };
}

HeadActor::Directory::iterator HeadActor::NamedDown(Directory::iterator it,
                                                    const caf::error& reason,
                                                    const std::string& detail) {
  if (it->second.requester) {
    send(it->second.requester, rdown_atom::value, it->first, it->second.generation, reason, detail);
  }
  (void)sched_.ReleaseActor(it->first);
  rank_job_.erase(it->first);
  if (store_) StoreFailed(store_->RemoveActor(it->first));
  if (auto w = hosted_.find(it->second.worker); w != hosted_.end() && w->second > 0) {
    w->second--;
  }
  const MemberInfo* w = core_.Find(it->second.worker);
  const std::string node = w != nullptr ? w->node : "";
  auto next = directory_.erase(it);
  if (!node.empty()) ReleaseIfIdle(node);
  return next;
}

void HeadActor::ReleaseActorsOf(const std::string& worker, const std::string& detail) {
  DropReservations([&](const Reservation& r) { return r.worker == worker; });
  for (auto d = directory_.begin(); d != directory_.end();) {
    d = d->second.worker == worker
            ? NamedDown(d, caf::make_error(caf::exit_reason::remote_link_unreachable), detail)
            : std::next(d);
  }
  // A spawn it was asked for fails now, naming the death, not at spawn_timeout.
  auto [begin, end] = pending_spawns_.equal_range(worker);
  std::vector<PendingSpawn> failed;
  for (auto p = begin; p != end; ++p) failed.push_back(std::move(p->second));
  pending_spawns_.erase(begin, end);
  for (PendingSpawn& p : failed) {
    if (*p.answered) continue;
    p.fail(StatusToError(absl::UnavailableError(
        absl::StrCat("worker '", worker, "' died while spawning on it: ", detail))));
  }
}

void HeadActor::ForgetSpawn(const std::string& worker, const std::shared_ptr<bool>& answered) {
  auto [begin, end] = pending_spawns_.equal_range(worker);
  for (auto p = begin; p != end; ++p) {
    if (p->second.answered == answered) {
      pending_spawns_.erase(p);
      return;
    }
  }
}

bool HeadActor::NamedActorDown(const caf::down_msg& dm) {
  for (auto d = directory_.begin(); d != directory_.end(); ++d) {
    if (d->second.handle.address() == dm.source) {
      NamedDown(d, dm.reason, "actor exited");
      return true;
    }
  }
  return false;
}

// A lease on `name` for the actor registered under it (see lease_atom in cluster.h).
caf::result<uint64_t, int64_t> HeadActor::HandleLease(const std::string& name) {
  auto it = directory_.find(name);
  const caf::strong_actor_ptr& sender = current_sender();
  if (it == directory_.end() || !sender || sender->node() != it->second.handle.node() ||
      sender->id() != it->second.handle.id()) {
    return StatusToError(absl::FailedPreconditionError(absl::StrCat(
        "no lease on '", name, "': the asker is not the actor registered under that name",
        it == directory_.end() ? " (none is)"
                               : absl::StrCat(" (generation ", it->second.generation, " on ",
                                              it->second.worker, " is)"))));
  }
  const MemberInfo* w = core_.Find(it->second.worker);
  if (w == nullptr || w->state != MemberState::kAlive) {
    return StatusToError(absl::FailedPreconditionError(
        absl::StrCat("no lease on '", name, "': its worker ", it->second.worker, " is not alive")));
  }
  const Clock::duration length = options_.heartbeat_timeout;
  // A lease its predecessor granted (this head cannot know whose) may still run: none until it
  // has surely run out. The holder asks again (Unavailable) and keeps its epoch's successor.
  if (const Clock::time_point now = Clock::now(); now < leases_from_) {
    return StatusToError(absl::UnavailableError(absl::StrCat(
        "no lease on '", name, "' for another ",
        std::chrono::duration_cast<std::chrono::milliseconds>(leases_from_ - now).count(),
        "ms: this head took over from one whose leases may still run")));
  }
  auto grant =
      leases_.Acquire(name, absl::StrCat(it->second.worker, " generation ", it->second.generation),
                      it->second.worker, Clock::now(), length,
                      static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())));
  if (!grant.ok()) return StatusToError(grant.status());
  return {grant->epoch, std::chrono::duration_cast<std::chrono::milliseconds>(length).count()};
}

// A named actor of a worker that rejoined this head (after its predecessor was lost): into the
// directory, unless a newer incarnation of the name is known. Whoever spawned it is not known
// here; its loss reaches lookups and monitors, not an rdown.
void HeadActor::HandleRegisterActor(const std::string& worker, const std::string& name,
                                    uint64_t gen, const caf::actor& h) {
  const MemberInfo* w = core_.Find(worker);
  if (w == nullptr || w->kind != MemberKind::kWorker || w->state != MemberState::kAlive || !h) {
    return;
  }
  if (auto it = directory_.find(name); it != directory_.end() && it->second.generation >= gen) {
    return;
  }
  directory_[name] = Named{h, gen, worker, caf::actor()};
  hosted_[worker]++;
  if (std::string job = JobOfRank(name); !job.empty()) rank_job_[name] = job;
  if (store_) StoreFailed(store_->PutActor({name, worker, gen}));
  monitor(h);
}

std::string HeadActor::DirectEndpoint(const std::string& worker) const {
  const MemberInfo* w = core_.Find(worker);
  if (w == nullptr || w->direct_port <= 0) return "";
  return absl::StrCat(w->address, ":", w->direct_port);
}

std::string HeadActor::LeastLoadedWorker(const std::string& node, const std::string& pinned,
                                         const std::set<std::string>& skip) const {
  std::string best;
  size_t best_hosted = 0;
  core_.ForEachMember([&](const MemberInfo& m) {
    if (m.kind != MemberKind::kWorker || m.state != MemberState::kAlive || m.node != node) return;
    if ((!pinned.empty() && m.id != pinned) || skip.count(m.id)) return;
    auto h = hosted_.find(m.id);
    const size_t hosted = h == hosted_.end() ? 0 : h->second;
    if (best.empty() || hosted < best_hosted) {
      best = m.id;
      best_hosted = hosted;
    }
  });
  return best;
}

caf::result<caf::actor, std::string, std::string> HeadActor::HandleSpawn(const std::string& type,
                                                                         const caf::message& args,
                                                                         const std::string& name,
                                                                         uint64_t gen,
                                                                         const Placement& where) {
  std::string id = name.empty() ? absl::StrCat("anon-", ++anonymous_) : name;
  if (directory_.count(id)) {
    // A restart of a named actor whose old incarnation the head has not seen die yet.
    NamedDown(directory_.find(id), caf::make_error(caf::exit_reason::user_shutdown),
              "replaced by a new incarnation");
  }
  (void)sched_.ReleaseActor(id);
  // A job's rank (job_gang_atom): on the worker reserved for it, which stays reserved until the
  // actor is in the directory, so no other job's rank is reserved there meanwhile.
  const std::string rank_of = JobOfRank(id);
  if (!rank_of.empty()) {
    if (absl::Status s = ClaimRankWorker(id, rank_of, where.worker); !s.ok()) {
      return StatusToError(s);
    }
  }
  auto refuse = [&](const absl::Status& s) {
    if (!rank_of.empty()) DropReservations([&](const Reservation& r) { return r.name == id; });
    return StatusToError(s);
  };
  Placement at = where;
  if (rank_of.empty() && at.worker.empty() && at.node.empty()) at.worker = JobActorWorker(id);
  std::string node_pin = at.node;
  if (!at.worker.empty()) {
    const MemberInfo* w = core_.Find(at.worker);
    if (w == nullptr || w->kind != MemberKind::kWorker || w->state != MemberState::kAlive) {
      return refuse(absl::UnavailableError(absl::StrCat("no alive worker '", at.worker, "'")));
    }
    node_pin = w->node;
  }
  auto actor_request = MakeActorRequest(id, at, node_pin);
  if (!actor_request.ok()) return refuse(actor_request.status());
  auto decision = sched_.PlaceActor(*actor_request);
  if (!decision.ok()) return refuse(decision.status());
  if (!decision->placed()) return refuse(Unschedulable(*decision->unschedulable, id));
  const std::string worker_id = LeastLoadedWorker(decision->node, at.worker);
  if (worker_id.empty()) {
    (void)sched_.ReleaseActor(id);
    return refuse(absl::UnavailableError(
        absl::StrCat("no alive worker on node '", decision->node, "' for ", id)));
  }
  hosted_[worker_id]++;
  // Before make_response_promise, which takes the sender out of the current message.
  caf::actor requester = caf::actor_cast<caf::actor>(current_sender());
  auto rp = make_response_promise<caf::actor, std::string, std::string>();
  auto answered = std::make_shared<bool>(false);
  pending_spawns_.emplace(worker_id,
                          PendingSpawn{answered, [rp, answered](const caf::error& e) mutable {
                                         *answered = true;
                                         rp.deliver(e);
                                       }});
  request(Handle(worker_id), options_.spawn_timeout, spawn_atom::value, type, args, name, gen)
      .then(
          [this, rp, id, gen, worker_id, requester, answered](const caf::actor& h) mutable {
            ForgetSpawn(worker_id, answered);
            if (*answered) return;  // its worker was reported dead first: the actor died with it
            *answered = true;
            reserved_.erase(id);  // the rank holds its worker now (rank_job_)
            directory_[id] = Named{h, gen, worker_id, requester};
            if (store_) StoreFailed(store_->PutActor({id, worker_id, gen}));
            monitor(h);
            rp.deliver(h, worker_id, DirectEndpoint(worker_id));
          },
          [this, rp, id, worker_id, answered](caf::error& e) mutable {
            ForgetSpawn(worker_id, answered);
            (void)sched_.ReleaseActor(id);
            reserved_.erase(id);
            rank_job_.erase(id);
            if (auto w = hosted_.find(worker_id); w != hosted_.end() && w->second) w->second--;
            if (*answered) return;
            *answered = true;
            rp.deliver(std::move(e));
          });
  return rp;
}

caf::result<std::vector<std::string>> HeadActor::HandlePlacementGroup(
    const std::string& name, const std::vector<std::string>& bundles, GroupStrategy strategy,
    const std::string& domain_key) {
  scheduler::PlacementGroupRequest r;
  r.group = name;
  r.domain_key = domain_key;
  switch (strategy) {
    case GroupStrategy::kPack:
      r.strategy = scheduler::Strategy::kPack;
      break;
    case GroupStrategy::kSpread:
      r.strategy = scheduler::Strategy::kSpread;
      break;
    case GroupStrategy::kStrictPack:
      r.strategy = scheduler::Strategy::kStrictPack;
      break;
    case GroupStrategy::kStrictSpread:
      r.strategy = scheduler::Strategy::kStrictSpread;
      break;
    default:
      return StatusToError(absl::InvalidArgumentError(
          absl::StrCat("placement group '", name,
                       "': strategy expected pack, spread, strict_pack or strict_spread, got ",
                       static_cast<int>(strategy))));
  }
  for (size_t i = 0; i < bundles.size(); ++i) {
    auto b = ParseResources(bundles[i], absl::StrCat("bundle ", i));
    if (!b.ok()) return StatusToError(b.status());
    r.bundles.push_back(*b);
  }
  auto d = sched_.CreatePlacementGroup(r);
  if (!d.ok()) return StatusToError(d.status());
  if (!d->placed()) {
    return StatusToError(Unschedulable(*d->unschedulable, "placement group " + name));
  }
  return d->bundle_nodes;
}

}  // namespace troupe::runtime::internal
