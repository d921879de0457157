#include "troupe/base/big_buffer.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace troupe::base {
namespace {

bool AllZero(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

// What /sys says the kernel does with MADV_HUGEPAGE regions: 0 for "[never]", 1 otherwise, -1
// where the file cannot be read.
int SystemAllowsHugePages() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.empty()) return -1;
  return s.find("[never]") == std::string::npos ? 1 : 0;
}

TEST(BigBufferTest, LargeAllocationsAreZeroedHugePageAlignedAndAdvised) {
  const size_t bytes = 3 * kHugePageBytes + 5;
  void* p = AllocateBig(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  EXPECT_TRUE(AllZero(p, bytes));
  std::memset(p, 0x5a, bytes);  // all of it is writable
  EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5a);
  const int eligible = ThpEligible(p);
  if (eligible >= 0 && SystemAllowsHugePages() >= 0) {  // the field exists since Linux 5.0
    EXPECT_EQ(eligible, SystemAllowsHugePages())
        << "the mapping should be advised for transparent huge pages (MADV_HUGEPAGE)";
  }
  FreeBig(p, bytes);
  EXPECT_EQ(ThpEligible(p), -1) << "freed: the mapping should be gone";
}

TEST(BigBufferTest, SmallAllocationsAreZeroedHeapMemory) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, kHugePageBytes - 1}) {
    void* p = AllocateBig(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_TRUE(AllZero(p, bytes)) << bytes;
    FreeBig(p, bytes);
  }
  FreeBig(nullptr, kHugePageBytes);  // ignored
  EXPECT_EQ(AllocateBig(SIZE_MAX - 4096), nullptr) << "a size the rounding would wrap";
}

TEST(BigBufferTest, BigVectorBehavesAsAVector) {
  BigVector<float> v(kHugePageBytes / sizeof(float) + 1, 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(v.back(), 1.5f);
  v.assign(10, 2.0f);  // keeps its capacity
  EXPECT_EQ(v.size(), 10u);
  EXPECT_EQ(v[9], 2.0f);
  BigVector<float> w = v;
  EXPECT_EQ(w, v);
  v.resize(3 * kHugePageBytes / sizeof(float));  // reallocates, copying
  EXPECT_EQ(v[9], 2.0f);
  EXPECT_EQ(v.back(), 0.0f);
}

}  // namespace
}  // namespace troupe::base
