// The stock `troupe` command line: `troupe <command> [args...]`, dispatched through one table.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace troupe::tools {
namespace {

struct Command {
  const char* name;
  const char* usage;
  int (*run)(const Args& args);
};

constexpr Command kCommands[] = {
    {"data", "data prepare --input FILES... --out DIR --vocab N", RunData},
};

int Usage(FILE* out) {
  std::fprintf(out, "usage: troupe <command> [args...]\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  troupe %s\n", c.usage);
  return out == stdout ? 0 : 2;
}

}  // namespace
}  // namespace troupe::tools

int main(int argc, char** argv) {
  using namespace troupe::tools;
  if (argc < 2) return Usage(stderr);
  const std::string name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") return Usage(stdout);
  for (const Command& c : kCommands) {
    if (name == c.name) return c.run(Args(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "troupe: unknown command '%s'\n", name.c_str());
  return Usage(stderr);
}
