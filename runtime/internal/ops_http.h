// internal/ops_http.h — the head's HTTP server: dashboard, JSON API and /metrics (ops_http.cc).
#ifndef TROUPE_RUNTIME_INTERNAL_OPS_HTTP_H_
#define TROUPE_RUNTIME_INTERNAL_OPS_HTTP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "troupe/runtime/runtime_options.h"

namespace troupe::runtime::internal {

class OpsHttp {
 public:
  // Serves `head`'s views on host:port (0: an ephemeral port); HTTPS with client certificates
  // signed by tls.tls_ca when `tls` has a certificate.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<OpsHttp>> Start(caf::actor_system& sys,
                                                                      caf::actor head,
                                                                      const std::string& host,
                                                                      int port,
                                                                      const RuntimeOptions& tls);
  ~OpsHttp();
  int port() const { return port_; }

 private:
  class Impl;
  OpsHttp(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_OPS_HTTP_H_
