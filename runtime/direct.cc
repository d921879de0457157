// The direct channel: DirectServer and DirectClient (see troupe/runtime/direct.h).
#include "troupe/runtime/direct.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <list>
#include <thread>

#include "absl/strings/str_cat.h"
#include "caf/actor_companion.hpp"
#include "caf/all.hpp"
#include "direct_wire.h"
#include "internal/direct_pool.h"
#include "internal/tls.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/runtime.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {

using direct::Deadline;
using direct::FrameHeader;
using direct::FrameKind;
using direct::kHeaderBytes;

namespace {

// Messages an inline resume may handle before the actor goes back to the scheduler.
constexpr size_t kInlineThroughput = 32;
// Requests carry a CAF request id with this bit set, so a client call id of 0 is still a request.
constexpr uint64_t kRequestTag = uint64_t{1} << 32;

// The execution unit of one connection thread. While `capture` is set (only around the thread's
// own enqueue of a request), an idle target actor that the enqueue wakes is handed back to the
// connection thread instead of a scheduler worker; everything else goes to the scheduler.
class InlineUnit final : public caf::execution_unit {
 public:
  void Bind(caf::actor_system* sys) { system_ = sys; }
  void exec_later(caf::resumable* job) override {
    if (capture && captured == nullptr) {
      captured = job;
      return;
    }
    system().scheduler().enqueue(job);
  }
  bool capture = false;
  caf::resumable* captured = nullptr;
};

// An actor keeps a pointer to the unit it last ran on until its next activation (CAF's own
// workers live as long as the scheduler), so units are recycled, never freed: at most as many
// exist as connections were ever open at once.
std::mutex unit_pool_mu;
std::vector<InlineUnit*>* unit_pool = new std::vector<InlineUnit*>;

InlineUnit* AcquireUnit(caf::actor_system* sys) {
  InlineUnit* unit = nullptr;
  {
    std::lock_guard<std::mutex> l(unit_pool_mu);
    if (!unit_pool->empty()) {
      unit = unit_pool->back();
      unit_pool->pop_back();
    }
  }
  if (unit == nullptr) unit = new InlineUnit;
  unit->Bind(sys);
  return unit;
}

void ReleaseUnit(InlineUnit* unit) {
  std::lock_guard<std::mutex> l(unit_pool_mu);
  unit_pool->push_back(unit);
}

// The connection's socket, shared with the reply sink (which may write from any thread).
struct Wire {
  explicit Wire(int socket) : fd(socket), stream(socket) {}
  std::mutex mu;
  int fd = -1;
  direct::Stream stream;
  std::atomic<bool> broken{false};
  // A reply that cannot be written within this long (the client stopped reading) cuts the
  // connection, so no thread, CAF workers included, waits on a client for longer.
  static constexpr std::chrono::seconds kWriteTimeout{2};
  absl::Status Write(const char* data, size_t size) {
    std::lock_guard<std::mutex> l(mu);
    if (fd < 0 || broken.load()) return absl::UnavailableError("connection closed");
    absl::Status s = stream.WriteAll(data, size, std::chrono::steady_clock::now() + kWriteTimeout);
    if (!s.ok()) {
      broken.store(true);
      shutdown(fd, SHUT_RDWR);  // also wakes the connection thread if it is reading
    }
    return s;
  }
};

std::vector<char> ErrorFrame(const absl::Status& s, uint32_t call_id) {
  std::vector<char> out;
  direct::AppendErrorFrame(s, call_id, &out);
  return out;
}

}  // namespace

// ---- server ------------------------------------------------------------------------------

class DirectServer::Impl {
 public:
  struct Hello {
    std::string name;
    uint64_t generation = 0;  // 0: whichever incarnation holds the name
  };
  Impl(Runtime& rt, DirectServerOptions o) : rt_(rt), sys_(rt.system()), options_(std::move(o)) {}
  ~Impl();
  absl::Status Listen();
  uint16_t port() const { return port_; }
  std::string DebugString() const {
    return absl::StrCat(
        "DirectServer{port=", port_, " tls=", tls_ ? "on" : "off", " accepted=", accepted_.load(),
        " protocol_errors=", protocol_errors_.load(), " tls_refused=", tls_refused_.load(), "}");
  }

