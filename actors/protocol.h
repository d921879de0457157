// The training actors' wire vocabulary (private to actors/): one inspectable struct per message,
// registered by RegisterTrainingActors (so every process of a cluster knows them). Every message
// of the step protocol carries the generation it belongs to; the coordinator ignores replies of
// other generations and ranks skip queued work of aborted ones.
//
//   coordinator → rank:   ConfigureRank   stage a generation (plan, coordinator handle)
//                         RunStep         run step s
//                         CommitRank      apply what is staged; write checkpoint s unless -1
//                         AbortBelow      fail collectives below `generation` now
//                         ArmKill         chaos: die with `signal` mid-exchange of step s
//                         Evict           out of the job for good: end this process
//                         AskFinal        report the parameters' CRC32C
//   rank → coordinator:   RankConfigured, StepDone, ShardWritten, FinalParams
//   rank → coordinator (collectives bootstrap): (put_atom, key, value) → bool;
//                         (get_atom, KvKeys) → KvValues
//   coordinator → driver: CoordinatorHello, ProgressLine, AddNode, JobReport, JobFailed
//   driver → coordinator: KnownRanks, then one RankJoined per rank; membership events
//
// Numbers travel as numbers (losses as doubles, statuses with their code), never as text.
#ifndef TROUPE_ACTORS_PROTOCOL_H_
#define TROUPE_ACTORS_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "caf/actor.hpp"
#include "caf/atom.hpp"
#include "caf/meta/type_name.hpp"
#include "troupe/actors/training.h"
#include "troupe/runtime/registry.h"
#include "troupe/runtime/status.h"
#include "troupe/train/elastic.h"
#include "troupe/train/manifest.h"

