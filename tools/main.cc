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

int Head(const Args& a) { return RunClusterRole("head", a); }
int Node(const Args& a) { return RunClusterRole("node", a); }
int Worker(const Args& a) { return RunClusterRole("worker", a); }
int Up(const Args& a) { return RunClusterRole("up", a); }
int Certs(const Args& a) { return RunClusterRole("certs", a); }
int Status(const Args& a) { return RunClusterRole("status", a); }
int Relay(const Args& a) { return RunClusterRole("relay", a); }

constexpr Command kCommands[] = {
    {"train",
     "train [--spec job.toml] [--head HOST:P] [--workers N] [--steps N] "
     "[--chaos kill-worker@10] [--report FILE] [--tls_ca F --tls_cert F --tls_key F]",
     RunTrain},
    {"job",
     "job submit|list|status|logs|wait|stop|trace|plot ... --head HOST:P   (jobs that run on "
     "the cluster; `troupe job --help`)",
     RunJob},
    {"chaos",
     "chaos run [--spec job.toml] [--trials N] [--seed S] [--faults LIST] [--max-faults K] "
     "[--report DIR]   (random fault schedules against the job, invariants checked, failures "
     "shrunk; `troupe chaos run --help`)\n"
     "  troupe chaos actors --program CMD [--actors NAMES] [--trials N] [--seed S] "
     "[--kinds kill,stop,delay] [--invariant CMD] [--report DIR]   (the same against a "
     "program's own actors, by name; `troupe chaos actors --help`)",
     RunChaosCommand},
    {"data", "data prepare --input FILES... --out DIR --vocab N", RunData},
    {"sim",
     "sim spot --trace FILE [--mix OD:SPOT,...] [--measure]   (goodput and cost of spot mixes "
     "for a preemption trace)",
     RunSim},
    {"head", "head [--port P] [--host ADDR] [--tls_ca F --tls_cert F --tls_key F]", Head},
    {"node",
     "node --head HOST:P [--resources cpu=2,gpu=0,memory=8G] [--labels k=v] "
     "[--workers N] [--grace 30s] [--tls_ca F --tls_cert F --tls_key F]",
     Node},
    {"up",
     "up [--workers N] [--tls_ca F --tls_cert F --tls_key F]   (head + node agent + N workers "
     "on this machine)",
     Up},
    {"certs", "certs --dir DIR [--members head,node-a,driver,...]", Certs},
    {"status",
     "status --head HOST:P [--wait_workers N] [--timeout 60s]   (nodes, workers and their "
     "actors, placement groups, jobs)",
     Status},
    {"relay",
     "relay --queue N --delay 5ms [--jitter 1ms] [--run_for 3s]   (root: holds the packets of "
     "an iptables NFQUEUE rule, for latency without netem)",
     Relay},
    {"worker", "worker ...   (started by a node agent)", Worker},
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