 private:
  struct Connection {
    explicit Connection(int fd) : wire(std::make_shared<Wire>(fd)) {}
    std::shared_ptr<Wire> wire;
    std::thread thread;
    std::atomic<bool> finished{false};
  };

  void AcceptLoop();
  // The connection thread: handshake, then calls until the peer leaves or breaks the protocol.
  void Serve(Connection* c);
  caf::actor MakeReplySink(std::shared_ptr<Wire> wire, std::string actor);
  void ServeCalls(Wire& wire, const Hello& hello, const caf::strong_actor_ptr& sink,
                  InlineUnit* unit);
  absl::StatusOr<caf::message> DecodeMessage(const char* data, size_t size,
                                             const std::string& name);
  // TLS first when the runtime has it; then reads and checks the hello frame: the actor the
  // connection is bound to, or an error to send.
  absl::StatusOr<Hello> Handshake(Wire& wire);
  // The incarnation a connection is bound to: NotFound once the name is gone or another
  // generation holds it.
  absl::StatusOr<ActorRef> Resolve(const Hello& hello);
  void Dispatch(const caf::actor& target, caf::message msg, uint32_t call_id,
                const caf::strong_actor_ptr& sink, InlineUnit* unit);
  void ProtocolError(Wire& wire, const absl::Status& s);

  Runtime& rt_;
  caf::actor_system& sys_;
  DirectServerOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> conns_;
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> protocol_errors_{0};
  std::atomic<uint64_t> tls_refused_{0};
  std::shared_ptr<SSL_CTX> tls_;  // set when the runtime has the cluster's TLS files
};

absl::Status DirectServer::Impl::Listen() {
  if (rt_.options().tls()) {
    TROUPE_ASSIGN_OR_RETURN(auto ctx, internal::DirectTlsContext(rt_.options(), /*server=*/true));
    tls_ = ctx;
  }
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options_.port);
  if (inet_pton(AF_INET, options_.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DirectServerOptions.host: expected an IPv4 address, got '", options_.host, "'"));
  }
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 64) != 0) {
    return absl::UnavailableError(absl::StrCat("direct server: cannot listen on ", options_.host,
                                               ":", options_.port, ": ", strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

DirectServer::Impl::~Impl() {
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> conns;
  {
    std::lock_guard<std::mutex> l(mu_);
    conns.swap(conns_);
  }
  for (auto& c : conns) {
    {
      std::lock_guard<std::mutex> l(c->wire->mu);
      if (c->wire->fd >= 0) shutdown(c->wire->fd, SHUT_RDWR);  // wakes the blocked reader
    }
    c->thread.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DirectServer::Impl::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // no busy loop when out of fds
      }
      continue;
    }
    direct::TuneSocket(fd);
    // Replies are small; a fixed send buffer also bounds what a client that never reads can pin
    // here before the send timeout cuts it off.
    int sndbuf = 256 * 1024;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    accepted_.fetch_add(1);
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {  // reap finished connections
      if ((*it)->finished.load()) {
        (*it)->thread.join();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    auto c = std::make_unique<Connection>(fd);
    Connection* raw = c.get();
    c->thread = std::thread([this, raw] { Serve(raw); });
    conns_.push_back(std::move(c));
  }
}

void DirectServer::Impl::ProtocolError(Wire& wire, const absl::Status& s) {
  protocol_errors_.fetch_add(1);
  auto frame = ErrorFrame(s, 0);
  (void)wire.Write(frame.data(), frame.size());
}

absl::StatusOr<DirectServer::Impl::Hello> DirectServer::Impl::Handshake(Wire& wire) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  if (tls_) {
    if (absl::Status s = wire.stream.StartTls(tls_.get(), /*server=*/true, deadline); !s.ok()) {
      tls_refused_.fetch_add(1);
      return s;
    }
  }
  FrameHeader h;
  std::vector<char> payload;
  TROUPE_RETURN_IF_ERROR(
      direct::ReadFrame(wire.stream, options_.max_frame_bytes, deadline, &h, &payload));
  if (h.kind != FrameKind::kHello || h.length == 0 || h.length > direct::kMaxHelloBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "direct channel: expected a hello frame (kind 1) of 1..", direct::kMaxHelloBytes,
        " bytes, got kind ", static_cast<int>(h.kind), " with ", h.length, " bytes"));
  }
  Hello hello;
  TROUPE_RETURN_IF_ERROR(
      direct::DecodeHelloPayload(payload.data(), payload.size(), &hello.name, &hello.generation));
  return hello;
}

