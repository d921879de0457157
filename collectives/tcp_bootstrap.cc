// The standalone TCP bootstrap. Wire format, each field little-endian:
//   request  'P' u32 key_len key u32 value_len value   -> reply 'K'
//   request  'L' u32 key_len key                        -> reply 'V' u32 value_len value
// A lookup of an absent key is answered when the key is published.
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "net.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/bootstrap.h"

namespace troupe::collectives {
namespace {

constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 16u << 20;

absl::Status ReadString(int fd, uint32_t limit, std::string* out, absl::Time deadline) {
  uint32_t len;
  TROUPE_RETURN_IF_ERROR(net::ReadFull(fd, &len, 4, deadline));
  if (len > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("bootstrap: length expected at most ", limit, ", got ", len));
  }
  out->resize(len);
  return net::ReadFull(fd, out->data(), len, deadline);
}

absl::Status WriteString(int fd, char kind, const std::string& s) {
  std::string msg(1, kind);
  uint32_t len = static_cast<uint32_t>(s.size());
  msg.append(reinterpret_cast<const char*>(&len), 4);
  msg += s;
  return net::WriteFull(fd, msg.data(), msg.size());
}

class Server : public TcpBootstrapServer {
 public:
  Server(int fd, int port) : listen_fd_(fd), port_(port) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~Server() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      for (int fd : clients_) shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    for (auto& t : threads_) t.join();
    for (int fd : clients_) close(fd);
    close(listen_fd_);
  }
  int port() const override { return port_; }

 private:
  void AcceptLoop() {
    for (;;) {
      auto fd = net::Accept(listen_fd_, base::MonotonicNow() + absl::Milliseconds(200));
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) {
        if (fd.ok()) close(*fd);
        return;
      }
      if (!fd.ok()) continue;
      clients_.push_back(*fd);
      threads_.emplace_back([this, c = *fd] { Serve(c); });
    }
  }

  void Serve(int fd) {
    for (;;) {
      char kind;
      if (!net::ReadFull(fd, &kind, 1, absl::InfiniteFuture()).ok()) return;
      std::string key, value;
      if (!ReadString(fd, kMaxKey, &key, absl::InfiniteFuture()).ok()) break;
      if (kind == 'P') {
        if (!ReadString(fd, kMaxValue, &value, absl::InfiniteFuture()).ok()) break;
        {
          std::lock_guard<std::mutex> l(mu_);
          store_[key] = value;
        }
        cv_.notify_all();
        if (!net::WriteFull(fd, "K", 1).ok()) break;
      } else if (kind == 'L') {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || store_.count(key) > 0; });
        if (stop_) break;
        value = store_[key];
        l.unlock();
        if (!WriteString(fd, 'V', value).ok()) break;
      } else {
        break;  // garbage: cut the client off
      }
    }
    shutdown(fd, SHUT_RDWR);
  }

  const int listen_fd_, port_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> store_;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  std::thread accept_thread_;
};

class Client : public TcpBootstrapClient {
 public:
  explicit Client(int fd) : fd_(fd) {}
  ~Client() override { close(fd_); }

  absl::Status Publish(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.ok()) return broken_;
    std::string msg(1, 'P');
    uint32_t kl = static_cast<uint32_t>(key.size()), vl = static_cast<uint32_t>(value.size());
    msg.append(reinterpret_cast<const char*>(&kl), 4).append(key);
    msg.append(reinterpret_cast<const char*>(&vl), 4).append(value);
    absl::Status st = net::WriteFull(fd_, msg.data(), msg.size());
    char ack = 0;
    if (st.ok()) st = net::ReadFull(fd_, &ack, 1, base::MonotonicNow() + absl::Seconds(30));
    if (st.ok() && ack != 'K') st = absl::DataLossError("bootstrap: bad publish reply");
    return Check(st);
  }

  absl::StatusOr<std::string> Lookup(const std::string& key, absl::Time deadline) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.ok()) return broken_;
    absl::Status st = WriteString(fd_, 'L', key);
    char kind = 0;
    if (st.ok()) st = net::ReadFull(fd_, &kind, 1, deadline);
    if (st.ok() && kind != 'V') st = absl::DataLossError("bootstrap: bad lookup reply");
    std::string value;
    if (st.ok()) st = ReadString(fd_, kMaxValue, &value, deadline);
    if (!Check(st).ok()) {
      return absl::Status(st.code(), absl::StrCat("bootstrap lookup '", key, "': ", st.message()));
    }
    return value;
  }

 private:
  // Any failure leaves the stream out of step: the client is unusable afterwards.
  absl::Status Check(absl::Status st) {
    if (!st.ok()) broken_ = st;
    return st;
  }
  const int fd_;
  std::mutex mu_;
  absl::Status broken_;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> Bootstrap::LookupAll(const std::vector<std::string>& keys,
                                                              absl::Time deadline) {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    TROUPE_ASSIGN_OR_RETURN(std::string v, Lookup(key, deadline));
    values.push_back(std::move(v));
  }
  return values;
}

absl::StatusOr<std::unique_ptr<TcpBootstrapServer>> TcpBootstrapServer::Start(
    int port, const std::string& address) {
  int bound = 0;
  TROUPE_ASSIGN_OR_RETURN(auto fd, net::Listen(address, port, &bound));
  return std::unique_ptr<TcpBootstrapServer>(new Server(fd, bound));
}

absl::StatusOr<std::unique_ptr<TcpBootstrapClient>> TcpBootstrapClient::Connect(
    const std::string& host, int port, absl::Time deadline) {
  TROUPE_ASSIGN_OR_RETURN(auto fd, net::Connect(host, port, deadline));
  return std::unique_ptr<TcpBootstrapClient>(new Client(fd));
}

}  // namespace troupe::collectives
