#include "net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace troupe::collectives::net {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return 1000;
  int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 1000)));
}

}  // namespace

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::StatusOr<int> Listen(int port, int* bound_port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 128) != 0) {
    absl::Status st = Errno(absl::StrCat("bind/listen 127.0.0.1:", port));
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
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      SetNoDelay(fd);
      return fd;
    }
    absl::Status st = Errno(absl::StrCat("connect ", host, ":", port));
    close(fd);
    if (absl::Now() > deadline) return st;
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
    if (absl::Now() > deadline) return absl::DeadlineExceededError("accept: deadline passed");
  }
}

absl::Status ReadFull(int fd, void* buf, size_t n, absl::Time deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int r = poll(&pf, 1, PollMs(deadline));
    if (r < 0 && errno != EINTR) return Errno("poll");
    if (r <= 0) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("read: deadline passed");
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

}  // namespace troupe::collectives::net
