// The training actors' wire vocabulary (private to actors/): CAF atoms and the generation plan's
// text form. Every message carries the generation it belongs to; the coordinator ignores replies
// of other generations and ranks skip queued work of aborted ones.
//
//   coordinator → rank: (configure, gen, plan, coordinator)   stage generation `gen`
//                       (step, gen, s)                        run step s
//                       (commit, gen, checkpoint_step | -1)   apply what is staged
//                       (abort, gen)                          fail collectives below `gen` now
//                       (arm, s)                              chaos: die mid-exchange of step s
//                       (final, gen)                          report the parameters' CRC32C
//   rank → coordinator: (configured, gen, worker, ok, error)
//                       (stepped, gen, s, worker, ok, error, "k:loss,...", grad_norm)
//                       (shard_written, gen, step, index, name, begin, end, bytes, crc, ok, error)
//                       (final, gen, crc, num_params, committed_steps)
//   rank → coordinator (collectives bootstrap): (put, key, value) → bool; (get, key) → (bool, value)
//   coordinator → driver: (hello, coordinator) (line, text) (add_node, name) (report, ...)
//                         (failed, status)
//   driver → coordinator: (known, n) then n × (join, worker, node, node_pid, rank); membership
#ifndef TROUPE_ACTORS_PROTOCOL_H_
#define TROUPE_ACTORS_PROTOCOL_H_

#include <string>

#include "absl/status/statusor.h"
#include "caf/atom.hpp"
#include "troupe/actors/elastic.h"
#include "troupe/runtime/registry.h"

namespace troupe::actors {

inline constexpr char kRankActorType[] = "troupe.rank";
inline constexpr char kCoordinatorActorType[] = "troupe.coordinator";

using configure_atom = caf::atom_constant<caf::atom("tr_cfg")>;
using configured_atom = caf::atom_constant<caf::atom("tr_cfgd")>;
using step_atom = caf::atom_constant<caf::atom("tr_step")>;
using stepped_atom = caf::atom_constant<caf::atom("tr_stepd")>;
using commit_atom = caf::atom_constant<caf::atom("tr_commit")>;
using abort_atom = caf::atom_constant<caf::atom("tr_abort")>;
using arm_atom = caf::atom_constant<caf::atom("tr_arm")>;
using final_atom = caf::atom_constant<caf::atom("tr_final")>;
using shard_written_atom = caf::atom_constant<caf::atom("tr_shard")>;
using put_atom = caf::atom_constant<caf::atom("tr_put")>;
using get_atom = caf::atom_constant<caf::atom("tr_get")>;
// coordinator ↔ driver
using hello_atom = caf::atom_constant<caf::atom("tr_hello")>;       // (hello, coordinator)
using known_atom = caf::atom_constant<caf::atom("tr_known")>;       // (known, n): n joins follow
using join_atom = caf::atom_constant<caf::atom("tr_join")>;         // (join, worker, node, pid, rank)
using progress_atom = caf::atom_constant<caf::atom("tr_line")>;     // (line, text) to print
using report_atom = caf::atom_constant<caf::atom("tr_report")>;     // the job finished
using failed_atom = caf::atom_constant<caf::atom("tr_failed")>;     // the job cannot go on
using add_node_atom = caf::atom_constant<caf::atom("tr_addnode")>;  // chaos: a node joins
// coordinator → itself
using retry_atom = caf::atom_constant<caf::atom("tr_retry")>;
using watchdog_atom = caf::atom_constant<caf::atom("tr_watch")>;

absl::Status RegisterCoordinator(runtime::ActorRegistry& registry);

// "world rank committed source checkpoint_step old0,old1,..." (old list "-" when empty).
std::string EncodePlan(const GenerationPlan& plan);
absl::StatusOr<GenerationPlan> DecodePlan(const std::string& text);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_PROTOCOL_H_
