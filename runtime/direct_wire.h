// direct_wire.h — the framing of troupe's direct channel (private to runtime/).
//
// Every frame is a fixed 16-byte little-endian header followed by `length` payload bytes:
//
//   offset  size  field
//   0       4     magic    0x43445254 ("TRDC" on the wire)
//   4       1     version  1
//   5       1     kind     FrameKind
//   6       2     reserved 0
//   8       4     length   payload bytes, at most the receiver's cap
//   12      4     call id  echoed in the reply (0 for hello frames)
//
// Payloads: kHello = the target actor's name, optionally followed by a NUL byte and the 8-byte
// little-endian generation it must have (absent or 0: whichever incarnation holds the name);
// kHelloOk = empty; kCall / kReply = a caf::message in CAF's binary format; kError = 4-byte
// absl::StatusCode + the message text. A header that fails validation is a protocol error: the
// receiver sends one kError frame saying why and closes the connection. No CAF here, so this part
// is testable on its own.
//
//   char buf[kHeaderBytes];
//   EncodeHeader({FrameKind::kCall, payload_size, call_id}, buf);
//   FrameHeader h;
//   absl::Status s = DecodeHeader(buf, kDefaultMaxPayload, &h);   // InvalidArgument if garbage
#ifndef TROUPE_RUNTIME_DIRECT_WIRE_H_
#define TROUPE_RUNTIME_DIRECT_WIRE_H_

#include <openssl/ssl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace troupe::runtime::direct {

constexpr uint32_t kMagic = 0x43445254;
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 16;
constexpr uint32_t kDefaultMaxPayload = 1u << 20;  // 1 MiB: hot-path calls are small
constexpr size_t kMaxActorName = 256;

enum class FrameKind : uint8_t {
  kHello = 1,    // client → server: bind this connection to the named actor
  kHelloOk = 2,  // server → client: bound
  kCall = 3,     // client → server: a request
  kReply = 4,    // server → client: the actor's response
  kError = 5,    // either way: the call (or, for protocol errors, the connection) failed
};

struct FrameHeader {
  FrameKind kind = FrameKind::kCall;
  uint32_t length = 0;
  uint32_t call_id = 0;
};

// Writes the 16-byte header for `h` into `out`.
void EncodeHeader(const FrameHeader& h, char* out);
// Validates and decodes a header; InvalidArgument naming the field, what was expected and what
// arrived (bad magic, version, kind, reserved bits, or a length above `max_payload`).
[[nodiscard]] absl::Status DecodeHeader(const char* in, uint32_t max_payload, FrameHeader* out);

// Appends a complete kHello frame binding a connection to `actor` (1..kMaxActorName bytes, no
// NUL) and, when `generation` is not 0, to that incarnation only.
void AppendHelloFrame(const std::string& actor, uint64_t generation, std::vector<char>* out);
// Decodes a kHello payload; InvalidArgument saying what is wrong (empty or oversized name, a
// generation that is not 8 bytes).
[[nodiscard]] absl::Status DecodeHelloPayload(const char* data, size_t size, std::string* actor,
                                              uint64_t* generation);
// The largest kHello payload: a name, a NUL and a generation.
constexpr size_t kMaxHelloBytes = kMaxActorName + 1 + sizeof(uint64_t);

// Appends a complete kError frame carrying `status` to `out`.
void AppendErrorFrame(const absl::Status& status, uint32_t call_id, std::vector<char>* out);
// Decodes a kError payload back into a status (DataLoss if it is too short).
[[nodiscard]] absl::Status DecodeErrorPayload(const char* data, size_t size);

using Deadline = std::chrono::steady_clock::time_point;

// One connection's byte stream: a connected TCP socket, with TLS over it once StartTls succeeded.
// A read and a write may run on two threads at once (the server's connection thread reads while
// a CAF worker writes a reply); TLS calls are serialized inside. Every call returns Unavailable on
// a closed or reset connection and DeadlineExceeded when `deadline` passes first
// (Deadline::max() = no deadline). The fd stays the owner's to close; the TLS session is freed
// with the Stream. A write never raises SIGPIPE.
class Stream {
 public:
  explicit Stream(int fd) : fd_(fd) {}
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // Mutual TLS as server or client with `ctx` (whose settings verify the peer; a client also
  // requires the server's certificate to name `peer_host`, the address it dialed):
  // Unauthenticated naming OpenSSL's reason when the handshake fails (no or a foreign
  // certificate, garbage), Unavailable when the peer leaves, DeadlineExceeded when it stalls.
  [[nodiscard]] absl::Status StartTls(SSL_CTX* ctx, bool server, Deadline deadline,
                                      const std::string& peer_host = "");
  // Writes all `size` bytes; a peer that does not take them by `deadline` (it stopped reading)
  // fails it with Unavailable.
  [[nodiscard]] absl::Status WriteAll(const char* data, size_t size,
                                      Deadline deadline = Deadline::max());
  // Reads at least one byte and at most `size` into `data`.
  [[nodiscard]] absl::Status ReadSome(char* data, size_t size, Deadline deadline, size_t* got);

 private:
  int fd_;
  SSL* ssl_ = nullptr;
  std::mutex ssl_mu_;  // one OpenSSL call at a time on ssl_
};

// Reads exactly `size` bytes.
[[nodiscard]] absl::Status ReadFull(Stream& s, char* data, size_t size, Deadline deadline);
// Reads one frame: header into `h`, payload into `payload`; protocol errors are InvalidArgument.
[[nodiscard]] absl::Status ReadFrame(Stream& s, uint32_t max_payload, Deadline deadline,
                                     FrameHeader* h, std::vector<char>* payload);

// Reads frames from one stream through a buffer, so a small frame costs one recv() (plus one
// poll() when there is a deadline or TLS). Not thread-safe; one per connection and direction.
class FrameReader {
 public:
  FrameReader(Stream* stream, uint32_t max_payload) : stream_(stream), max_payload_(max_payload) {}
  // The next frame; `*payload` points into the buffer and stays valid until the next call.
  [[nodiscard]] absl::Status Next(Deadline deadline, FrameHeader* h, const char** payload);

 private:
  [[nodiscard]] absl::Status Fill(size_t need,
                                  Deadline deadline);  // until `need` unread bytes are buffered
  Stream* stream_;
  uint32_t max_payload_;
  std::vector<char> buf_;
  size_t start_ = 0, end_ = 0;  // unread bytes are buf_[start_, end_)
};

// TCP_NODELAY and close-on-exec on a connected socket.
void TuneSocket(int fd);
// A connected TCP socket to host:port within `timeout` (Unavailable if refused or too slow).
[[nodiscard]] absl::Status Connect(const std::string& host, uint16_t port,
                                   std::chrono::milliseconds timeout, int* fd_out);

}  // namespace troupe::runtime::direct

#endif  // TROUPE_RUNTIME_DIRECT_WIRE_H_