namespace troupe::actors {

inline constexpr char kRankActorType[] = "troupe.rank";
inline constexpr char kCoordinatorActorType[] = "troupe.coordinator";

using runtime::WireStatus;  // a Status as a message field (troupe/runtime/status.h)

struct ConfigureRank {
  uint64_t generation = 0;
  train::GenerationPlan plan;
  caf::actor coordinator;
};
// A failed configure or step names the peer rank the collectives blamed (collectives::BlamedPeer:
// dead, or unreachable from this rank), -1 when none.
// The collectives bootstrap's batched lookup: the values of the keys published so far, in order;
// `missing` the indices of the others (their values empty).
struct KvKeys {
  std::vector<std::string> keys;
};
struct KvValues {
  std::vector<std::string> values;
  std::vector<int32_t> missing;
};
struct RankConfigured {
  uint64_t generation = 0;
  std::string worker;
  WireStatus status;
  int32_t blamed = -1;
};
struct RunStep {
  uint64_t generation = 0;
  int64_t step = 0;
};
struct StepDone {
  uint64_t generation = 0;
  int64_t step = 0;
  std::string worker;
  WireStatus status;
  std::vector<int32_t> microbatches;  // with their mean losses, index by index
  std::vector<double> losses;
  double grad_norm = 0;
  int32_t blamed = -1;
  double compute_seconds = 0;  // StepOutcome's: the pipeline bubble is the rest of
  double schedule_seconds = 0;
  // For the job's trace and metrics: when the rank began the step (wall clock), how long it
  // took, and its collectives' share (StepOutcome's) and bytes sent.
  int64_t start_ns = 0;
  double step_seconds = 0;
  double collective_seconds = 0;
  uint64_t collective_bytes = 0;
  // StepOutcome's: the overlapped exchange's time in flight and the part of it left exposed.
  double exchange_seconds = 0;
  double exposed_seconds = 0;
  double update_seconds = 0;  // StepOutcome's: the optimizer
  bool param_delta = false;   // StepOutcome's: the updated parameters went as a delta
  // [eval] due at this step: this rank's share of the held-out microbatches (train::EvalShare)
  // under the parameters of `step` steps, with their mean losses; how long they took.
  std::vector<int32_t> eval_microbatches{};
  std::vector<double> eval_losses{};
  double eval_seconds = 0;
  // [lowcomm]: the fragments the step synchronised across groups (empty: none), the groups whose
  // Δ it applied, clipped or left out, and the bytes this rank sent to other groups.
  std::vector<int32_t> outer_fragments{};
  std::vector<std::string> outer_applied{}, outer_clipped{}, outer_rejected{};
  uint64_t outer_bytes = 0;
  double outer_feedback_error = -1;  // OuterSync::feedback_error
  double outer_wait_seconds = 0;     // OuterSync::wait_seconds
};
struct CommitRank {
  uint64_t generation = 0;
  int64_t checkpoint_step = -1;
};
struct AbortBelow {
  uint64_t generation = 0;
};
// The coordinator holds its lease under a new epoch (a head took over and granted it again): the
// rank's checkpoint writes from now on go under it (CheckpointStore::Claim).
struct RankEpoch {
  uint64_t generation = 0;
  uint64_t epoch = 0;
};
struct ArmKill {
  int64_t step = 0;
  int32_t signal = 0;
  int32_t fault_kind = 0;  // the FaultKind this carries out (for the rank's fault_fired event)
  int32_t point = 0;       // the train::StepPoint it strikes at
};
// The rank failed its peers generation after generation while alive (its step stuck, or no peer
// reaches it): its process ends itself, which also ends a stuck step thread.
struct Evict {
  uint64_t generation = 0;
  std::string why;
};
struct AskFinal {
  uint64_t generation = 0;
};
struct ShardWritten {
  uint64_t generation = 0;
  int64_t step = 0;
  int32_t index = 0;
  train::ShardFileInfo info;
  WireStatus status;
};
struct FinalParams {
  uint64_t generation = 0;
  int64_t crc = 0;
  int64_t num_params = 0;
  int64_t steps = 0;
  // [eval]: every held-out microbatch under the final parameters (empty without [eval]).
  std::vector<int32_t> eval_microbatches{};
  std::vector<double> eval_losses{};
};
struct CoordinatorHello {
  caf::actor coordinator;
};
struct KnownRanks {
  int32_t count = 0;
  caf::actor head;
};
struct RankJoined {
  std::string worker;
  std::string node;
  std::string domain;     // its failure domain: "zone:<label>" where labelled, else "host:<name>"
  std::string rank_name;  // the rank actor's cluster-wide name (looked up at the head)
};
struct ProgressLine {
  std::string text;
};
struct AddNode {
  std::string name;
};
struct JobFailed {
  WireStatus status;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobReport& x) {
  return f(caf::meta::type_name("troupe.JobReport"), x.committed_steps, x.losses,
           x.final_params_crc32c, x.num_params, x.generations, x.final_world, x.recovery_seconds,
           x.steps_lost, x.tokens_per_second, x.bubble, x.overlap, x.step_seconds,
           x.compute_seconds, x.exposed_seconds, x.update_seconds, x.delta_share, x.val_step,
           x.val_loss, x.val_losses, x.outer_bytes, x.outer_rounds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ConfigureRank& x) {
  return f(caf::meta::type_name("troupe.ConfigureRank"), x.generation, x.plan, x.coordinator);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvKeys& x) {
  return f(caf::meta::type_name("troupe.KvKeys"), x.keys);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvValues& x) {
  return f(caf::meta::type_name("troupe.KvValues"), x.values, x.missing);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankConfigured& x) {
  return f(caf::meta::type_name("troupe.RankConfigured"), x.generation, x.worker, x.status,
           x.blamed);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunStep& x) {
  return f(caf::meta::type_name("troupe.RunStep"), x.generation, x.step);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepDone& x) {
  return f(caf::meta::type_name("troupe.StepDone"), x.generation, x.step, x.worker, x.status,
           x.microbatches, x.losses, x.grad_norm, x.blamed, x.compute_seconds, x.schedule_seconds,
           x.start_ns, x.step_seconds, x.collective_seconds, x.collective_bytes, x.exchange_seconds,
           x.exposed_seconds, x.update_seconds, x.param_delta, x.eval_microbatches, x.eval_losses,
           x.eval_seconds, x.outer_fragments, x.outer_applied, x.outer_clipped, x.outer_rejected,
           x.outer_bytes, x.outer_feedback_error, x.outer_wait_seconds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CommitRank& x) {
  return f(caf::meta::type_name("troupe.CommitRank"), x.generation, x.checkpoint_step);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AbortBelow& x) {
  return f(caf::meta::type_name("troupe.AbortBelow"), x.generation);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankEpoch& x) {
  return f(caf::meta::type_name("troupe.RankEpoch"), x.generation, x.epoch);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ArmKill& x) {
  return f(caf::meta::type_name("troupe.ArmKill"), x.step, x.signal, x.fault_kind, x.point);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Evict& x) {
  return f(caf::meta::type_name("troupe.Evict"), x.generation, x.why);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AskFinal& x) {
  return f(caf::meta::type_name("troupe.AskFinal"), x.generation);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardWritten& x) {
  return f(caf::meta::type_name("troupe.ShardWritten"), x.generation, x.step, x.index, x.info,
           x.status);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FinalParams& x) {
  return f(caf::meta::type_name("troupe.FinalParams"), x.generation, x.crc, x.num_params, x.steps,
           x.eval_microbatches, x.eval_losses);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CoordinatorHello& x) {
  return f(caf::meta::type_name("troupe.CoordinatorHello"), x.coordinator);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KnownRanks& x) {
  return f(caf::meta::type_name("troupe.KnownRanks"), x.count, x.head);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankJoined& x) {
  return f(caf::meta::type_name("troupe.RankJoined"), x.worker, x.node, x.domain, x.rank_name);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProgressLine& x) {
  return f(caf::meta::type_name("troupe.ProgressLine"), x.text);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AddNode& x) {
  return f(caf::meta::type_name("troupe.AddNode"), x.name);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobFailed& x) {
  return f(caf::meta::type_name("troupe.JobFailed"), x.status);
}

// Declares every message above to `registry` (RegisterTrainingActors calls it).
void AddTrainingMessageTypes(runtime::ActorRegistry& registry);

// (give_up_atom, int32 n) driver -> coordinator: the head asks the job to give n ranks up for a
// queued job of higher priority (runtime::job_shrink_atom); (give_up_atom, worker) coordinator ->
// driver: that worker's rank was handed over and stopped.
using give_up_atom = caf::atom_constant<caf::atom("tr_giveup")>;

// The collectives bootstrap's key-value store, served by the coordinator.
using put_atom = caf::atom_constant<caf::atom("tr_put")>;
using get_atom = caf::atom_constant<caf::atom("tr_get")>;

[[nodiscard]] absl::Status RegisterCoordinator(runtime::ActorRegistry& registry);

}  // namespace troupe::actors

// CAF finds a type's inspect beside the type (argument-dependent lookup): the wire forms of the
// train/ types the messages carry.
namespace troupe::train {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GenerationPlan& x) {
  return f(caf::meta::type_name("troupe.GenerationPlan"), x.world, x.rank, x.stages, x.buddy,
           x.committed_steps, x.source, x.old_world, x.gone, x.old_buddy, x.checkpoint_step,
           x.epoch, x.groups, x.old_groups);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardFileInfo& x) {
  return f(caf::meta::type_name("troupe.ShardFileInfo"), x.name, x.begin, x.end, x.byte_size,
           x.crc32c);
}

}  // namespace troupe::train

#endif  // TROUPE_ACTORS_PROTOCOL_H_
