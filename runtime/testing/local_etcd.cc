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
  const std::string health =
      "etcdctl --endpoints=" + endpoint_ + " endpoint health >/dev/null 2>&1";
  for (int i = 0; i < 100 && !ready_ && pid_ > 0; ++i) {
    ready_ = std::system(health.c_str()) == 0;
    if (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

LocalEtcd::~LocalEtcd() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
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
