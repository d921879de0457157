// Private: the liveness channel of the UCX backend. A rank watches O(log W) peers, not all of them
// (LivenessPeers: its ring neighbours and the ranks one bit away, r XOR 2^i — connected, of
// diameter at most ceil(log2 W) + 1, and still connected without any one rank): one TCP
// connection per pair of watchers (each rank listens on its own address: loopback when the world
// is on one host); each side writes a heartbeat byte every `interval`. A peer is dead when its
// connection reaches EOF or errors (exit, kill -9: detected at once) or when it has been silent for
// `timeout` (SIGSTOP, hang). A rank that sees a death tells its other peers ("D<rank> <pid>;"),
// and each tells its own once, so every rank learns of any death within a few hops. A clean
// shutdown sends a goodbye byte first, so a departing peer is not reported. Silence is only
// counted while this monitor runs: a pause of its own (this process or the whole machine not
// scheduled: a paused VM, a starved host) moves every peer's clock on by the pause, since the
// peers' heartbeats could not have been read meanwhile; a peer silent past the pause is still
// reported, one timeout later. Silence is measured on the monotonic clock (base::MonotonicNow()):
// a step of the wall clock neither kills nor hides a peer. Threads: one monitor thread; `on_dead`
// runs on it, once per dead rank (watched or told).
#ifndef TROUPE_COLLECTIVES_LIVENESS_H_
#define TROUPE_COLLECTIVES_LIVENESS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "troupe/collectives/bootstrap.h"

namespace troupe::collectives {

// The ranks `rank` watches in a world of `size`, ascending: (rank ± 1) mod size and every
// rank XOR 2^i below size. Symmetric: q is in LivenessPeers(p) exactly when p is in
// LivenessPeers(q).
std::vector<int> LivenessPeers(int rank, int size);

class Liveness {
 public:
  using OnDead = std::function<void(int rank, const std::string& why)>;
  struct Options {
    absl::Duration interval = absl::Milliseconds(100);
    absl::Duration timeout = absl::Seconds(5);
  };
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Liveness>> Start(
      Bootstrap* boot, const std::string& prefix, int rank, int size, const std::string& address,
      Options options, OnDead on_dead, absl::Time deadline);
  ~Liveness();
  // Connects to every rank this one does not watch and closes at once: a peer that cannot be
  // reached (a cut link) is Unavailable naming it, within the deadline — before a transport
  // whose connect would wait out the kernel's SYN retries. The listener stays open for these.
  [[nodiscard]] absl::Status ProbeUnwatched(Bootstrap* boot, const std::string& prefix,
                                            absl::Time deadline);

 private:
  Liveness() = default;
  void Loop();
  // Setup: a connection to every lower watched rank (dialing the address it published), then one
  // from every higher one; peers_ holds each fd as soon as it is open.
  absl::Status ConnectToLower(Bootstrap* boot, const std::string& prefix, absl::Time deadline);
  absl::StatusOr<int> Dial(Bootstrap* boot, const std::string& prefix, int j, int32_t as,
                           absl::Time deadline, int* pid);
  absl::Status AcceptFromHigher(int listen_fd, Bootstrap* boot, const std::string& prefix,
                                absl::Time deadline);

  struct Peer {
    int fd = -1;
    int pid = 0;
    absl::Time last_heard;
    absl::Duration longest_pause;  // this monitor's, since the peer was last heard (the report)
    // goodbye: it is shutting down, so its silence and its EOF are not a death; what it sent
    // before (a death notice: another rank's monitor may send one after its own goodbye, see
    // Report) is still read, until EOF (closed).
    bool goodbye = false, reported = false, closed = false;
    bool watched = false;  // in LivenessPeers
    std::string frame;     // a death notice being read ("D<rank> <pid>;")
  };
  // Rank `dead` is dead (`why`): every other peer is told, then on_dead runs (once).
  void Report(int dead, int pid, const std::string& why, int told_by);
  void ReadFrom(int k, const char* buf, size_t n);
  int rank_ = 0;
  Options options_;
  OnDead on_dead_;
  std::vector<Peer> peers_;  // by rank; fd -1 where not watched
  std::vector<char> dead_;   // by rank: reported
  int listen_fd_ = -1;       // probes (ProbeUnwatched) are accepted and closed
  int wake_[2] = {-1, -1};   // self-pipe to stop the thread
  std::thread thread_;
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_LIVENESS_H_
