// internal/enum_text.h — the inverse of an enum's Name(x), for the Parse...(text) functions of
// the public headers: one loop and one error wording for all of them.
//
//   constexpr MemberKind kKinds[] = {MemberKind::kNode, MemberKind::kWorker};
//   return ParseEnum("member kind", text, kKinds);  // "member kind: expected node or worker, got
//   'x'"
#ifndef TROUPE_RUNTIME_INTERNAL_ENUM_TEXT_H_
#define TROUPE_RUNTIME_INTERNAL_ENUM_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace troupe::runtime::internal {

// The value of `values` whose Name is `text`; InvalidArgument naming `field`, every expected
// name and `text` otherwise.
template <class E, size_t N>
absl::StatusOr<E> ParseEnum(const char* field, const std::string& text, const E (&values)[N]) {
  for (E v : values) {
    if (text == Name(v)) return v;
  }
  std::string expected;
  for (size_t i = 0; i < N; ++i) {
    absl::StrAppend(&expected, i == 0 ? "" : (i + 1 == N ? " or " : ", "), Name(values[i]));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got '", text, "'"));
}

}  // namespace troupe::runtime::internal

#endif  // TROUPE_RUNTIME_INTERNAL_ENUM_TEXT_H_
