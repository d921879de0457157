// internal/tls.h — mutual TLS for the cluster's control plane, completed before CAF's protocol
// runs.
//
// CAF's wire protocol (BASP) has no payload cap and starts before any application check, so a
// TLS cluster authenticates every connection first: each side presents a certificate signed by
// the cluster's CA and verifies the other's. A peer without one, or one that sends garbage,
// fails the handshake (1 s at most) and is cut off before BASP reads a byte.
//
// Why not CAF's own OpenSSL module: with CAF 0.17.6 one failed handshake on the listening
// port drops every established connection of that process (measured: a plain node trying to
// join disconnected all members), which would let anyone take a cluster down. So the head's
// public port is a TLS front door of ours that relays to CAF listening on loopback, and each
// member's CAF connects through a local TLS dialer.
#ifndef TROUPE_RUNTIME_INTERNAL_TLS_H_
#define TROUPE_RUNTIME_INTERNAL_TLS_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "caf/actor.hpp"
#include "troupe/runtime/runtime.h"

namespace troupe::runtime::internal {

// Checks that the three PEM files exist and parse, and that the key matches the certificate
// (CAF's OpenSSL module aborts the process on a bad file; we refuse with a message instead).
[[nodiscard]] absl::Status CheckTlsFiles(const std::string& ca, const std::string& cert,
                                         const std::string& key);

// Publishes `handle` on host:port, through TLS when the runtime has TLS configured.
[[nodiscard]] absl::StatusOr<uint16_t> Publish(Runtime& runtime, const caf::actor& handle,
                                               uint16_t port, const std::string& host);
// Where this process's CAF dials to reach host:port: host:port itself, or, with TLS, a local
// dialer of ours that carries the connection over mutual TLS there (trying to reach it for up to
// `retry_for`). For a caller that connects without blocking (the middleman actor's connect_atom).
[[nodiscard]] absl::StatusOr<std::pair<std::string, uint16_t>> DialVia(Runtime& runtime,
                                                                       const std::string& host,
                                                                       uint16_t port,
                                                                       Duration retry_for = {});
// Connects to the actor published on host:port, through TLS when configured; while nothing
// listens there, tries again for up to `retry_for`.
[[nodiscard]] absl::StatusOr<caf::actor> Connect(Runtime& runtime, const std::string& host,
                                                 uint16_t port, Duration retry_for = {});

// The direct channel's TLS context (troupe/runtime/direct.h) for this process's certificate: the
// peer must present one signed by the cluster CA, as on the control plane. One per side and set
// of files, made on first use.
[[nodiscard]] absl::StatusOr<std::shared_ptr<SSL_CTX>> DirectTlsContext(const RuntimeOptions& o,
                                                                        bool server);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_TLS_H_