absl::StatusOr<ActorRef> DirectServer::Impl::Resolve(const Hello& hello) {
  auto ref = rt_.Lookup(hello.name);
  if (ref.ok() && hello.generation != 0 && ref->generation != hello.generation) {
    return internal::GenerationGone(hello.name, hello.generation, ref->generation);
  }
  return ref;
}

void DirectServer::Impl::Serve(Connection* c) {
  Wire& wire = *c->wire;
  auto hello = Handshake(wire);
  absl::StatusOr<ActorRef> ref = hello.ok() ? Resolve(*hello) : hello.status();
  if (!hello.ok()) {
    if (absl::IsInvalidArgument(hello.status())) ProtocolError(wire, hello.status());
  } else if (!ref.ok()) {
    auto frame = ErrorFrame(ref.status(), 0);
    (void)wire.Write(frame.data(), frame.size());
  } else {
    char ok[kHeaderBytes];
    direct::EncodeHeader({FrameKind::kHelloOk, 0, 0}, ok);
    (void)wire.Write(ok, sizeof(ok));
    caf::actor sink = MakeReplySink(c->wire, hello->name);
    InlineUnit* unit = AcquireUnit(&sys_);
    ServeCalls(wire, *hello, caf::actor_cast<caf::strong_actor_ptr>(sink), unit);
    ReleaseUnit(unit);
    // The companion cleans itself up when its last handle goes.
    caf::actor_cast<caf::actor_companion*>(sink)->on_enqueue(nullptr);
  }
  {
    std::lock_guard<std::mutex> l(wire.mu);
    close(wire.fd);
    wire.fd = -1;
  }
  c->finished.store(true);
}

caf::actor DirectServer::Impl::MakeReplySink(std::shared_ptr<Wire> wire, std::string actor) {
  // Replies come back to this companion, which writes them to the socket on whatever thread the
  // actor answered (the connection's own when the actor ran inline).
  auto handle = sys_.spawn<caf::actor_companion, caf::hidden>();
  caf::actor_system* sys = &sys_;
  auto write_reply = [wire, actor, sys](caf::mailbox_element_ptr ptr) {
    if (!ptr->mid.is_response()) return;
    uint32_t call_id = static_cast<uint32_t>(ptr->mid.request_id().integer_value());
    caf::message reply = ptr->move_content_to_message();
    std::vector<char> out(kHeaderBytes);
    if (reply.match_elements<caf::error>()) {
      out = ErrorFrame(internal::ActorErrorToStatus(reply.get_as<caf::error>(0), actor), call_id);
    } else if (caf::binary_serializer ser{*sys, out}; auto err = ser(reply)) {
      out = ErrorFrame(absl::InternalError(absl::StrCat("cannot serialize the reply of '", actor,
                                                        "': ", sys->render(err))),
                       call_id);
    } else {
      direct::EncodeHeader(
          {FrameKind::kReply, static_cast<uint32_t>(out.size() - kHeaderBytes), call_id},
          out.data());
    }
    (void)wire->Write(out.data(), out.size());
  };
  caf::actor_cast<caf::actor_companion*>(handle)->on_enqueue(std::move(write_reply));
  return handle;
}

