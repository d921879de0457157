// troupe/runtime/direct.h — a direct channel for hot request/response calls to a named actor.
//
// CAF's middleman routes every remote request through several threads (the caller, the
// middleman's multiplexer, a BASP worker, a scheduler worker, the multiplexer again, and back),
// which costs ~15× a plain TCP round trip on loopback. A direct channel is one TCP_NODELAY
// socket per (caller, target actor):
//   - the caller's own thread writes a small framed request and blocks reading the reply (no
//     other thread involved on the calling side);
//   - the serving process reads the request on the connection's thread and, when the target
//     actor is idle, runs the actor's mailbox right there (as a CAF execution unit), so the
//     reply is written to the socket with no thread hand-off at all. A busy actor gets the
//     request in its mailbox as usual and the reply is written by whichever thread runs it.
// The actor sees an ordinary CAF request: whatever its behavior returns is the reply, and
// messages through this channel still count as progress, honour fault injection, etc.
//
// Frames are bounded and validated (see direct_wire.h): a bad header, an oversized length or a
// malformed payload closes the connection with an error saying why, never a crash. A call has a
// deadline; a dead or silent peer fails it with Unavailable (the next Call reconnects).
// Messages must hold only serializable values (no actor handles); their types must be
// registered with the same names on both sides, as for CAF's middleman.
// A runtime with the cluster's TLS files (RuntimeOptions::tls) serves and calls over mutual TLS
// 1.3: each side presents its certificate and verifies the other's against the cluster CA before
// the first frame; a peer without one is cut off after the failed handshake. Without them the
// channel is plain TCP, for loopback or a trusted network only, as the rest of a plain cluster.
//
// Inside a cluster every worker serves its actors this way, and Runtime::Call uses it for an
// ActorRef of another process (ActorRef::direct); this API is for a process of one's own.
//
//   // Serving process: its named actors become reachable on a port.
//   auto server = troupe::runtime::DirectServer::Start(*runtime);          // port 0: ephemeral
//   std::cout << (*server)->port();
//
//   // Calling process:
//   auto client = troupe::runtime::DirectClient::Connect(*runtime, "127.0.0.1", port, "echo-1");
//   absl::StatusOr<caf::message> reply =
//       (*client)->Call(caf::make_message(echo_atom::value, int64_t{42}));
//   if (reply.ok() && reply->match_elements<int64_t>()) use(reply->get_as<int64_t>(0));
#ifndef TROUPE_RUNTIME_DIRECT_H_
#define TROUPE_RUNTIME_DIRECT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "caf/message.hpp"
#include "troupe/runtime/config.h"

namespace troupe::runtime {

class Runtime;
namespace direct {
class FrameReader;
class Stream;
}  // namespace direct

struct DirectServerOptions {
  std::string host = "127.0.0.1";       // address to listen on
  uint16_t port = 0;                    // 0: ephemeral (see DirectServer::port())
  uint32_t max_frame_bytes = 1u << 20;  // larger frames close the connection
  // Run an idle target actor on the connection's thread (fewest wake-ups). Off: always hand the
  // request to the CAF scheduler, as any other message.
  bool run_inline = true;
};

// Serves every named actor of `runtime` (its Runtime::Lookup directory) on one port. One thread
// per connection; the name is resolved on every call, so a restarted actor is found again. A
// reply that cannot be written within 2 s (the client stopped reading) closes the connection.
// Destroy it before the Runtime; destruction closes every connection and waits for a handler
// that is running on a connection thread to return.
class DirectServer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DirectServer>> Start(
      Runtime& runtime, DirectServerOptions options = {});
  ~DirectServer();  // closes the listener and every connection, joins their threads
  DirectServer(const DirectServer&) = delete;
  DirectServer& operator=(const DirectServer&) = delete;

  uint16_t port() const;
  // Connections accepted so far and connections closed for a protocol error.
  std::string DebugString() const;

  class Impl;

 private:
  explicit DirectServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct DirectClientOptions {
  Duration call_timeout = std::chrono::seconds(5);     // default deadline of Call()
  Duration connect_timeout = std::chrono::seconds(2);  // connect + hello
  uint32_t max_frame_bytes = 1u << 20;
  // The incarnation to call: a call reaching another one (the actor restarted) fails with
  // NotFound instead of reaching it. 0: whichever incarnation holds the name.
  uint64_t generation = 0;
};

// A channel to one named actor of a DirectServer. Call() is synchronous and thread-safe (calls
// from several threads are serialized on the one socket).
class DirectClient {
 public:
  // Connects and binds to `actor`: NotFound if the server has no actor of that name,
  // Unavailable if the server cannot be reached.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DirectClient>> Connect(
      Runtime& runtime, const std::string& host, uint16_t port, const std::string& actor,
      DirectClientOptions options = {});
  ~DirectClient();
  DirectClient(const DirectClient&) = delete;
  DirectClient& operator=(const DirectClient&) = delete;

  // Sends `request` to the actor and returns its reply. Errors: Unavailable (peer dead, connection
  // lost, or no reply before the deadline: the connection is dropped and the next call
  // reconnects), NotFound (the actor is gone), InvalidArgument (the actor does not handle the
  // message, or a protocol error), DataLoss (an undecodable reply), or the actor's own error
  // with its code (an actor replies with runtime::StatusToError, runtime/status.h).
  [[nodiscard]] absl::StatusOr<caf::message> Call(const caf::message& request);
  [[nodiscard]] absl::StatusOr<caf::message> Call(const caf::message& request, Duration timeout);

  std::string DebugString() const;

 private:
  DirectClient(Runtime& runtime, std::string host, uint16_t port, std::string actor,
               DirectClientOptions options);
  [[nodiscard]] absl::Status EnsureConnected();
  void Drop();

  Runtime* runtime_;
  std::string host_;
  uint16_t port_;
  std::string actor_;
  DirectClientOptions options_;
  std::mutex mu_;  // one call at a time on the socket
  int fd_ = -1;
  std::unique_ptr<direct::Stream> stream_;  // over fd_, TLS when the runtime has it
  uint32_t next_call_id_ = 1;
  uint64_t calls_ = 0;
  uint64_t reconnects_ = 0;
  std::vector<char> out_;                        // the request frame, reused
  std::unique_ptr<direct::FrameReader> reader_;  // replies, while connected
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_DIRECT_H_
