#include "direct_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

namespace troupe::runtime::direct {
namespace {

void Put32(uint32_t v, char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

void Put64(uint64_t v, char* p) {
  Put32(static_cast<uint32_t>(v), p);
  Put32(static_cast<uint32_t>(v >> 32), p + 4);
}

uint64_t Get64(const char* p) { return uint64_t{Get32(p)} | (uint64_t{Get32(p + 4)} << 32); }

std::string Hex(uint32_t v) {
  char buf[16];
  snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// Milliseconds left until `deadline` for poll(): -1 = forever, 0 = already passed.
int PollTimeout(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
}

}  // namespace

void EncodeHeader(const FrameHeader& h, char* out) {
  Put32(kMagic, out);
  out[4] = static_cast<char>(kVersion);
  out[5] = static_cast<char>(h.kind);
  out[6] = 0;
  out[7] = 0;
  Put32(h.length, out + 8);
  Put32(h.call_id, out + 12);
}

absl::Status DecodeHeader(const char* in, uint32_t max_payload, FrameHeader* out) {
  uint32_t magic = Get32(in);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("direct channel frame: magic is ", Hex(magic), ", expected ", Hex(kMagic)));
  }
  uint8_t version = static_cast<uint8_t>(in[4]);
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("direct channel frame: version is ", version, ", expected ", kVersion));
  }
  uint8_t kind = static_cast<uint8_t>(in[5]);
  if (kind < static_cast<uint8_t>(FrameKind::kHello) ||
      kind > static_cast<uint8_t>(FrameKind::kError)) {
    return absl::InvalidArgumentError(
        absl::StrCat("direct channel frame: kind is ", kind, ", expected 1..5"));
  }
  if (in[6] != 0 || in[7] != 0) {
    return absl::InvalidArgumentError("direct channel frame: reserved bytes are not 0");
  }
  uint32_t length = Get32(in + 8);
  if (length > max_payload) {
    return absl::InvalidArgumentError(absl::StrCat("direct channel frame: length is ", length,
                                                   " bytes, the cap is ", max_payload));
  }
  out->kind = static_cast<FrameKind>(kind);
  out->length = length;
  out->call_id = Get32(in + 12);
  return absl::OkStatus();
}

void AppendHelloFrame(const std::string& actor, uint64_t generation, std::vector<char>* out) {
  const size_t length = actor.size() + (generation != 0 ? 1 + sizeof(uint64_t) : 0);
  size_t at = out->size();
  out->resize(at + kHeaderBytes + length);
  char* p = out->data() + at;
  EncodeHeader({FrameKind::kHello, static_cast<uint32_t>(length), 0}, p);
  std::memcpy(p + kHeaderBytes, actor.data(), actor.size());
  if (generation != 0) {
    p[kHeaderBytes + actor.size()] = '\0';
    Put64(generation, p + kHeaderBytes + actor.size() + 1);
  }
}

absl::Status DecodeHelloPayload(const char* data, size_t size, std::string* actor,
                                uint64_t* generation) {
  const char* nul = static_cast<const char*>(std::memchr(data, '\0', size));
  const size_t name_bytes = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  if (name_bytes == 0 || name_bytes > kMaxActorName) {
    return absl::InvalidArgumentError(
        absl::StrCat("direct channel: a hello frame names an actor in 1..", kMaxActorName,
                     " bytes, got ", name_bytes));
  }
  if (nul != nullptr && size - name_bytes != 1 + sizeof(uint64_t)) {
    return absl::InvalidArgumentError(
        "direct channel: a hello frame's name must be followed by nothing or by a NUL byte and "
        "an 8-byte generation");
  }
  actor->assign(data, name_bytes);
  *generation = nul != nullptr ? Get64(nul + 1) : 0;
  return absl::OkStatus();
}

void AppendErrorFrame(const absl::Status& status, uint32_t call_id, std::vector<char>* out) {
  std::string text(status.message());
  if (text.size() > 4096) text.resize(4096);
  size_t at = out->size();
  out->resize(at + kHeaderBytes + 4 + text.size());
  EncodeHeader({FrameKind::kError, static_cast<uint32_t>(4 + text.size()), call_id},
               out->data() + at);
  Put32(static_cast<uint32_t>(status.code()), out->data() + at + kHeaderBytes);
  if (!text.empty()) memcpy(out->data() + at + kHeaderBytes + 4, text.data(), text.size());
}

