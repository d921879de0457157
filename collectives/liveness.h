// Private: the liveness channel of the UCX backend. Every pair of ranks holds one TCP connection
// (each rank listens on its own address: loopback when the world is on one host); each side writes
// a heartbeat byte every `interval`. A peer is dead when its connection reaches EOF or errors
// (exit, kill -9: detected at once) or when it has been silent for `timeout` (SIGSTOP, hang). A
// clean shutdown sends a goodbye byte first, so a departing peer is not reported. Silence is only
// counted while this monitor runs: a pause of its own (this process or the whole machine not
// scheduled: a paused VM, a starved host) moves every peer's clock on by the pause, since the
// peers' heartbeats could not have been read meanwhile; a peer silent past the pause is still
// reported, one timeout later. Silence is measured on the monotonic clock (base::MonotonicNow()):
// a step of the wall clock neither kills nor hides a peer. Threads: one monitor thread; `on_dead`
// runs on it, once per peer.
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

 private:
  Liveness() = default;
  void Loop();
  // Setup: a connection to every lower rank (dialing the address it published), then one from
  // every higher rank; peers_ holds each fd as soon as it is open.
  absl::Status ConnectToLower(Bootstrap* boot, const std::string& prefix, absl::Time deadline);
  absl::Status AcceptFromHigher(int listen_fd, Bootstrap* boot, const std::string& prefix,
                                absl::Time deadline);

  struct Peer {
    int fd = -1;
    int pid = 0;
    absl::Time last_heard;
    absl::Duration longest_pause;  // this monitor's, since the peer was last heard (the report)
    bool goodbye = false, reported = false;
  };
  int rank_ = 0;
  Options options_;
  OnDead on_dead_;
  std::vector<Peer> peers_;
  int wake_[2] = {-1, -1};  // self-pipe to stop the thread
  std::thread thread_;
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_LIVENESS_H_
