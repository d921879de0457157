#include "internal/resources.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/config.h"

namespace troupe::runtime::internal {

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text,
                                                               const std::string& field) {
  std::map<std::string, std::string> out;
  for (absl::string_view kv : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first.empty() || p.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected key=value[,key=value], got '", text, "'"));
    }
    out[p.first] = p.second;
  }
  return out;
}

absl::StatusOr<std::map<std::string, double>> ParseResources(const std::string& text,
                                                             const std::string& field) {
  TROUPE_ASSIGN_OR_RETURN(auto kv, ParseLabels(text, field));
  std::map<std::string, double> out;
  for (const auto& [k, v] : kv) {
    double amount = 0;
    if (k == "memory") {
      auto bytes = ParseByteSize(v);
      if (!bytes.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": memory=", v, ": ", bytes.status().message()));
      }
      amount = static_cast<double>(*bytes);
    } else if (!absl::SimpleAtod(v, &amount) || amount < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", k, "=", v, ": expected a non-negative number"));
    }
    out[k] = amount;
  }
  return out;
}

}  // namespace troupe::runtime::internal