void DirectServer::Impl::ServeCalls(Wire& wire, const Hello& hello,
                                    const caf::strong_actor_ptr& sink, InlineUnit* unit) {
  direct::FrameReader reader(&wire.stream, options_.max_frame_bytes);
  FrameHeader h;
  const char* payload = nullptr;
  while (!wire.broken.load()) {
    absl::Status s = reader.Next(Deadline::max(), &h, &payload);
    if (s.ok() && h.kind != FrameKind::kCall) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "direct channel: expected a call frame (kind 3), got kind ", static_cast<int>(h.kind)));
    }
    if (!s.ok()) {
      if (absl::IsInvalidArgument(s)) ProtocolError(wire, s);
      return;
    }
    // A bad payload or a vanished actor fails this call only: the stream is still in step.
    auto msg = DecodeMessage(payload, h.length, hello.name);
    auto target = msg.ok() ? Resolve(hello) : msg.status();
    if (!target.ok()) {
      auto frame = ErrorFrame(target.status(), h.call_id);
      (void)wire.Write(frame.data(), frame.size());
      continue;
    }
    Dispatch(target->handle, std::move(*msg), h.call_id, sink, unit);
  }
}

absl::StatusOr<caf::message> DirectServer::Impl::DecodeMessage(const char* data, size_t size,
                                                               const std::string& name) {
  caf::message msg;
  caf::error err;
  try {
    caf::binary_deserializer source{sys_, data, size};
    err = source(msg);
    if (!err && source.remaining() != 0) err = caf::make_error(caf::sec::invalid_argument);
  } catch (...) {
    err = caf::make_error(caf::sec::invalid_argument);
  }
  if (err) {
    return absl::InvalidArgumentError(absl::StrCat("direct channel: cannot decode the request to '",
                                                   name, "': ", sys_.render(err)));
  }
  return msg;
}

void DirectServer::Impl::Dispatch(const caf::actor& target, caf::message msg, uint32_t call_id,
                                  const caf::strong_actor_ptr& sink, InlineUnit* unit) {
  auto* dest = caf::actor_cast<caf::abstract_actor*>(target);
  auto element = caf::make_mailbox_element(sink, caf::make_message_id(kRequestTag | call_id), {},
                                           std::move(msg));
  if (!options_.run_inline) {
    dest->enqueue(std::move(element), nullptr);
    return;
  }
  unit->capture = true;
  dest->enqueue(std::move(element), unit);
  unit->capture = false;
  caf::resumable* job = std::exchange(unit->captured, nullptr);
  if (job == nullptr) return;  // the actor is busy elsewhere: it answers from there
  // Same bookkeeping as a CAF scheduler worker: enqueue() took a reference for us.
  switch (job->resume(unit, kInlineThroughput)) {
    case caf::resumable::resume_later:
      sys_.scheduler().enqueue(job);  // more mail than we take inline: keeps the reference
      break;
    default:
      caf::intrusive_ptr_release(job);
      break;
  }
}

DirectServer::DirectServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DirectServer::~DirectServer() = default;
uint16_t DirectServer::port() const { return impl_->port(); }
std::string DirectServer::DebugString() const { return impl_->DebugString(); }

absl::StatusOr<std::unique_ptr<DirectServer>> DirectServer::Start(Runtime& runtime,
                                                                  DirectServerOptions options) {
  if (options.max_frame_bytes < 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DirectServerOptions.max_frame_bytes: expected >= 64, got ", options.max_frame_bytes));
  }
  auto impl = std::make_unique<Impl>(runtime, std::move(options));
  TROUPE_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<DirectServer>(new DirectServer(std::move(impl)));
}

}  // namespace troupe::runtime
