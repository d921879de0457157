// head_actor.h — the head's actor, whose work is split by job over four files:
//   head.cc            membership: messages to MembershipCore (membership_core.h), its actions
//                      carried out (publish, store, fence, scheduler, ...); the failure
//                      detector's tick; restore from the store
//   head_directory.cc  the named-actor directory: lookups, re-registration, leases, remote spawn
//                      and placement groups
//   head_jobs.cc       jobs: submit, register, end, stop, placing their drivers
//   head_gangs.cc      jobs' ranks: gangs reserved, the queue of jobs waiting for theirs,
//                      shrinking lower-priority jobs for a higher one
//   head_views.cc      the ops views (cluster, jobs, job, logs, metrics) for the HTTP API
// Private to those files. All state is touched only by the actor's own thread.
#ifndef TROUPE_RUNTIME_HEAD_ACTOR_H_
#define TROUPE_RUNTIME_HEAD_ACTOR_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/head_store.h"
#include "internal/jobs.h"
#include "internal/lease.h"
#include "membership_core.h"
#include "nlohmann/json.hpp"
#include "troupe/scheduler/scheduler.h"

namespace troupe::runtime::internal {

// Every node carries this label, so a request can be pinned to one node by a selector.
inline constexpr char kNodeLabel[] = "troupe.node";

// The scheduler's request for a spawn placed by `where` (pinned to `node_pin` unless ""), and an
// unschedulable decision as a status: ResourceExhausted when waiting may help, FailedPrecondition
// when no node could ever fit (what ClusterClient callers branch on).
absl::StatusOr<scheduler::ActorRequest> MakeActorRequest(const std::string& id,
                                                         const Placement& where,
                                                         const std::string& node_pin);
absl::Status Unschedulable(const scheduler::Unschedulable& u, const std::string& what);

class HeadActor final : public caf::event_based_actor {
 public:
  HeadActor(caf::actor_config& cfg, ClusterOptions options, std::string build_id,
            std::shared_ptr<HeadStore> store);

  caf::behavior make_behavior() override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Named {
    caf::actor handle;
    uint64_t generation;
    std::string worker;
    caf::actor requester;  // told when the actor goes down
  };
  using Directory = std::map<std::string, Named>;

  // head.cc: membership.
  caf::message_handler MembershipHandlers();
  caf::result<uint32_t> HandleHello(uint32_t version, const std::string& build_id,
                                    const std::string& kind, const std::string& name);
  caf::result<uint64_t> HandleRegisterNode(const std::string& name, const std::string& resources,
                                           const std::string& labels, const std::string& address,
                                           const std::string& host, const caf::actor& agent);
  caf::result<uint64_t> HandleRegisterWorker(const std::string& id, const std::string& node,
                                             int64_t pid, const caf::actor& worker, int32_t port,
                                             int32_t direct_port);
  void HandleHeartbeat(const std::string& id, uint64_t base, uint64_t version,
                       const std::vector<ActorStat>& changes);
  caf::result<bool> HandleNodeFault(const std::string& node, const NodeFault& f);
  void HandleDown(const caf::down_msg& dm);
  // Carries out the core's actions in order (a kRefuse is the request's answer: Refusal).
  void Execute(const std::vector<MembershipAction>& actions);
  static absl::Status Refusal(const std::vector<MembershipAction>& actions);
  // A kPublish: the change joins the store batch (when it bumps the generation) and its event is
  // announced once the batch is written; without a batch pending, at once.
  void Publish(const MembershipAction& a);
  // Group commit: the membership changes made while the head works through the messages queued
  // before the batch's flush message are written together (HeadStore::PutMembership), then their
  // events announced and the joins among them answered (AnswerStored). A join of thousands is
  // so a few store writes; nothing is announced or answered before it is stored.
  void FlushStoreBatch();
  void Announce(const MembershipEvent& e);
  // `generation` as a registration's answer: at once, or once the pending batch is stored.
  caf::result<uint64_t> AnswerStored(uint64_t generation);
  void ReleaseIfIdle(const std::string& node);
  // The member's node agent or worker actor (an invalid handle for no member).
  const caf::actor& Handle(const std::string& member) const;
  void Restore();
  // A store that refuses this head's writes has been claimed by a later head: this one is stale
  // and stops, rather than serve a cluster it can no longer record.
  void StoreFailed(const absl::Status& s);

