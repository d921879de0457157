// metadata_sim.h — a cloud's instance metadata server, simulated: real HTTP (cpp-httplib) on
// loopback, answering what a node agent's preemption watcher asks (internal/preemption.h) the way
// AWS IMDSv2 and the GCE metadata server do, and flipping to "preempted" on cue. A node agent run
// with --metadata_endpoint=simulate serves one for itself (chaos: spot-notice flips it); tests run
// their own.
//
//   AWS  PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds) -> a token;
//        GET /latest/meta-data/spot/instance-action (X-aws-ec2-metadata-token) -> 401 without a
//        valid token, 404 until Preempt, then {"action": "terminate", "time": RFC 3339}
//   GCE  GET /computeMetadata/v1/instance/preempted (Metadata-Flavor: Google, else 403) -> "FALSE"
//        or "TRUE" with an ETag; with wait_for_change=true&last_etag=E it answers when the value's
//        ETag differs from E, or after timeout_sec
#ifndef TROUPE_RUNTIME_METADATA_SIM_H_
#define TROUPE_RUNTIME_METADATA_SIM_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::runtime {

class MetadataSimulator {
 public:
  MetadataSimulator();  // listening on 127.0.0.1, an ephemeral port
  ~MetadataSimulator();
  std::string endpoint() const;  // "http://127.0.0.1:PORT"
  // From now on the machine is being taken, `left` from now (AWS's time; GCE's value flips).
  void Preempt(std::chrono::seconds left = std::chrono::seconds(120));
  // Every token handed out so far is refused from now on (as an expired IMDSv2 session).
  void ExpireTokens();
  int64_t token_requests() const;   // PUT /latest/api/token answered
  int64_t notice_requests() const;  // GETs of instance-action or preempted answered

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_METADATA_SIM_H_
