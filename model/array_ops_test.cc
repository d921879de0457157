#include "troupe/model/array_ops.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "troupe/base/big_buffer.h"

namespace troupe::model {
namespace {

// Pages of [p, p + n floats) the kernel holds resident.
int64_t ResidentPages(const float* p, int64_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t e = reinterpret_cast<uintptr_t>(p + n);
  std::vector<unsigned char> in((e - b + page - 1) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(b), e - b, in.data()), 0);
  int64_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  return resident;
}

TEST(HostArrayOpsTest, DiscardZerosTheRangeAndGivesItsWholePagesBack) {
  ArrayOps& ops = HostArrayOps();
  const int64_t n = 1 << 20;  // 4 MiB
  FloatArray a;
  ASSERT_TRUE(ops.Assign(&a, n, 1.0f).ok());
  const int64_t lo = 1001, hi = 900'003;  // neither end on a page boundary
  const int64_t before = ResidentPages(a.data() + lo, hi - lo);
  ASSERT_TRUE(ops.Discard(a.data() + lo, hi - lo).ok());
  const int64_t after = ResidentPages(a.data() + lo, hi - lo);
  EXPECT_LE(after, 2) << "only the partial pages at the ends stay (" << before << " before)";
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a.data()[i], i >= lo && i < hi ? 0.0f : 1.0f) << "element " << i;
  }
  // Less than a page: zeroed in place.
  ASSERT_TRUE(ops.Discard(a.data() + 5, 3).ok());
  EXPECT_EQ(a.data()[4], 1.0f);
  for (int64_t i = 5; i < 8; ++i) EXPECT_EQ(a.data()[i], 0.0f);
  EXPECT_EQ(a.data()[8], 1.0f);
  EXPECT_TRUE(ops.Discard(a.data(), 0).ok());
}

// On huge-page memory (base::AllocateBig), the discarded pages of the 2 MiB regions the range
// covers in part leave huge pages, so that khugepaged cannot bring them back as parts of a huge
// page of the kept ones; a region it covers whole keeps the advice (empty, it is never
// collapsed; held again later, it gets huge pages again).
TEST(HostArrayOpsTest, DiscardTakesOnlyThePartlyCoveredHugePagesOffHugePages) {
  ArrayOps& ops = HostArrayOps();
  constexpr int64_t kHuge = base::kHugePageBytes / sizeof(float);  // floats in a huge page
  FloatArray a;
  ASSERT_TRUE(ops.Assign(&a, 4 * kHuge, 1.0f).ok());  // 8 MiB, 2 MiB aligned
  const int eligible = base::ThpEligible(a.data());
  ASSERT_GE(eligible, 0) << "no THPeligible field in /proc/self/smaps (it exists since Linux 5.0)";
  const int64_t lo = kHuge / 2 + 5, hi = 3 * kHuge + kHuge / 2 + 7;  // regions 0 and 3 in part
  ASSERT_TRUE(ops.Discard(a.data() + lo, hi - lo).ok());
  EXPECT_EQ(base::ThpEligible(a.data() + lo + 1024), 0)
      << "the discarded pages of the first region should be advised MADV_NOHUGEPAGE";
  EXPECT_EQ(base::ThpEligible(a.data() + hi - 1024), 0)
      << "the discarded pages of the last region should be advised MADV_NOHUGEPAGE";
  EXPECT_EQ(base::ThpEligible(a.data() + kHuge + 3), eligible)
      << "the regions covered whole should keep the mapping's advice";
  for (int64_t i = 0; i < 4 * kHuge; ++i) {
    ASSERT_EQ(a.data()[i], i >= lo && i < hi ? 0.0f : 1.0f) << "element " << i;
  }
}

}  // namespace
}  // namespace troupe::model
