#include "troupe/base/big_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace troupe::base {
namespace {
size_t MappedBytes(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}
}  // namespace

void* AllocateBig(size_t bytes) {
  if (bytes < kHugePageBytes) return std::calloc(bytes == 0 ? 1 : bytes, 1);
  if (bytes > SIZE_MAX - 2 * kHugePageBytes) return nullptr;  // the rounding below would wrap
  // Map a huge page more than needed and trim both ends, so that the start is aligned.
  const size_t len = MappedBytes(bytes);
  void* raw = mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (at + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (start > at) munmap(raw, start - at);
  const uintptr_t end = at + len + kHugePageBytes;
  if (end > start + len) munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  void* p = reinterpret_cast<void*>(start);
  // Advice only: where the kernel has no transparent huge pages this fails and changes nothing.
  (void)madvise(p, len, MADV_HUGEPAGE);
  return p;
}

void FreeBig(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(p);
    return;
  }
  munmap(p, MappedBytes(bytes));
}

int ThpEligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {  // a mapping's first line
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::atoi(line.c_str() + 12);
  }
  return -1;
}

}  // namespace troupe::base
