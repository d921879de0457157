// DirectClient: the calling side of the direct channel (see troupe/runtime/direct.h). The
// caller's own thread writes the request and blocks on the socket for the reply.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "direct_wire.h"
#include "internal/tls.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/direct.h"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime {

using direct::FrameHeader;
using direct::FrameKind;
using direct::kHeaderBytes;

namespace {

std::chrono::milliseconds Millis(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

}  // namespace

DirectClient::DirectClient(Runtime& runtime, std::string host, uint16_t port, std::string actor,
                           DirectClientOptions options)
    : runtime_(&runtime),
      host_(std::move(host)),
      port_(port),
      actor_(std::move(actor)),
      options_(options) {}

DirectClient::~DirectClient() { Drop(); }

absl::StatusOr<std::unique_ptr<DirectClient>> DirectClient::Connect(Runtime& runtime,
                                                                    const std::string& host,
                                                                    uint16_t port,
                                                                    const std::string& actor,
                                                                    DirectClientOptions options) {
  if (actor.empty() || actor.size() > direct::kMaxActorName) {
    return absl::InvalidArgumentError(absl::StrCat("DirectClient: actor name must have 1..",
                                                   direct::kMaxActorName, " bytes, got ",
                                                   actor.size()));
  }
  if (actor.find('\0') != std::string::npos) {  // the hello frame ends the name at a NUL
    return absl::InvalidArgumentError("DirectClient: actor name must not contain a NUL byte");
  }
  std::unique_ptr<DirectClient> c(new DirectClient(runtime, host, port, actor, options));
  std::lock_guard<std::mutex> l(c->mu_);
  TROUPE_RETURN_IF_ERROR(c->EnsureConnected());
  return c;
}

void DirectClient::Drop() {
  reader_.reset();
  stream_.reset();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status DirectClient::EnsureConnected() {
  if (fd_ >= 0) return absl::OkStatus();
  int fd = -1;
  TROUPE_RETURN_IF_ERROR(direct::Connect(host_, port_, Millis(options_.connect_timeout), &fd));
  std::vector<char> hello;
  direct::AppendHelloFrame(actor_, options_.generation, &hello);
  FrameHeader h;
  std::vector<char> payload;
  auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  auto stream = std::make_unique<direct::Stream>(fd);
  absl::Status s;
  if (runtime_->options().tls()) {
    auto ctx = internal::DirectTlsContext(runtime_->options(), /*server=*/false);
    s = ctx.ok() ? stream->StartTls(ctx->get(), /*server=*/false, deadline, host_) : ctx.status();
    if (absl::IsUnavailable(s)) {
      s = absl::UnauthenticatedError(absl::StrCat(
          "direct channel to ", host_, ":", port_, ": the server ended the TLS handshake (",
          s.message(), "): is it a member of this cluster, with TLS?"));
    }
  }
  if (s.ok()) s = stream->WriteAll(hello.data(), hello.size(), deadline);
  if (s.ok()) s = direct::ReadFrame(*stream, options_.max_frame_bytes, deadline, &h, &payload);
  if (s.ok() && h.kind == FrameKind::kError)
    s = direct::DecodeErrorPayload(payload.data(), payload.size());
  if (s.ok() && h.kind != FrameKind::kHelloOk) {
    s = absl::DataLossError(absl::StrCat("direct channel: expected hello-ok (kind 2), got kind ",
                                         static_cast<int>(h.kind)));
  }
  if (!s.ok()) {
    stream.reset();
    close(fd);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::UnavailableError(absl::StrCat("direct channel to ", host_, ":", port_,
                                                 ": no hello reply within ",
                                                 Millis(options_.connect_timeout).count(), " ms"));
    }
    return s;
  }
  if (calls_ > 0) ++reconnects_;
  fd_ = fd;
  stream_ = std::move(stream);
  reader_ = std::make_unique<direct::FrameReader>(stream_.get(), options_.max_frame_bytes);
  return absl::OkStatus();
}

absl::StatusOr<caf::message> DirectClient::Call(const caf::message& request) {
  return Call(request, options_.call_timeout);
}

absl::StatusOr<caf::message> DirectClient::Call(const caf::message& request, Duration timeout) {
  std::lock_guard<std::mutex> l(mu_);
  TROUPE_RETURN_IF_ERROR(EnsureConnected());
  ++calls_;
  uint32_t id = next_call_id_++;
  auto& sys = runtime_->system();
  out_.resize(kHeaderBytes);
  caf::message copy = request;
  if (caf::binary_serializer ser{sys, out_}; auto err = ser(copy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DirectClient: cannot serialize the request: ", sys.render(err)));
  }
  size_t length = out_.size() - kHeaderBytes;
  if (length > options_.max_frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DirectClient: request is ", length, " bytes, the cap is ", options_.max_frame_bytes));
  }
  direct::EncodeHeader({FrameKind::kCall, static_cast<uint32_t>(length), id}, out_.data());
  auto where = [&] { return absl::StrCat("direct call to '", actor_, "' at ", host_, ":", port_); };
  auto deadline = std::chrono::steady_clock::now() + timeout;
  absl::Status s = stream_->WriteAll(out_.data(), out_.size(), deadline);
  FrameHeader h;
  const char* payload = nullptr;
  if (s.ok()) s = reader_->Next(deadline, &h, &payload);
  if (s.ok() && h.kind == FrameKind::kError && h.call_id == 0) {
    Drop();  // the server closed the connection for a protocol error; it says why
    return direct::DecodeErrorPayload(payload, h.length);
  }
  if (s.ok() && h.call_id != id) {
    s = absl::DataLossError(absl::StrCat("reply carries call id ", h.call_id, ", expected ", id));
  }
  if (!s.ok()) {
    Drop();  // the stream is out of step now; the next call reconnects
    if (absl::IsDeadlineExceeded(s)) {
      return absl::UnavailableError(absl::StrCat(
          where(), ": no reply within ", Millis(timeout).count(), " ms (peer hung or dead)"));
    }
    if (absl::IsInvalidArgument(s))
      return absl::DataLossError(absl::StrCat(where(), ": ", s.message()));
    return absl::Status(s.code(), absl::StrCat(where(), ": ", s.message(), " (peer dead?)"));
  }
  if (h.kind == FrameKind::kError) {
    return direct::DecodeErrorPayload(payload, h.length);
  }
  if (h.kind != FrameKind::kReply) {
    Drop();
    return absl::DataLossError(absl::StrCat(where(), ": expected a reply frame (kind 4), got kind ",
                                            static_cast<int>(h.kind)));
  }
  caf::message reply;
  caf::error err;
  try {
    caf::binary_deserializer source{sys, payload, h.length};
    err = source(reply);
  } catch (...) {
    err = caf::make_error(caf::sec::invalid_argument);
  }
  if (err) {
    return absl::DataLossError(
        absl::StrCat(where(), ": cannot decode the reply: ", sys.render(err)));
  }
  return reply;
}

std::string DirectClient::DebugString() const {
  return absl::StrCat("DirectClient{", actor_, "@", host_, ":", port_,
                      " connected=", fd_ >= 0 ? "yes" : "no", " calls=", calls_,
                      " reconnects=", reconnects_, "}");
}

}  // namespace troupe::runtime
