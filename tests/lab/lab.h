// A lab of hosts on one machine, for tests: each host has its own network, IPC, mount
// (private /dev/shm and /tmp), PID and UTS namespace and its own address, linked to the others
// through a router namespace; a shared directory (the stand-in for NFS) sits at the same path
// on every host. The lab is made and removed by scripts/lab (its header describes the topology);
// this class drives it and runs processes inside hosts.
//
//   troupe::lab::Lab lab("trlabt");            // hosts trlabt-h1, trlabt-h2, ...
//   ASSERT_TRUE(lab.Up(3).ok());               // removes a stale lab of the same name first
//   auto r = lab.Exec("trlabt-h1", "hostname"); // r->output == "trlabt-h1\n"
//   auto pid = lab.Spawn("trlabt-h2", {"troupe", "node", "--head", lab.Address("trlabt-h1")});
//   ...                                         // ~Lab() (or Down()) leaves nothing behind
//
// A pid from Spawn is a child of the calling process, seen from the machine's PID namespace:
// waitpid() gives the program's exit status, and a signal to it reaches the program (SIGKILL
// kills the program too). Up(), Down(), Exec() and Spawn() may be called from one thread only.
// Needs root, like CI; Up() fails (never skips) with the reason when namespaces cannot be made.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::lab {

struct LabHost {
  std::string name;     // also its hostname and its name in every host's /etc/hosts
  std::string address;  // its IPv4 address on its link to the router
  pid_t init_pid = 0;   // PID 1 of the host's PID namespace, seen from the machine
};

// What Probe measured: ICMP echoes from one host to another.
struct ProbeResult {
  int sent = 0, received = 0;
  double loss = 0;               // lost fraction, [0, 1]
  double rtt_ms = 0;             // mean round trip of the echoes that came back
  std::string Describe() const;  // "rtt 0.031 ms, loss 1.0% (2 of 200)"
};

struct ExecResult {
  int exit_code = -1;  // the shell's exit status; 128+N when killed by signal N
  std::string output;  // stdout and stderr together
};

class Lab {
 public:
  // `name`: "trlab" plus up to 4 of [a-z0-9]; one lab of a name at a time on a machine.
  explicit Lab(std::string name = "trlabt");
  ~Lab();  // Down(), reporting a failure on stderr
  Lab(const Lab&) = delete;
  Lab& operator=(const Lab&) = delete;

  // Starts hosts <name>-h1..<name>-hN (a stale lab of this name, e.g. from a killed test, is
  // removed first). FailedPrecondition with the script's message when it cannot.
  [[nodiscard]] absl::Status Up(int n);
  // Kills every process of every host, removes namespaces, links, mounts and the shared
  // directory, and verifies that nothing remains (Internal, naming what is left, otherwise).
  // Reaps the processes from Spawn() that the caller has not waited for.
  [[nodiscard]] absl::Status Down();

  // Runs `sh -c cmd` inside `host` and waits for it and for its output to end: a background
  // process started by cmd must redirect its stdout/stderr, or Exec waits for it too.
  [[nodiscard]] absl::StatusOr<ExecResult> Exec(const std::string& host, const std::string& cmd);
  // Starts argv (argv[0] looked up in PATH) inside `host`; returns its pid (see the banner).
  [[nodiscard]] absl::StatusOr<pid_t> Spawn(const std::string& host,
                                            const std::vector<std::string>& argv);

  // Kills every process of `host` at once (SIGKILL to its PID namespace's init), as pulling a
  // machine's plug would; its network namespace and link stay (Down() removes them). Returns when
  // the init is gone.
  [[nodiscard]] absl::Status PullPlug(const std::string& host);

  // Partitions `host` on the router: drops what reaches it ("in"), what it sends ("out"), or
  // both; with `peer`, only its traffic with that host. Heal removes its cuts. Down() removes any
  // cut with the router.
  [[nodiscard]] absl::Status Cut(const std::string& host, const std::string& direction = "both",
                                 const std::string& peer = "");
  [[nodiscard]] absl::Status Heal(const std::string& host);
  // `host`'s link, each way: drops `loss_percent` of packets at random, caps the rate at
  // `rate_mbit` Mbit/s (0: no cap); with `peers`, only its traffic with them (one cap shared by
  // them). Unshape removes both; so does Down().
  [[nodiscard]] absl::Status Shape(const std::string& host, double loss_percent, int rate_mbit,
                                   const std::vector<std::string>& peers = {});
  [[nodiscard]] absl::Status Unshape(const std::string& host);
  // Holds every packet to or from `host` for `ms` (± `jitter_ms`, uniform) on the router, once (a
  // packet between two delayed hosts is held by the first one's rule): with the same delay on
  // every host, every round trip grows by 2*ms. With `peers`, only packets between `host` and
  // them. Undelay removes it; so does Down().
  [[nodiscard]] absl::Status Delay(const std::string& host, double ms, double jitter_ms = 0,
                                   const std::vector<std::string>& peers = {});
  [[nodiscard]] absl::Status Undelay(const std::string& host);
  // `count` echoes of `payload` bytes from `from` to `to`, 10 ms apart (40 ms where an echo is
  // more than one packet: lab.cc says why): what the network achieves. A reply counts however
  // late it comes within 3 s + count / 50 s (+ count / 25 s for the larger echoes; a cut link
  // takes that long).
  [[nodiscard]] absl::StatusOr<ProbeResult> Probe(const std::string& from, const std::string& to,
                                                  int count = 200, int payload = 56);

  const std::string& name() const { return name_; }
  const std::vector<LabHost>& hosts() const { return hosts_; }
  // Address of `host`; empty if there is no such host.
  std::string Address(const std::string& host) const;
  // The directory every host sees at this same path (writable by all).
  const std::string& shared_dir() const { return shared_dir_; }
  // The lab's state directory (/run/troupe-lab/<name>).
  std::string state_dir() const;

 private:
  const LabHost* Find(const std::string& host) const;

  std::string name_;
  std::vector<LabHost> hosts_;
  std::string shared_dir_;
  std::vector<pid_t> spawned_;  // reaped by Down() if the caller did not wait for them
  bool up_ = false;
};

// Runs argv on this machine (not in a host) and waits; output is stdout and stderr together.
[[nodiscard]] absl::StatusOr<ExecResult> RunHere(const std::vector<std::string>& argv);

}  // namespace troupe::lab
