// troupe head | node | worker | up | certs | status: the cluster roles, run by the stock binary
// with troupe's built-in actor types (user programs call troupe::runtime::RunMain themselves).
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "troupe/actors/training.h"
#include "troupe/runtime/cluster.h"

namespace troupe::tools {

int RunClusterRole(const std::string& role, const Args& args) {
  std::vector<std::string> storage = {"troupe", role};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  runtime::ActorRegistry registry;
  if (absl::Status s = actors::RegisterTrainingActors(registry); !s.ok()) {
    std::fprintf(stderr, "troupe %s: %s\n", role.c_str(), s.ToString().c_str());
    return 1;
  }
  return runtime::RunMain(static_cast<int>(storage.size()), argv.data(), std::move(registry));
}

}  // namespace troupe::tools
