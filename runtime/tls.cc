#include "internal/tls.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "caf/io/all.hpp"
#include "internal/context.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/log.h"

namespace troupe::runtime {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<FILE, FileCloser>;
using Key = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using Cert = std::unique_ptr<X509, decltype(&X509_free)>;

absl::StatusOr<Cert> ReadCert(const std::string& path, const char* what) {
  File f(std::fopen(path.c_str(), "r"));
  if (!f) return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': cannot open"));
  Cert c(PEM_read_X509(f.get(), nullptr, nullptr, nullptr), X509_free);
  if (!c) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': expected a PEM certificate"));
  }
  return c;
}

absl::StatusOr<Key> ReadKey(const std::string& path, const char* what = "--tls_key") {
  File f(std::fopen(path.c_str(), "r"));
  if (!f) return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': cannot open"));
  Key k(PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!k) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': expected an unencrypted PEM private key"));
  }
  return k;
}

Key NewKey() {
  EVP_PKEY* k = EVP_EC_gen("P-256");
  return Key(k, EVP_PKEY_free);
}

absl::Status WritePem(const std::string& path, EVP_PKEY* key, X509* cert) {
  std::string tmp = path + ".tmp";
  File f(std::fopen(tmp.c_str(), "w"));
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write '", tmp, "'"));
  if (key) chmod(tmp.c_str(), 0600);
  bool ok = key ? PEM_write_PrivateKey(f.get(), key, nullptr, nullptr, 0, nullptr, nullptr)
                : PEM_write_X509(f.get(), cert);
  if (!ok || std::fflush(f.get()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write '", tmp, "'"));
  }
  f.reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename '", tmp, "'"));
  }
  return absl::OkStatus();
}

