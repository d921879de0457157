// internal/preemption.h — where a node agent hears that its machine is going away.
//
//   sigterm  the signal itself (Kubernetes: SIGTERM, then terminationGracePeriodSeconds); every
//            source but `none` also drains on SIGTERM
//   aws      EC2's instance metadata service, IMDSv2: PUT /latest/api/token (a session token,
//            renewed when refused), then GET /latest/meta-data/spot/instance-action, 404 until
//            the two-minute notice, then {"action": "terminate", "time": "<RFC 3339>"}
//   gce      the GCE metadata server, `Metadata-Flavor: Google`: GET
//            /computeMetadata/v1/instance/preempted ("TRUE" or "FALSE"), then the same with
//            wait_for_change=true&last_etag=… (a hanging GET that answers when it flips); ~30 s
//   none     no notice: SIGTERM stops the node at once (its workers are lost, not handed over)
//
// A watcher polls on its own thread and calls back once, with how long the cloud says is left.
// Every HTTP request goes through cpp-httplib (Debian's libcpp-httplib-dev).
#ifndef TROUPE_RUNTIME_INTERNAL_PREEMPTION_H_
#define TROUPE_RUNTIME_INTERNAL_PREEMPTION_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "troupe/runtime/config.h"

namespace troupe::runtime::internal {

enum class PreemptionSource { kNone, kSigterm, kAws, kGce };
// "none" | "sigterm" | "aws" | "gce".
const char* Name(PreemptionSource s);
// "--preemption_source: expected none, sigterm, aws or gce, got 'x'" for anything else.
absl::StatusOr<PreemptionSource> ParsePreemptionSource(const std::string& text);
// The metadata endpoint a cloud's machines reach their own metadata at.
std::string DefaultMetadataEndpoint(PreemptionSource s);

struct PreemptionNotice {
  Duration left;       // until the cloud takes the machine (the cloud's own figure, else its norm)
  std::string detail;  // "aws spot instance-action terminate at 2026-11-26T10:00:00Z"
};

class PreemptionWatcher {
 public:
  struct Options {
    PreemptionSource source = PreemptionSource::kAws;  // kAws or kGce
    std::string endpoint;                              // "http://HOST[:PORT]"; "" = the cloud's
    Duration poll = std::chrono::seconds(5);           // between AWS polls; GCE's wait bound
  };
  // Starts polling; `on_notice` runs once, on the watcher's thread. An endpoint that is not
  // "http://HOST[:PORT]" is an error naming it; one that does not answer is retried (logged once).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PreemptionWatcher>> Start(
      Options options, std::function<void(const PreemptionNotice&)> on_notice);
  ~PreemptionWatcher();  // stops polling (an answer in flight is cut off)

 private:
  struct Impl;
  explicit PreemptionWatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_PREEMPTION_H_
