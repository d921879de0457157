// internal/process.h — starting and reaping child processes for the node agent and the local
// cluster: the child dies with its parent (PR_SET_PDEATHSIG), its stdout and stderr go to
// files, and an exit is described as a person would ("killed by signal 9 (Killed)").
#ifndef TROUPE_RUNTIME_INTERNAL_PROCESS_H_
#define TROUPE_RUNTIME_INTERNAL_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/runtime/cluster.h"

namespace troupe::runtime::internal {

struct ProcessSpec {
  std::string path;                        // executable; "" = this binary (/proc/self/exe)
  std::vector<std::string> args;           // argv[1..]
  std::map<std::string, std::string> env;  // added to (or replacing in) the environment
  std::string stdout_path, stderr_path;    // "" = inherit
  bool append = false;                     // the log files are appended to, not truncated
  bool die_with_parent = true;             // PR_SET_PDEATHSIG(SIGKILL)
};

[[nodiscard]] absl::StatusOr<pid_t> StartProcess(const ProcessSpec& spec);
// "exited with status 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);
// The last `lines` lines of a text file ("" if unreadable).
std::string TailFile(const std::string& path, int lines);
// This binary's path (/proc/self/exe resolved).
std::string SelfExe();
// Whether `pid` has already been killed and is on its way out: a SIGKILL pending on it or on one of
// its threads, a thread exiting, or a zombie. A SIGKILLed process is reaped only once every thread
// has left the kernel, which can take over a second on a loaded machine.
bool AlreadyDying(pid_t pid);

// A network fault on this host, for the node agent's chaos (NodeFault kPartition, kOneWay, kFlap,
// kDrop or kDelay, in troupe/runtime/cluster.h): iptables rules on INPUT and OUTPUT (kOneWay:
// OUTPUT only) for every packet not on loopback — DROP (all, or `drop_percent` % at random), or
// NFQUEUE kChaosDelayQueue served by a `troupe relay` process (this binary's) — taken out and put
// back every `period_ms` (kFlap), removed after `duration_ms` by a detached process of
// their own (not this one's child; no descriptor of this process kept open), so the heal happens
// even if this process dies meanwhile. Returns once the rules are in place: FailedPrecondition
// when iptables is missing or refuses (no CAP_NET_ADMIN), or the relay cannot bind its queue,
// naming the command.
[[nodiscard]] absl::Status StartNetworkFault(const NodeFault& f);
// The NFQUEUE number of a delay fault's rules (one delay at a time on a host).
inline constexpr int kChaosDelayQueue = 7117;

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_PROCESS_H_
