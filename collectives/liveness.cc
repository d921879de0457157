#include "liveness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "net.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

namespace {
constexpr int32_t kProbe = -1;  // the rank a probe's hello names

std::string Key(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "/live/", rank);
}
}  // namespace

std::vector<int> LivenessPeers(int rank, int size) {
  std::vector<int> out;
  if (size < 2) return out;
  out.push_back((rank + 1) % size);
  out.push_back((rank + size - 1) % size);
  for (int bit = 1; bit < size; bit <<= 1) {
    if ((rank ^ bit) < size) out.push_back(rank ^ bit);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), rank), out.end());
  return out;
}

absl::StatusOr<std::unique_ptr<Liveness>> Liveness::Start(Bootstrap* boot,
                                                          const std::string& prefix, int rank,
                                                          int size, const std::string& address,
                                                          Options options, OnDead on_dead,
                                                          absl::Time deadline) {
  std::unique_ptr<Liveness> l(new Liveness());
  l->rank_ = rank;
  l->options_ = options;
  l->on_dead_ = std::move(on_dead);
  l->peers_.resize(size);
  l->dead_.assign(size, 0);
  for (int p : LivenessPeers(rank, size)) l->peers_[p].watched = true;
  int port = 0;
  TROUPE_ASSIGN_OR_RETURN(auto lfd, net::Listen(address, 0, &port));
  absl::Status st =
      boot->Publish(Key(prefix, rank), absl::StrCat(address, " ", port, " ", getpid()));
  // Connect to lower ranks, accept from higher ones; the first 8 bytes name (rank, pid).
  if (st.ok()) st = l->ConnectToLower(boot, prefix, deadline);
  if (st.ok()) st = l->AcceptFromHigher(lfd, boot, prefix, deadline);
  l->listen_fd_ = lfd;
  if (!st.ok()) {  // the fds opened so far close with `l`
    return absl::Status(st.code(),
                        absl::StrCat("liveness setup of rank ", rank, ": ", st.message()));
  }
  if (pipe2(l->wake_, O_CLOEXEC) != 0) return absl::InternalError("liveness: pipe failed");
  const absl::Time now = base::MonotonicNow();
  for (auto& p : l->peers_) p.last_heard = now;
  l->thread_ = std::thread([raw = l.get()] { raw->Loop(); });
  return l;
}

// Dials rank `j` at the address it published and says who calls (`as`: a rank, or kProbe);
// the connected fd, and the peer's pid in *pid.
absl::StatusOr<int> Liveness::Dial(Bootstrap* boot, const std::string& prefix, int j, int32_t as,
                                   absl::Time deadline, int* pid) {
  TROUPE_ASSIGN_OR_RETURN(auto v, boot->Lookup(Key(prefix, j), deadline));
  char peer_address[64] = {};
  int peer_port = 0;
  if (std::sscanf(v.c_str(), "%63s %d %d", peer_address, &peer_port, pid) != 3) {
    return absl::DataLossError(
        absl::StrCat("liveness: rank ", j, " published '", v, "', expected 'ADDRESS PORT PID'"));
  }
  auto fd = net::Connect(peer_address, peer_port, deadline);
  if (!fd.ok()) {
    return BlamePeer(absl::Status(fd.status().code(),
                                  absl::StrCat("rank ", j, " (", peer_address, ":", peer_port,
                                               ") unreachable: ", fd.status().message())),
                     j);
  }
  const int32_t hello[2] = {as, static_cast<int32_t>(getpid())};
  if (absl::Status st = net::WriteFull(*fd, hello, sizeof(hello)); !st.ok()) {
    close(*fd);
    return BlamePeer(st, j);
  }
  return *fd;
}

absl::Status Liveness::ConnectToLower(Bootstrap* boot, const std::string& prefix,
                                      absl::Time deadline) {
  for (int j = 0; j < rank_; ++j) {
    if (!peers_[j].watched) continue;
    TROUPE_ASSIGN_OR_RETURN(peers_[j].fd, Dial(boot, prefix, j, rank_, deadline, &peers_[j].pid));
  }
  return absl::OkStatus();
}

absl::Status Liveness::AcceptFromHigher(int listen_fd, Bootstrap* boot, const std::string& prefix,
                                        absl::Time deadline) {
  const int size = static_cast<int>(peers_.size());
  int expected = 0;
  for (int k = rank_ + 1; k < size; ++k) expected += peers_[k].watched ? 1 : 0;
  for (int got = 0; got < expected;) {
    auto fd = net::Accept(listen_fd, deadline);
    if (!fd.ok()) {
      // Name the peers that never connected, with the addresses they published (if any).
      std::string missing;
      for (int m = rank_ + 1; m < size; ++m) {
        if (!peers_[m].watched || peers_[m].fd >= 0) continue;
        auto v = boot->Lookup(Key(prefix, m), base::MonotonicNow() + absl::Milliseconds(100));
        absl::StrAppend(&missing, missing.empty() ? "" : ", ", "rank ", m, " (",
                        v.ok() ? *v : "published nothing", ")");
      }
      // Not blamed on them: a rank that never connected may be stuck on a third one.
      return absl::Status(fd.status().code(),
                          absl::StrCat(fd.status().message(), "; never connected: ", missing));
    }
    int32_t hello[2];
    absl::Status st = net::ReadFull(*fd, hello, sizeof(hello), deadline);
    if (st.ok() && hello[0] == kProbe) {  // another rank's ProbeUnwatched, early
      close(*fd);
      continue;
    }
    if (st.ok() && (hello[0] <= rank_ || hello[0] >= size || !peers_[hello[0]].watched ||
                    peers_[hello[0]].fd >= 0)) {
      st = absl::DataLossError(absl::StrCat("liveness: unexpected hello from rank ", hello[0]));
    }
    if (!st.ok()) {
      close(*fd);
      return st;
    }
    peers_[hello[0]].fd = *fd;
    peers_[hello[0]].pid = hello[1];
    ++got;
  }
  return absl::OkStatus();
}