absl::Status DecodeErrorPayload(const char* data, size_t size) {
  if (size < 4) {
    return absl::DataLossError(
        absl::StrCat("direct channel error frame: payload is ", size, " bytes, expected >= 4"));
  }
  uint32_t code = Get32(data);
  if (code == 0 || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<uint32_t>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), std::string(data + 4, size - 4));
}

namespace {

// A socket BIO of ours: the same calls as OpenSSL's, but never blocking (MSG_DONTWAIT, so the
// fd's own mode does not matter) and never raising SIGPIPE (MSG_NOSIGNAL).
int BioWrite(BIO* b, const char* data, size_t size, size_t* written) {
  BIO_clear_retry_flags(b);
  int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  ssize_t n = send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) {
    *written = static_cast<size_t>(n);
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_write(b);
  return 0;
}

int BioRead(BIO* b, char* data, size_t size, size_t* read) {
  BIO_clear_retry_flags(b);
  int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  ssize_t n = recv(fd, data, size, MSG_DONTWAIT);
  if (n > 0) {
    *read = static_cast<size_t>(n);
    return 1;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return 0;
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

BIO* NewSocketBio(int fd) {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "troupe-direct");
    BIO_meth_set_write_ex(m, BioWrite);
    BIO_meth_set_read_ex(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  BIO* b = BIO_new(method);
  if (b != nullptr) BIO_set_data(b, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  return b;
}

absl::Status WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, PollTimeout(deadline));
    if (rc > 0) return absl::OkStatus();
    if (rc == 0) return absl::DeadlineExceededError("no progress before the deadline");
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("poll: ", strerror(errno)));
  }
}

// OpenSSL's reason for the last failure on this thread.
std::string SslReason() {
  unsigned long e = ERR_get_error();
  if (e == 0) return strerror(errno);
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

}  // namespace

Stream::~Stream() {
  if (ssl_ != nullptr) SSL_free(ssl_);
}

absl::Status Stream::StartTls(SSL_CTX* ctx, bool server, Deadline deadline,
                              const std::string& peer_host) {
  SSL* ssl = SSL_new(ctx);
  BIO* bio = ssl != nullptr ? NewSocketBio(fd_) : nullptr;
  if (bio == nullptr) {
    if (ssl != nullptr) SSL_free(ssl);
    return absl::InternalError("direct channel: cannot create a TLS session");
  }
  SSL_set_bio(ssl, bio, bio);
  if (!server && !peer_host.empty()) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    in6_addr ip;
    if (inet_pton(AF_INET, peer_host.c_str(), &ip) == 1 ||
        inet_pton(AF_INET6, peer_host.c_str(), &ip) == 1) {
      X509_VERIFY_PARAM_set1_ip_asc(param, peer_host.c_str());
    } else {
      X509_VERIFY_PARAM_set1_host(param, peer_host.c_str(), 0);
    }
  }
  for (;;) {
    ERR_clear_error();
    int rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
    if (rc == 1) break;
    int err = SSL_get_error(ssl, rc);
    absl::Status s;
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      s = WaitFor(fd_, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
      if (s.ok()) continue;
    } else if (err == SSL_ERROR_SSL) {
      long verify = SSL_get_verify_result(ssl);
      s = absl::UnauthenticatedError(absl::StrCat(
          "direct channel: TLS handshake failed: ", SslReason(),
          verify != X509_V_OK ? absl::StrCat(" (", X509_verify_cert_error_string(verify), ")")
                              : ""));
    } else {
      s = absl::UnavailableError("direct channel: the peer left during the TLS handshake");
    }
    SSL_free(ssl);
    return s;
  }
  std::lock_guard<std::mutex> l(ssl_mu_);
  ssl_ = ssl;
  return absl::OkStatus();
}

