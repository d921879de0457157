// TROUPE_RETURN_IF_ERROR and TROUPE_ASSIGN_OR_RETURN return the first error and assign values.
#include "troupe/base/status_macros.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace troupe::base {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::Status Check(int x) { return x < 0 ? absl::OutOfRangeError("negative") : absl::OkStatus(); }

absl::StatusOr<int> Quarter(int x) {
  TROUPE_RETURN_IF_ERROR(Check(x));
  TROUPE_ASSIGN_OR_RETURN(int half, Half(x));
  TROUPE_ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

TEST(StatusMacrosTest, MacrosReturnTheFirstErrorAndAssignValues) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(-4).status(), absl::OutOfRangeError("negative"));
  EXPECT_EQ(Quarter(6).status(), absl::InvalidArgumentError("3 is odd"));
  EXPECT_EQ(Quarter(7).status(), absl::InvalidArgumentError("7 is odd"));
}

}  // namespace
}  // namespace troupe::base