// `san`: the subjectAltName ("DNS:a,IP:10.0.0.1"); "" for none (the CA).
Cert MakeCert(const std::string& cn, const std::string& san, EVP_PKEY* key, X509* issuer,
              EVP_PKEY* issuer_key, long serial) {
  Cert c(X509_new(), X509_free);
  X509_set_version(c.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c.get()), 60L * 60 * 24 * 3650);
  X509_set_pubkey(c.get(), key);
  X509_NAME* name = X509_get_subject_name(c.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("troupe cluster"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(c.get(), issuer ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer : c.get(), c.get(), nullptr, nullptr, 0);
  const bool is_ca = issuer == nullptr;
  for (const auto& [nid, value] :
       {std::pair<int, std::string>{NID_basic_constraints,
                                    is_ca ? "critical,CA:TRUE" : "critical,CA:FALSE"},
        {NID_subject_alt_name, san}}) {
    if (value.empty()) continue;
    if (X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str())) {
      X509_add_ext(c.get(), ext, -1);
      X509_EXTENSION_free(ext);
    }
  }
  X509_sign(c.get(), issuer_key ? issuer_key : key, EVP_sha256());
  return c;
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// A member of `troupe certs --members`: "NAME" or "NAME=ADDR[+ADDR...]". Its certificate names
// NAME and the addresses peers dial it at (host names or IPs); with none, loopback (one machine).
absl::StatusOr<std::pair<std::string, std::string>> ParseMember(const std::string& text) {
  auto plain = [](const std::string& x) {  // a file name, a DNS name
    return !x.empty() && std::all_of(x.begin(), x.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
  };
  const size_t eq = text.find('=');
  const std::string name = text.substr(0, eq);
  if (!plain(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--members: expected NAME[=ADDR[+ADDR...]] with NAME of [A-Za-z0-9._-], got '", text, "'"));
  }
  std::string san = absl::StrCat("DNS:", name);
  std::vector<std::string> addrs = {"127.0.0.1", "localhost"};
  if (eq != std::string::npos) addrs = absl::StrSplit(text.substr(eq + 1), '+');
  for (const std::string& a : addrs) {
    if (!IsIpAddress(a) && !plain(a)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--members: member '", name, "': expected a host name or an IP address, got '", a, "'"));
    }
    absl::StrAppend(&san, IsIpAddress(a) ? ",IP:" : ",DNS:", a);
  }
  return std::make_pair(name, san);
}

}  // namespace

absl::Status GenerateClusterCertificates(const std::string& dir,
                                         const std::vector<std::string>& members,
                                         const std::string& ca_dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {  // mkdir -p
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
        return absl::UnavailableError(
            absl::StrCat("cannot create '", part, "': ", std::strerror(errno)));
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> parsed;  // name, subjectAltName
  for (const std::string& m : members) {
    TROUPE_ASSIGN_OR_RETURN(auto p, ParseMember(m));
    parsed.push_back(p);
  }
  Key ca_key(nullptr, EVP_PKEY_free);
  Cert ca(nullptr, X509_free);
  long serial = 2;
  if (ca_dir.empty()) {
    ca_key = NewKey();
    if (!ca_key) return absl::InternalError("cannot generate a key (OpenSSL)");
    ca = MakeCert("troupe cluster CA", "", ca_key.get(), nullptr, nullptr, 1);
    TROUPE_RETURN_IF_ERROR(WritePem(dir + "/ca.key", ca_key.get(), nullptr));
  } else {
    // An existing CA (a Kubernetes Secret): its key stays where it is; the serials of the
    // certificates it issues here, at different times and places, are random.
    TROUPE_ASSIGN_OR_RETURN(Cert c, ReadCert(ca_dir + "/ca.pem", "--ca"));
    TROUPE_ASSIGN_OR_RETURN(Key k, ReadKey(ca_dir + "/ca.key", "--ca"));
    ca = std::move(c);
    ca_key = std::move(k);
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof serial) != 1) {
      return absl::InternalError("cannot draw a serial number (OpenSSL)");
    }
    serial = (serial & 0x3fffffffffffffffL) | 1;
  }
  TROUPE_RETURN_IF_ERROR(WritePem(dir + "/ca.pem", nullptr, ca.get()));
  for (const auto& [m, san] : parsed) {
    Key key = NewKey();
    Cert cert = MakeCert(m, san, key.get(), ca.get(), ca_key.get(), serial++);
    TROUPE_RETURN_IF_ERROR(WritePem(dir + "/" + m + ".pem", nullptr, cert.get()));
    TROUPE_RETURN_IF_ERROR(WritePem(dir + "/" + m + ".key", key.get(), nullptr));
  }
  return absl::OkStatus();
}

namespace internal {
namespace {

using Ssl = std::unique_ptr<SSL, decltype(&SSL_free)>;
using SslCtx = std::shared_ptr<SSL_CTX>;

// One SSL_CTX per process role side: our certificate, the cluster CA, peers verified.
absl::StatusOr<SslCtx> MakeContext(const RuntimeOptions& o, bool server) {
  SslCtx ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()), SSL_CTX_free);
  if (!ctx) return absl::InternalError("SSL_CTX_new failed");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.tls_cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), o.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_load_verify_locations(ctx.get(), o.tls_ca.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError("cannot load the TLS certificate, key or CA");
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

void SetTimeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int Listen(const std::string& host, uint16_t port, uint16_t* bound) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
      bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 128) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *bound = ntohs(a.sin_port);
  return fd;
}

int Dial(const std::string& host, uint16_t port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* r = res; r; r = r->ai_next) {
    fd = socket(r->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, r->ai_addr, r->ai_addrlen) == 0) break;
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) NoDelay(fd);
  return fd;
}

