#include "troupe/runtime/local_etcd.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace troupe::runtime::testing {

LocalEtcd::LocalEtcd(const std::string& dir) : dir_(dir) {
  const int client = FreePort(), peer = FreePort();
  endpoint_ = "127.0.0.1:" + std::to_string(client);
  pid_ = fork();
  if (pid_ == 0) {
    if (std::freopen((dir + "/etcd.log").c_str(), "w", stdout) == nullptr ||
        std::freopen((dir + "/etcd.log").c_str(), "a", stderr) == nullptr) {
      _exit(126);
    }
    const std::string c = "http://" + endpoint_, p = "http://127.0.0.1:" + std::to_string(peer);
    execlp("etcd", "etcd", "--data-dir", (dir + "/etcd").c_str(), "--listen-client-urls", c.c_str(),
           "--advertise-client-urls", c.c_str(), "--listen-peer-urls", p.c_str(),
           "--initial-advertise-peer-urls", p.c_str(), "--initial-cluster",
           ("default=" + p).c_str(), "--heartbeat-interval", "10", "--election-timeout", "100",
           static_cast<char*>(nullptr));
    _exit(127);
  }
  // Bounded by the clock, not by a count of tries: on a loaded machine one etcdctl call can
  // take seconds (its own timeouts bounded here too), and a hundred of them ran past a test's
  // whole deadline with nothing said.
  const std::string health =
      "etcdctl --dial-timeout=1s --command-timeout=2s --endpoints=" + endpoint_ +
      " endpoint health >/dev/null 2>&1";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ready_ && pid_ > 0 && std::chrono::steady_clock::now() < deadline &&
         waitpid(pid_, nullptr, WNOHANG) == 0) {
    ready_ = std::system(health.c_str()) == 0;
    if (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

LocalEtcd::~LocalEtcd() {
  if (pid_ > 0) {
    // A graceful stop first; an etcd that does not stop within 5 s is killed.
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::filesystem::remove_all(dir_ + "/etcd");
}

std::string LocalEtcd::log() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int LocalEtcd::FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace troupe::runtime::testing