  // head_directory.cc: named actors.
  caf::message_handler DirectoryHandlers();
  // Removes `it` from the directory and tells whoever spawned it.
  Directory::iterator NamedDown(Directory::iterator it, const caf::error& reason,
                                const std::string& detail);
  // kReleaseActors: every named actor on `worker`.
  void ReleaseActorsOf(const std::string& worker, const std::string& detail);
  // Drops worker's pending spawn whose handlers share `answered` (answered by then).
  void ForgetSpawn(const std::string& worker, const std::shared_ptr<bool>& answered);
  // The directory's part of HandleDown: true if `dm` was a named actor's.
  bool NamedActorDown(const caf::down_msg& dm);
  caf::result<uint64_t, int64_t> HandleLease(const std::string& name);
  void HandleRegisterActor(const std::string& worker, const std::string& name, uint64_t gen,
                           const caf::actor& h);
  caf::result<caf::actor, std::string, std::string> HandleSpawn(const std::string& type,
                                                                const caf::message& args,
                                                                const std::string& name,
                                                                uint64_t gen,
                                                                const Placement& where);
  // The alive worker on `node` hosting the fewest actors (only `pinned`, when given; none of
  // `skip`), or "".
  std::string LeastLoadedWorker(const std::string& node, const std::string& pinned,
                                const std::set<std::string>& skip = {}) const;
  caf::result<std::vector<std::string>> HandlePlacementGroup(
      const std::string& name, const std::vector<std::string>& bundles, GroupStrategy strategy,
      const std::string& domain_key);
  // A worker's direct channel as ActorRef::direct has it: "ADDRESS:PORT", "" if it has none.
  std::string DirectEndpoint(const std::string& worker) const;

  // head_jobs.cc: jobs.
  caf::message_handler JobHandlers();
  caf::result<std::string> HandleJobRegister(const std::string& id, const std::string& name,
                                             const std::string& spec, int64_t steps, int64_t pid,
                                             const std::string& node, const caf::actor& driver);
  caf::result<bool> HandleJobStop(const std::string& id);
  void PutJob(const std::string& id);
  void EndJob(const std::string& id, JobState state, const std::string& error,
              const std::string& report);
  void PlaceJobs();
  // kFailJobs: every submitted job whose driver runs on `node`.
  void FailJobsOn(const std::string& node, const std::string& why);
  // The jobs' part of HandleDown: a registered driver gone before it said how its job ended.
  void DriverDown(const caf::down_msg& dm);
  static double Now();
  // A node labelled spot=true, its labels read as at its registration (ParseNodeSpec).
  static bool IsSpot(const MemberInfo& node);

