// bench_remote_tcp: the floor — a blocking TCP ping-pong of 8 bytes with TCP_NODELAY, one
// send() and one recv() per direction, nothing else.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "remote_common.h"

namespace {

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int Server() {
  bench_remote::StartContextSwitchReporter();
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(lfd, 4) != 0) {
    std::perror("bind/listen");
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  bench_remote::PrintPort(ntohs(addr.sin_port));
  int fd = accept(lfd, nullptr, nullptr);
  NoDelay(fd);
  char buf[8];
  while (ReadAll(fd, buf, 8)) {
    if (send(fd, buf, 8, MSG_NOSIGNAL) != 8) break;
  }
  for (;;) pause();  // until killed, answering SIGUSR1 (like the other servers)
}

int Client(int port, double seconds) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("connect");
    return 1;
  }
  NoDelay(fd);
  auto stats = bench_remote::Measure(
      [&](int64_t x) {
        char buf[8];
        std::memcpy(buf, &x, 8);
        if (send(fd, buf, 8, MSG_NOSIGNAL) != 8 || !ReadAll(fd, buf, 8)) return false;
        int64_t y;
        std::memcpy(&y, buf, 8);
        return y == x;
      },
      seconds);
  return bench_remote::Print(stats);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "server") == 0) return Server();
  if (argc >= 3 && std::strcmp(argv[1], "client") == 0)
    return Client(std::atoi(argv[2]), argc > 3 ? std::atof(argv[3]) : 1.5);
  return bench_remote::Usage(argv[0]);
}
