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
// And the early returns Debian's Abseil does not ship:
//   TROUPE_RETURN_IF_ERROR(store.Commit(manifest));
//   TROUPE_ASSIGN_OR_RETURN(auto record, LoadRecord(fs, path));
#ifndef TROUPE_RUNTIME_STATUS_H_
#define TROUPE_RUNTIME_STATUS_H_

#include <cstdint>
#include <string>
#include <utility>

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

namespace status_internal {
inline absl::Status AsStatus(absl::Status s) { return s; }
template <class T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace status_internal

}  // namespace troupe::runtime

#define TROUPE_STATUS_CONCAT_INNER_(a, b) a##b
#define TROUPE_STATUS_CONCAT_(a, b) TROUPE_STATUS_CONCAT_INNER_(a, b)

// Returns the Status (or a StatusOr's status) from the enclosing function unless it is OK.
#define TROUPE_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                                  \
    ::absl::Status troupe_status_ = ::troupe::runtime::status_internal::AsStatus(expr); \
    if (!troupe_status_.ok()) return troupe_status_;                                    \
  } while (false)

// `lhs` = the value of the StatusOr `rexpr`, or return its status from the enclosing function.
#define TROUPE_ASSIGN_OR_RETURN(lhs, rexpr) \
  TROUPE_ASSIGN_OR_RETURN_IMPL_(TROUPE_STATUS_CONCAT_(troupe_statusor_, __LINE__), lhs, rexpr)
#define TROUPE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // TROUPE_RUNTIME_STATUS_H_
