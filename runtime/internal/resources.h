// internal/resources.h — the "key=value,key=value" lists of --resources, --labels and
// Placement, parsed once for the head (scheduler input) and the node agent (its GPU count).
#ifndef TROUPE_RUNTIME_INTERNAL_RESOURCES_H_
#define TROUPE_RUNTIME_INTERNAL_RESOURCES_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace troupe::runtime::internal {

// "spot=true,zone=a" -> {spot: true, zone: a}; `field` names the option in errors.
[[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> ParseLabels(
    const std::string& text, const std::string& field);
// "cpu=2,gpu=1,memory=8G" -> amounts (memory in bytes); negative or non-numeric is an error.
[[nodiscard]] absl::StatusOr<std::map<std::string, double>> ParseResources(
    const std::string& text, const std::string& field);

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_RESOURCES_H_
