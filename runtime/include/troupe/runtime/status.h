// troupe/runtime/status.h — one error model across processes: absl::Status everywhere, carried
// over CAF with its code intact.
//
// Two ways a Status crosses a mailbox, both lossless for the code and the message:
//   * as a request's error reply: a handler returns StatusToError(s) (a caf::error of category
//     "absl" whose code is the absl::StatusCode and whose context is the message), and the asker
//     turns whatever error it gets back into a Status with ErrorToStatus — CAF's own errors
//     (timeouts, a receiver that went down, an unexpected message) map to the nearest code;
//   * as a field of a message (a rank reporting how its step went): WireStatus.
//
//   caf::result<caf::actor> Spawn(...) {
//     if (!fits) return StatusToError(absl::ResourceExhaustedError("no node has 2 GPUs free"));
//   }
//   ...  [&](caf::error& e) { out = ErrorToStatus(e, "head"); }   // ResourceExhausted again
//
// The early returns (TROUPE_RETURN_IF_ERROR, TROUPE_ASSIGN_OR_RETURN) are
// troupe/base/status_macros.h.
#ifndef TROUPE_RUNTIME_STATUS_H_
#define TROUPE_RUNTIME_STATUS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "caf/atom.hpp"
#include "caf/error.hpp"
#include "caf/meta/type_name.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe::runtime {

// The category of errors that carry an absl::StatusCode (caf::error::category()).
inline constexpr caf::atom_value kStatusErrorCategory = caf::atom("absl");

// OK becomes "no error"; any other status a caf::error of kStatusErrorCategory.
caf::error StatusToError(const absl::Status& status);

// The inverse of StatusToError; CAF's own errors become the nearest code (request_timeout →
// DeadlineExceeded, request_receiver_down → Unavailable, unexpected_message → InvalidArgument, ...)
// with `peer` (what was asked, e.g. "head") named in the message. No error → OK.
absl::Status ErrorToStatus(const caf::error& error, const std::string& peer = "");

// Lets caf::actor_system::render print kStatusErrorCategory errors as "NOT_FOUND: message".
// Runtime::Create does this for every runtime.
void RegisterStatusErrors(caf::actor_system_config& config);

// An absl::Status as a field of a message: its code and message.
struct WireStatus {
  int32_t code = 0;
  std::string message;
  static WireStatus From(const absl::Status& s) {
    return {static_cast<int32_t>(s.code()), std::string(s.message())};
  }
  absl::Status ToStatus() const {
    return absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  bool operator==(const WireStatus& o) const { return code == o.code && message == o.message; }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WireStatus& x) {
  return f(caf::meta::type_name("troupe.WireStatus"), x.code, x.message);
}

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_STATUS_H_
