// troupe/runtime/runtime_options.h — what a Runtime (runtime.h) is configured with, without CAF.
//
// Every process of a cluster — head, node agent, worker, the driver of `troupe train` — declares
// these options in its ConfigRegistry (config.h) the same way, so they are the same flags and
// TROUPE_* environment variables everywhere:
//
//   troupe::runtime::RuntimeOptions ro;
//   troupe::runtime::ConfigRegistry config;
//   ro.Register(config);  // --threads, --tls_ca/--tls_cert/--tls_key, TROUPE_TLS_CA, ...
//   if (int rc = ParseCommandLine("mycommand", kUsage, args, config); rc >= 0) return rc;
//   ro.network = true;
//   auto rt = troupe::runtime::Runtime::Create(std::move(registry), ro);
#ifndef TROUPE_RUNTIME_RUNTIME_OPTIONS_H_
#define TROUPE_RUNTIME_RUNTIME_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/runtime/config.h"

namespace troupe::runtime {

struct RuntimeOptions {
  int64_t threads = 2;  // CAF scheduler threads
  // stealing | sharing | testing (deterministic, tests). Sharing by default: CAF 0.17's
  // work-stealing workers poll their queues (50 us naps) while idle, which costs an idle process
  // ~3 % of a core each and, on a host running a node and its workers, ~15 % of all CPU time.
  std::string scheduler = "sharing";
  Duration shutdown_timeout = std::chrono::seconds(10);
  bool log_events = true;  // supervision events to stderr (unless a sink is set)
  bool network = false;    // load CAF's middleman: remote actors, clusters
  // Mutual TLS for remote actors (all three or none): the cluster CA, this process's
  // certificate and its private key, PEM files (`troupe certs` makes them).
  std::string tls_ca, tls_cert, tls_key;
  // Fault injection: kill this process at a named crash point ("name" or "name:N").
  std::string crash_at;
  // The lowest level of log line written (log.h): debug | info | warn | error. Applied by
  // Runtime::Create; inherited by the processes a role starts through TROUPE_LOG_LEVEL.
  std::string log_level = "info";

  bool tls() const { return !tls_cert.empty(); }
  // The flags that give another process of this cluster the same TLS files ({} without TLS):
  // for the processes a role starts (a node's workers, an embedded cluster).
  std::vector<std::string> TlsArgs() const;

  // Declares every option above in `registry` (names: threads, scheduler, shutdown_timeout,
  // log_events, tls_ca, tls_cert, tls_key, crash_at, log_level; `network` is set by the role, not
  // by users),
  // with the struct's current values as defaults.
  void Register(ConfigRegistry& registry);
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_RUNTIME_OPTIONS_H_
