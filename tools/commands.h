// Subcommands of the stock `troupe` binary. Each takes the arguments after its name and returns the
// process exit code (0 success, 1 failure, 2 usage error). Add a command: declare it here,
// implement it in its own file, and add one row to kCommands in main.cc.
#ifndef TROUPE_TOOLS_COMMANDS_H_
#define TROUPE_TOOLS_COMMANDS_H_

#include <string>
#include <vector>

namespace troupe::tools {

using Args = std::vector<std::string>;

// troupe data prepare --input FILES... --out DIR --vocab N
int RunData(const Args& args);

// troupe train [--spec FILE] [--head HOST:P] [--workers N] [--chaos KIND@STEP]...
int RunTrain(const Args& args);

// troupe sim spot --trace FILE [--mix OD:SPOT,...] [--measure]
int RunSim(const Args& args);

// troupe head|node|worker|up|certs ... (troupe::runtime::RunMain)
int RunClusterRole(const std::string& role, const Args& args);

}  // namespace troupe::tools

#endif  // TROUPE_TOOLS_COMMANDS_H_
