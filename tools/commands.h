// Subcommands of the stock `troupe` binary. Each takes the arguments after its name and returns the
// process exit code (0 success, 1 failure, 2 usage error). Add a command: declare it here,
// implement it in its own file, and add one row to kCommands in main.cc.
#ifndef TROUPE_TOOLS_COMMANDS_H_
#define TROUPE_TOOLS_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/runtime/config.h"
#include "troupe/train/job_spec.h"

namespace troupe::tools {

using Args = std::vector<std::string>;

// troupe data prepare --input FILES... --out DIR --vocab N
int RunData(const Args& args);

// troupe train [--spec FILE] [--head HOST:P] [--workers N] [--chaos KIND@STEP]...
int RunTrain(const Args& args);

// troupe job submit|list|status|logs|wait|stop|trace|plot ... (jobs on a cluster's head)
int RunJob(const Args& args);

// The job spec options `troupe train` and `troupe job submit` share: --spec, then the flags
// that override its fields (--workers, --steps, --work_dir, --data_dir, --chaos).
struct SpecFlags {
  std::string spec_path, work_dir, data_dir;
  int64_t workers = 0, steps = 0;  // 0: as the job spec says
  std::vector<std::string> chaos;

  void Register(runtime::ConfigRegistry& config);
  // The job spec from --spec, with the flags' fields applied and the whole validated again.
  [[nodiscard]] absl::StatusOr<train::JobSpec> Make() const;
};

// troupe chaos run [--spec FILE] [--trials N] [--seed S] [--faults LIST] ... (random fault
// schedules against the job, invariants checked, failures shrunk; chaos_command.cc)
int RunChaosCommand(const Args& args);
// troupe chaos actors --program CMD [--actors NAMES] [--trials N] ... (random kills, stops and
// delays of a program's own actors through TROUPE_CHAOS_ACTORS; chaos_actors.cc)
int RunChaosActors(const Args& args);

// troupe sim spot --trace FILE [--mix OD:SPOT,...] [--measure]
int RunSim(const Args& args);

// troupe head|node|worker|up|certs ... (troupe::runtime::RunMain)
int RunClusterRole(const std::string& role, const Args& args);

}  // namespace troupe::tools

#endif  // TROUPE_TOOLS_COMMANDS_H_