// Moves bytes between a TLS session and a plain socket until either side closes.
void Pump(SSL* ssl, int tls_fd, int plain_fd) {
  char buf[16384];
  pollfd fds[2] = {{tls_fd, POLLIN, 0}, {plain_fd, POLLIN, 0}};
  while (true) {
    if (SSL_pending(ssl) == 0 && poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (SSL_pending(ssl) > 0 || (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n <= 0) return;
      for (int off = 0; off < n;) {
        ssize_t w = send(plain_fd, buf + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) return;
        off += static_cast<int>(w);
      }
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(plain_fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      if (SSL_write(ssl, buf, static_cast<int>(n)) <= 0) return;
    }
    fds[0].revents = fds[1].revents = 0;
  }
}

// A TLS front door or a local TLS dialer: accepts on `listen_fd`; for each connection runs
// `serve(fd)` on its own thread. Lives as long as the runtime that owns it.
class Relay {
 public:
  Relay(int listen_fd, std::function<void(int)> serve)
      : listen_fd_(listen_fd), serve_(std::move(serve)) {
    thread_ = std::thread([this] {
      // SSL_write to a peer that is gone raises SIGPIPE, which would kill the whole process (a
      // head that loses one worker would take the cluster down with it): blocked here, and in
      // the connection threads, which inherit this mask, the write fails with EPIPE instead.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      while (true) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          return;  // closed: shutting down
        }
        NoDelay(fd);
        std::thread(serve_, fd).detach();
      }
    });
  }
  ~Relay() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    thread_.join();
  }

 private:
  int listen_fd_;
  std::function<void(int)> serve_;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<SSL_CTX>> DirectTlsContext(const RuntimeOptions& o, bool server) {
  static std::mutex mu;
  static auto* made = new std::map<std::string, SslCtx>;
  std::string key = absl::StrCat(server ? "s|" : "c|", o.tls_ca, "|", o.tls_cert, "|", o.tls_key);
  std::lock_guard<std::mutex> l(mu);
  if (auto it = made->find(key); it != made->end()) return it->second;
  TROUPE_ASSIGN_OR_RETURN(auto ctx, MakeContext(o, server));
  // Whole records per recv(), and no session tickets after the handshake: connections are
  // pooled, not resumed.
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  if (server) SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  (*made)[key] = ctx;
  return ctx;
}