  // head_gangs.cc: jobs' ranks.
  struct Reservation {
    std::string name, job, worker;
    Clock::time_point until;
  };
  struct QueuedJob {
    int32_t priority = 0;
    uint64_t seq = 0;  // first come, first served within a priority
    bool can_fit = true;
    int32_t missing = 0;  // ranks short of its min when it last asked
    Clock::time_point asked;
    std::string why;
  };
  struct Gang {
    int32_t min = 1, max = 1, priority = 0;
    std::string actors;              // RankGang::actors
    Clock::time_point asked_shrink;  // when the head last asked this job to give ranks up
  };
  caf::message_handler GangHandlers();
  RankGrant HandleGang(const RankGang& g);
  // Reserves ranks until the job holds `cap`; returns the workers and, when it stopped short, why.
  std::vector<std::string> ReserveUpTo(const RankGang& g, int32_t cap, std::string* why);
  // The running job whose rank `name` is ("<spec name>.<job id>.rank.<worker>"), or "".
  std::string JobOfRank(const std::string& name) const;
  // A rank of `job` is spawned on `worker`: its reservation is kept through the spawn; one that
  // lapsed is taken again if no other rank holds the worker (FailedPrecondition otherwise).
  absl::Status ClaimRankWorker(const std::string& name, const std::string& job,
                               const std::string& worker);
  // The queued job `g` waits behind ("" when none): a higher priority, or the same one earlier.
  std::string QueuedAhead(const RankGang& g, uint64_t seq) const;
  // The worker of a granted rank (reserved or running), or "".
  std::string RankWorker(const std::string& name) const;
  // An alive worker on `node` for a rank of `job`: none of any job's ranks or reservations, none
  // of another job's actors; or "".
  std::string FreeRankWorker(const std::string& node, const std::string& job) const;
  // The job an actor belongs to ("" for none): a rank by its name, another of its actors by the
  // prefix its driver gave (RankGang::actors).
  std::string JobOfActor(const std::string& name) const;
  // The workers holding anything of a job other than `job`.
  std::set<std::string> OtherJobsWorkers(const std::string& job) const;
  // How many ranks of `each` the alive nodes could hold if nothing else ran there.
  int64_t RankCapacity(const Placement& each) const;
  int32_t RanksOf(const std::string& job) const;
  // For a job's actor `name` other than its ranks (RankGang::actors: its coordinator): an alive
  // worker holding nothing of another job, on-demand first, then one of the job's own ranks', then
  // the least loaded; "" for any other actor. A process killed in one job never takes another
  // job's actor with it.
  std::string JobActorWorker(const std::string& name) const;
  // Running lower-priority jobs above their min give up ranks for queued job `job`.
  void ShrinkFor(const std::string& job, const QueuedJob& q);
  void DropReservations(const std::function<bool(const Reservation&)>& which);
  // The job ended: its reservations, queue place and gang go.
  void EndGang(const std::string& job);

  // head_views.cc: the ops views.
  caf::message_handler ViewHandlers();
  absl::StatusOr<std::string> View(const std::string& what, const std::string& arg);
  nlohmann::json ClusterView();
  std::string Metrics();

  ClusterOptions options_;
  std::shared_ptr<HeadStore> store_;
  struct StoreBatch {
    uint64_t generation = 0;
    std::vector<MemberInfo> members;             // each changed member's newest record, once
    std::map<std::string, size_t> member_index;  // id -> members[]
    std::vector<MembershipEvent> events;         // to announce once stored, in order
    std::vector<caf::response_promise> answers;  // registrations' answers, delivered then
    std::vector<uint64_t> answer_generations;
  };
  std::optional<StoreBatch> batch_;
  MembershipCore core_;
  std::map<std::string, caf::actor> handles_;  // every member's node agent or worker actor
  Directory directory_;
  std::map<std::string, size_t> hosted_;  // actors spawned on each worker, for placement
  // Spawns forwarded to a worker and not answered yet, by worker: its death answers them at once
  // (Unavailable) rather than at spawn_timeout. `answered` is shared with the request's handlers.
  struct PendingSpawn {
    std::shared_ptr<bool> answered;
    std::function<void(const caf::error&)> fail;
  };
  std::multimap<std::string, PendingSpawn> pending_spawns_;
  scheduler::Scheduler sched_;
  uint64_t anonymous_ = 0;
  std::vector<caf::actor> subscribers_;
  LeaseTable leases_;
  JobTable jobs_;
  std::map<std::string, caf::actor> drivers_;  // running jobs' drivers, by job id
  Clock::time_point leases_from_;  // a head that took over grants none before (HandleLease)
  std::map<std::string, Reservation> reserved_;  // ranks granted, not spawned yet, by name
  std::map<std::string, std::string> rank_job_;  // every granted rank (reserved or running) -> job
  std::map<std::string, QueuedJob> queued_;      // by job id
  std::map<std::string, Gang> gangs_;            // jobs that asked for ranks, by job id
  uint64_t queue_seq_ = 0;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_HEAD_ACTOR_H_