Liveness::~Liveness() {
  if (thread_.joinable()) {
    for (auto& p : peers_) {
      if (p.fd >= 0) (void)!send(p.fd, "B", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    (void)!write(wake_[1], "x", 1);
    thread_.join();
  }
  for (auto& p : peers_) {
    if (p.fd >= 0) close(p.fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_[0] >= 0) close(wake_[0]), close(wake_[1]);
}

absl::Status Liveness::ProbeUnwatched(Bootstrap* boot, const std::string& prefix,
                                      absl::Time deadline) {
  for (int j = 0; j < static_cast<int>(peers_.size()); ++j) {
    if (j == rank_ || peers_[j].watched) continue;
    int pid = 0;
    TROUPE_ASSIGN_OR_RETURN(int fd, Dial(boot, prefix, j, kProbe, deadline, &pid));
    close(fd);
  }
  return absl::OkStatus();
}

void Liveness::Loop() {
  const int interval_ms = std::max<int>(1, absl::ToInt64Milliseconds(options_.interval));
  absl::Time last_sent = absl::InfinitePast(), last_round = base::MonotonicNow();
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (;;) {
    const absl::Time now = base::MonotonicNow();
    if (now - last_sent >= options_.interval) {
      for (auto& p : peers_) {
        if (p.fd >= 0 && !p.reported && !p.closed) {
          (void)!send(p.fd, "H", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      }
      last_sent = now;
    }
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    who.assign(1, -1);
    fds.push_back(pollfd{listen_fd_, POLLIN, 0});
    who.push_back(-1);
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (peers_[i].fd >= 0 && !peers_[i].reported && !peers_[i].closed) {
        fds.push_back(pollfd{peers_[i].fd, POLLIN, 0});
        who.push_back(static_cast<int>(i));
      }
    }
    poll(fds.data(), fds.size(), interval_ms);
    if (fds[0].revents != 0) return;
    const absl::Time t = base::MonotonicNow();
    // An iteration takes at most the poll's interval; beyond that (and a scheduling slack of one
    // more interval) this thread was not running, and what the peers sent meanwhile was not read.
    const absl::Duration late = t - last_round - options_.interval;
    last_round = t;
    if (late > options_.interval) {
      for (Peer& p : peers_) p.last_heard += late - options_.interval;
    }
    if (fds[1].revents != 0) {  // a probe: nothing to say to it
      const int probe = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (probe >= 0) close(probe);
    }
    for (size_t k = 2; k < fds.size(); ++k) {
      Peer& p = peers_[who[k]];
      p.longest_pause = std::max(p.longest_pause, late);
      std::string why;
      if (fds[k].revents != 0) {
        char buf[256];
        ssize_t n = recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
          p.last_heard = t;
          p.longest_pause = absl::ZeroDuration();
          ReadFrom(who[k], buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          if (!p.goodbye) why = "its liveness connection closed (process exited or was killed)";
          p.goodbye = p.closed = true;
        }
      }
      if (why.empty() && !p.goodbye && t - p.last_heard > options_.timeout) {
        why = absl::StrCat("no heartbeat for ", absl::FormatDuration(t - p.last_heard),
                           " (stopped or hung; liveness timeout ",
                           absl::FormatDuration(options_.timeout),
                           "; the longest pause of this rank's monitor meanwhile: ",
                           absl::FormatDuration(p.longest_pause), ")");
      }
      if (!why.empty()) Report(who[k], p.pid, why, -1);
    }
  }
}

void Liveness::ReadFrom(int k, const char* buf, size_t n) {
  Peer& p = peers_[k];
  for (size_t i = 0; i < n; ++i) {
    const char c = buf[i];
    if (p.frame.empty()) {
      if (c == 'D') p.frame = "D";
      p.goodbye |= c == 'B';
      continue;
    }
    if (c != ';') {
      if (p.frame.size() < 32) p.frame += c;
      continue;
    }
    int dead = -1, pid = 0;
    const bool parsed = std::sscanf(p.frame.c_str(), "D%d %d", &dead, &pid) == 2;
    p.frame.clear();
    if (parsed && dead >= 0 && dead < static_cast<int>(peers_.size()) && dead != rank_) {
      Report(dead, pid, absl::StrCat("rank ", k, " saw it die"), k);
    }
  }
}

void Liveness::Report(int dead, int pid, const std::string& why, int told_by) {
  peers_[dead].reported = true;
  if (dead_[dead]) return;
  dead_[dead] = 1;
  // The peers are told before on_dead runs: on_dead fails this rank's operation, whose thread may
  // then destroy this object at once, and the destructor's goodbye must not reach a peer ahead of
  // the notice (the stream keeps this order).
  const std::string notice = absl::StrCat("D", dead, " ", pid, ";");
  for (size_t q = 0; q < peers_.size(); ++q) {
    const Peer& to = peers_[q];
    if (static_cast<int>(q) == told_by || to.fd < 0 || to.reported || to.goodbye) continue;
    (void)!send(to.fd, notice.data(), notice.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  on_dead_(dead, absl::StrCat("peer rank ", dead, " (pid ", pid, ") is dead: ", why));
}

}  // namespace troupe::collectives