absl::Status CheckTlsFiles(const std::string& ca, const std::string& cert, const std::string& key) {
  auto c = ReadCert(ca, "--tls_ca");
  if (!c.ok()) return c.status();
  TROUPE_ASSIGN_OR_RETURN(auto mine, ReadCert(cert, "--tls_cert"));
  TROUPE_ASSIGN_OR_RETURN(auto k, ReadKey(key));
  if (X509_check_private_key(mine.get(), k.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key '", key, "' does not match --tls_cert '", cert, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint16_t> Publish(Runtime& runtime, const caf::actor& handle, uint16_t port,
                                 const std::string& host) {
  auto& sys = runtime.system();
  const RuntimeOptions& o = runtime.options();
  bool tls = o.tls();
  // With TLS, CAF listens on loopback only; the public port is our TLS front door, which
  // authenticates each peer before a single byte reaches CAF's protocol.
  auto caf_port =
      sys.middleman().publish(handle, tls ? 0 : port, tls ? "127.0.0.1" : host.c_str(), true);
  if (!caf_port) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", sys.render(caf_port.error())));
  }
  if (!tls) return *caf_port;
  TROUPE_ASSIGN_OR_RETURN(auto ctx, MakeContext(o, /*server=*/true));
  uint16_t bound = 0;
  int fd = Listen(host, port, &bound);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  uint16_t inner = *caf_port;
  SslCtx shared = ctx;
  auto relay = std::make_shared<Relay>(fd, [shared, inner](int client) {
    Ssl ssl(SSL_new(shared.get()), SSL_free);
    SSL_set_fd(ssl.get(), client);
    SetTimeout(client, 1000);  // a peer gets 1 s to authenticate, then it is cut off
    if (SSL_accept(ssl.get()) != 1) {
      close(client);
      return;
    }
    SetTimeout(client, 0);
    int plain = Dial("127.0.0.1", inner);
    if (plain >= 0) Pump(ssl.get(), client, plain);
    SSL_shutdown(ssl.get());
    if (plain >= 0) close(plain);
    close(client);
  });
  runtime.internal_context()->KeepAlive(relay);
  return bound;
}

absl::StatusOr<std::pair<std::string, uint16_t>> DialVia(Runtime& runtime, const std::string& host,
                                                         uint16_t port, Duration retry_for) {
  const auto until = std::chrono::steady_clock::now() + retry_for;
  const RuntimeOptions& o = runtime.options();
  std::string via_host = host;
  uint16_t via_port = port;
  if (o.tls()) {
    // CAF connects to a local dialer that carries the connection over TLS to host:port.
    TROUPE_ASSIGN_OR_RETURN(auto ctx, MakeContext(o, /*server=*/false));
    uint16_t local = 0;
    int fd = Listen("127.0.0.1", 0, &local);
    if (fd < 0) return absl::UnavailableError("cannot open a local TLS dialer port");
    SslCtx shared = ctx;
    auto relay = std::make_shared<Relay>(fd, [shared, host, port, until](int plain) {
      int remote = Dial(host, port);
      while (remote < 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        remote = Dial(host, port);
      }
      if (remote < 0) {
        close(plain);
        return;
      }
      Ssl ssl(SSL_new(shared.get()), SSL_free);
      SSL_set_fd(ssl.get(), remote);
      SetTimeout(remote, 5000);
      // The peer's certificate must name the address dialed, not only come from the cluster CA.
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
      if (IsIpAddress(host)) {
        X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
      } else {
        X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
      }
      if (SSL_connect(ssl.get()) == 1) {
        SetTimeout(remote, 0);
        Pump(ssl.get(), remote, plain);
        SSL_shutdown(ssl.get());
      } else if (long v = SSL_get_verify_result(ssl.get()); v != X509_V_OK) {
        LogError("tls",
                 absl::StrCat("refused ", host, ":", port, ": ", X509_verify_cert_error_string(v),
                              " (its certificate must name ", host,
                              ": troupe certs --members NAME=", host, ")"));
      }
      close(remote);
      close(plain);
    });
    runtime.internal_context()->KeepAlive(relay);
    via_host = "127.0.0.1";
    via_port = local;
  }
  return std::make_pair(via_host, via_port);
}

absl::StatusOr<caf::actor> Connect(Runtime& runtime, const std::string& host, uint16_t port,
                                   Duration retry_for) {
  auto& sys = runtime.system();
  const auto until = std::chrono::steady_clock::now() + retry_for;
  const RuntimeOptions& o = runtime.options();
  TROUPE_ASSIGN_OR_RETURN(auto via, DialVia(runtime, host, port, retry_for));
  const auto& [via_host, via_port] = via;
  auto h = sys.middleman().remote_actor(via_host, via_port);
  // CAF answers from its cache of connections until it has processed a lost one: the dead actor,
  // whose proxy drops what it is sent without an error (a rejoin once waited out a 10 s deadline
  // that way). Asked again once the loss is processed, which takes milliseconds.
  auto lost = [](const caf::actor& a) {
    return a &&
           caf::actor_cast<caf::abstract_actor*>(a)->getf(caf::abstract_actor::is_terminated_flag);
  };
  for (int i = 0; h && lost(*h) && i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h = sys.middleman().remote_actor(via_host, via_port);
  }
  if (h && lost(*h)) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", host, ":", port, ": its connection was lost"));
  }
  // Nothing listens there yet (a head still starting): try again until `retry_for` has passed.
  while (!h && h.error() == caf::sec::cannot_connect_to_node &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    h = sys.middleman().remote_actor(via_host, via_port);
  }
  if (!h) {
    // A TLS front door cuts a plain peer off during CAF's handshake, and our dialer drops a
    // connection whose TLS handshake failed: both look the same here, so say what to check.
    std::string hint;
    if (h.error() == caf::sec::disconnect_during_handshake) {
      hint = o.tls()
                 ? "; the TLS handshake failed or the peer closed the connection: does the head "
                   "run with mutual TLS and a certificate from the same cluster CA as --tls_ca?"
                 : "; the peer closed the connection during the handshake: if the cluster uses "
                   "mutual TLS, give this process --tls_ca, --tls_cert and --tls_key (or "
                   "TROUPE_TLS_CA, TROUPE_TLS_CERT and TROUPE_TLS_KEY)";
    }
    return absl::UnavailableError(absl::StrCat("cannot reach ", host, ":", port,
                                               o.tls() ? " (mutual TLS)" : "", ": ",
                                               sys.render(h.error()), hint));
  }
  return *h;
}

}  // namespace internal
}  // namespace troupe::runtime