absl::Status Stream::WriteAll(const char* data, size_t size, Deadline deadline) {
  while (size > 0) {
    short wait = POLLOUT;
    if (ssl_ != nullptr) {
      int err;
      {
        std::lock_guard<std::mutex> l(ssl_mu_);
        ERR_clear_error();
        size_t n = 0;
        if (SSL_write_ex(ssl_, data, size, &n) == 1) {
          data += n;
          size -= n;
          continue;
        }
        err = SSL_get_error(ssl_, 0);
      }
      if (err == SSL_ERROR_WANT_READ) {
        wait = POLLIN;
      } else if (err != SSL_ERROR_WANT_WRITE) {
        return absl::UnavailableError(absl::StrCat("TLS write: ", SslReason()));
      }
    } else {
      ssize_t n = send(fd_, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        data += n;
        size -= static_cast<size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
      }
    }
    absl::Status s = WaitFor(fd_, wait, deadline);
    if (absl::IsDeadlineExceeded(s)) return absl::UnavailableError("send: the peer is not reading");
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Stream::ReadSome(char* data, size_t size, Deadline deadline, size_t* got) {
  if (ssl_ == nullptr) {
    for (;;) {
      if (deadline != Deadline::max()) {
        TROUPE_RETURN_IF_ERROR(WaitFor(fd_, POLLIN, deadline));
      }
      ssize_t n = recv(fd_, data, size, 0);
      if (n > 0) {
        *got = static_cast<size_t>(n);
        return absl::OkStatus();
      }
      if (n == 0) return absl::UnavailableError("connection closed by the peer");
      if (errno != EINTR && errno != EAGAIN) {
        return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
      }
    }
  }
  // Wait first unless OpenSSL holds bytes already: a read that would only find the socket empty
  // costs a syscall for nothing (so a record costs one poll and one recv, as on the plain path
  // with a deadline).
  short want = POLLIN;
  for (;;) {
    if (want == POLLIN) {
      std::lock_guard<std::mutex> l(ssl_mu_);
      if (SSL_has_pending(ssl_) == 1) want = 0;
    }
    if (want != 0) {
      TROUPE_RETURN_IF_ERROR(WaitFor(fd_, want, deadline));
    }
    int err;
    {
      std::lock_guard<std::mutex> l(ssl_mu_);
      ERR_clear_error();
      if (SSL_read_ex(ssl_, data, size, got) == 1) return absl::OkStatus();
      err = SSL_get_error(ssl_, 0);
    }
    if (err == SSL_ERROR_ZERO_RETURN)
      return absl::UnavailableError("connection closed by the peer");
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      return absl::UnavailableError(absl::StrCat("TLS read: ", SslReason()));
    }
    want = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
  }
}

absl::Status ReadFull(Stream& stream, char* data, size_t size, Deadline deadline) {
  while (size > 0) {
    size_t n = 0;
    TROUPE_RETURN_IF_ERROR(stream.ReadSome(data, size, deadline, &n));
    data += n;
    size -= n;
  }
  return absl::OkStatus();
}

absl::Status ReadFrame(Stream& stream, uint32_t max_payload, Deadline deadline, FrameHeader* h,
                       std::vector<char>* payload) {
  char header[kHeaderBytes];
  TROUPE_RETURN_IF_ERROR(ReadFull(stream, header, kHeaderBytes, deadline));
  TROUPE_RETURN_IF_ERROR(DecodeHeader(header, max_payload, h));
  payload->resize(h->length);
  return ReadFull(stream, payload->data(), h->length, deadline);
}

absl::Status FrameReader::Fill(size_t need, Deadline deadline) {
  if (end_ - start_ >= need) return absl::OkStatus();
  if (buf_.size() - start_ < need) {  // make room: move the unread bytes to the front
    if (end_ > start_) std::memmove(buf_.data(), buf_.data() + start_, end_ - start_);
    end_ -= start_;
    start_ = 0;
    if (buf_.size() < need) buf_.resize(std::max<size_t>(need, 64 * 1024));
  }
  while (end_ - start_ < need) {
    size_t n = 0;
    TROUPE_RETURN_IF_ERROR(stream_->ReadSome(buf_.data() + end_, buf_.size() - end_, deadline, &n));
    end_ += n;
  }
  return absl::OkStatus();
}

absl::Status FrameReader::Next(Deadline deadline, FrameHeader* h, const char** payload) {
  TROUPE_RETURN_IF_ERROR(Fill(kHeaderBytes, deadline));
  TROUPE_RETURN_IF_ERROR(DecodeHeader(buf_.data() + start_, max_payload_, h));
  TROUPE_RETURN_IF_ERROR(Fill(kHeaderBytes + h->length, deadline));
  *payload = buf_.data() + start_ + kHeaderBytes;
  start_ += kHeaderBytes + h->length;
  if (start_ == end_) start_ = end_ = 0;
  return absl::OkStatus();
}

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

absl::Status Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                     int* fd_out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("direct channel: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = poll(&p, 1, static_cast<int>(timeout.count()));
      int err = ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (rc > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      TuneSocket(fd);
      freeaddrinfo(res);
      *fd_out = fd;
      return absl::OkStatus();
    }
    last = absl::UnavailableError(
        absl::StrCat("direct channel: cannot connect to ", host, ":", port, ": ", strerror(errno)));
    close(fd);
  }
  freeaddrinfo(res);
  return last;
}

}  // namespace troupe::runtime::direct
