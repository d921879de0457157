#include "net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "troupe/base/clock.h"

namespace troupe::collectives::net {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return 1000;
  int64_t ms = absl::ToInt64Milliseconds(deadline - base::MonotonicNow());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 1000)));
}

}  // namespace

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::StatusOr<int> Listen(const std::string& address, int port, int* bound_port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address: expected an IPv4 address, got '", address, "'"));
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 128) != 0) {
    absl::Status st = Errno(absl::StrCat("bind/listen ", address, ":", port));
    close(fd);
    return st;
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *bound_port = ntohs(a.sin_port);
  return fd;
}

absl::StatusOr<int> Connect(const std::string& host, int port, absl::Time deadline) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("host expected an IPv4 address, got ", host));
  }
  const std::string peer = absl::StrCat(host, ":", port);
  for (;;) {
    // Non-blocking, so that a peer that never answers (dropped SYNs) costs no more than the
    // deadline, not the kernel's two-minute SYN timeout.
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return Errno("socket");
    int err = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? 0 : errno;
    while (err == EINPROGRESS || err == EINTR) {
      pollfd p{fd, POLLOUT, 0};
      const int r = poll(&p, 1, PollMs(deadline));
      if (r > 0) {
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else if (r < 0 && errno != EINTR) {
        err = errno;
      } else if (base::MonotonicNow() > deadline) {
        close(fd);
        return absl::DeadlineExceededError(
            absl::StrCat("connect ", peer, ": no answer before the deadline"));
      }
    }
    if (err == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      SetNoDelay(fd);
      return fd;
    }
    close(fd);
    absl::Status st =
        absl::UnavailableError(absl::StrCat("connect ", peer, ": ", std::strerror(err)));
    if (base::MonotonicNow() > deadline) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::StatusOr<int> Accept(int listen_fd, absl::Time deadline) {
  for (;;) {
    pollfd p{listen_fd, POLLIN, 0};
    int r = poll(&p, 1, PollMs(deadline));
    if (r > 0) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return Errno("accept");
      SetNoDelay(fd);
      return fd;
    }
    if (r < 0 && errno != EINTR) return Errno("poll");
    if (base::MonotonicNow() > deadline)
      return absl::DeadlineExceededError("accept: deadline passed");
  }
}

absl::Status ReadFull(int fd, void* buf, size_t n, absl::Time deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int r = poll(&pf, 1, PollMs(deadline));
    if (r < 0 && errno != EINTR) return Errno("poll");
    if (r <= 0) {
      if (base::MonotonicNow() > deadline)
        return absl::DeadlineExceededError("read: deadline passed");
      continue;
    }
    ssize_t k = read(fd, p, n);
    if (k == 0) return absl::UnavailableError("connection closed");
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("read");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return Errno("write");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

namespace {

// The first up IPv4 interface for which `pick` holds, as (name, address).
template <typename Pick>
absl::StatusOr<std::pair<std::string, std::string>> FindInterface(Pick pick) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return Errno("getifaddrs");
  std::pair<std::string, std::string> found;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
      continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
    if (pick(*i, std::string(text))) {
      found = {i->ifa_name, text};
      break;
    }
  }
  freeifaddrs(all);
  if (found.first.empty()) return absl::NotFoundError("no such interface");
  return found;
}

}  // namespace

absl::StatusOr<std::string> FirstExternalAddress() {
  auto i = FindInterface(
      [](const ifaddrs& i, const std::string&) { return !(i.ifa_flags & IFF_LOOPBACK); });
  if (!i.ok()) return absl::NotFoundError("no IPv4 interface other than loopback is up");
  return i->second;
}

absl::StatusOr<std::string> InterfaceOf(const std::string& address) {
  auto i = FindInterface([&](const ifaddrs&, const std::string& a) { return a == address; });
  if (!i.ok()) return absl::NotFoundError(absl::StrCat("no interface holds ", address));
  return i->first;
}

std::string HostKey() {
  std::string key;
  {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    in >> key;
  }
  for (const char* ns : {"/proc/self/ns/ipc", "/proc/self/ns/mnt"}) {
    char link[64] = {};
    const ssize_t n = readlink(ns, link, sizeof(link) - 1);
    absl::StrAppend(&key, "/", n > 0 ? std::string(link, static_cast<size_t>(n)) : "?");
  }
  return key;
}

}  // namespace troupe::collectives::net
