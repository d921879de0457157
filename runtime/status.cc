#include "troupe/runtime/status.h"

#include "absl/strings/str_cat.h"
#include "caf/actor_system_config.hpp"
#include "caf/exit_reason.hpp"
#include "caf/message.hpp"
#include "caf/sec.hpp"

namespace troupe::runtime {
namespace {

// The text an error carries: troupe's errors (and CAF's runtime_error) hold one string.
std::string ContextText(const caf::message& ctx) {
  if (ctx.size() == 1 && ctx.match_element<std::string>(0)) return ctx.get_as<std::string>(0);
  return ctx.empty() ? std::string() : caf::to_string(ctx);
}

absl::StatusCode CodeOfSec(caf::sec s) {
  using C = absl::StatusCode;
  switch (s) {
    case caf::sec::request_timeout:
    case caf::sec::connection_timeout:
      return C::kDeadlineExceeded;
    case caf::sec::request_receiver_down:
    case caf::sec::cannot_forward_to_invalid_actor:
    case caf::sec::no_route_to_receiving_node:
    case caf::sec::cannot_connect_to_node:
    case caf::sec::disconnect_during_handshake:
    case caf::sec::socket_disconnected:
    case caf::sec::network_syscall_failed:
    case caf::sec::remote_lookup_failed:
      return C::kUnavailable;
    case caf::sec::unexpected_message:  // the receiver does not handle this message
    case caf::sec::unexpected_response:
    case caf::sec::invalid_argument:
    case caf::sec::cannot_spawn_actor_from_arguments:
    case caf::sec::unknown_type:
      return C::kInvalidArgument;
    case caf::sec::no_actor_published_at_port:
      return C::kNotFound;
    case caf::sec::incompatible_versions:
    case caf::sec::incompatible_application_ids:
      return C::kFailedPrecondition;
    default:
      return C::kUnknown;
  }
}

}  // namespace

caf::error StatusToError(const absl::Status& status) {
  if (status.ok()) return caf::none;
  return caf::error(static_cast<uint8_t>(status.code()), kStatusErrorCategory,
                    caf::make_message(std::string(status.message())));
}

absl::Status ErrorToStatus(const caf::error& error, const std::string& peer) {
  if (!error) return absl::OkStatus();
  const std::string text = ContextText(error.context());
  if (error.category() == kStatusErrorCategory) {
    return absl::Status(static_cast<absl::StatusCode>(error.code()), text);
  }
  const std::string who = peer.empty() ? std::string() : absl::StrCat(peer, ": ");
  if (error.category() == caf::atom("system")) {
    const auto s = static_cast<caf::sec>(error.code());
    return absl::Status(CodeOfSec(s),
                        absl::StrCat(who, caf::to_string(s), text.empty() ? "" : ": ", text));
  }
  if (error.category() == caf::atom("exit")) {
    const auto r = static_cast<caf::exit_reason>(error.code());
    return absl::UnavailableError(absl::StrCat(who, "exited: ", caf::to_string(r)));
  }
  return absl::UnknownError(absl::StrCat(who, caf::to_string(error.category()), " error ",
                                         error.code(), text.empty() ? "" : ": ", text));
}

void RegisterStatusErrors(caf::actor_system_config& config) {
  config.add_error_category(
      kStatusErrorCategory, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
        return absl::Status(static_cast<absl::StatusCode>(code), ContextText(ctx)).ToString();
      });
}

}  // namespace troupe::runtime
