#include "allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace troupe::kernels::cuda {
namespace {

using ::testing::HasSubstr;

TEST(CachingAllocatorTest, SizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1 << 20), size_t{1} << 20);
  // Above 1 MiB: four classes per power of two.
  EXPECT_EQ(CachingAllocator::RoundSize((1 << 20) + 1), size_t{5} << 18);  // 1.25 MiB
  EXPECT_EQ(CachingAllocator::RoundSize(size_t{3} << 20), size_t{3} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((size_t{3} << 20) + 1), size_t{7} << 19);  // 3.5 MiB
  EXPECT_EQ(CachingAllocator::RoundSize((size_t{7} << 19) + 1), size_t{4} << 20);
  // Never under the request, never 25% or more over it, always a multiple of 512.
  for (size_t bytes = 1; bytes < (size_t{1} << 34); bytes = bytes * 3 / 2 + 7) {
    const size_t r = CachingAllocator::RoundSize(bytes);
    ASSERT_GE(r, bytes);
    ASSERT_EQ(r % 512, 0u) << bytes;
    if (bytes > 4096) {
      ASSERT_LT(r - bytes, bytes / 4) << bytes;
    }
  }
}

TEST(CachingAllocatorTest, ReusesFreedBlocksOfTheSameSizeClass) {
  CachingAllocator alloc(HostMemoryBackend());
  auto a = alloc.Allocate(1000);
  ASSERT_TRUE(a.ok()) << a.status();
  std::memset(*a, 0x5a, 1000);  // the memory is usable
  ASSERT_TRUE(alloc.Free(*a).ok());
  auto b = alloc.Allocate(1024);  // same class (1024) as 1000
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  auto c = alloc.Allocate(600);  // another class: a fresh block
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *a);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_backend_allocs, 2);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.bytes_in_use, 1024u + 1024u);
  EXPECT_EQ(s.bytes_requested, 1024u + 600u);
  EXPECT_EQ(s.bytes_reserved, 2048u);
  ASSERT_TRUE(alloc.Free(*b).ok());
  ASSERT_TRUE(alloc.Free(*c).ok());
}

TEST(CachingAllocatorTest, BlocksAreAlignedAndDistinct) {
  CachingAllocator alloc(HostMemoryBackend());
  std::set<void*> seen;
  std::vector<void*> blocks;
  for (size_t bytes : {0, 1, 511, 512, 4097, 70000, 1 << 20, (1 << 20) + 3}) {
    auto p = alloc.Allocate(bytes);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << bytes;
    EXPECT_TRUE(seen.insert(*p).second) << bytes;
    blocks.push_back(*p);
  }
  for (void* p : blocks) ASSERT_TRUE(alloc.Free(p).ok());
}

TEST(CachingAllocatorTest, TracksPeaksAndEmptiesTheCache) {
  CachingAllocator alloc(HostMemoryBackend());
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(*alloc.Allocate(4096));
  EXPECT_EQ(alloc.stats().peak_in_use, 4u * 4096);
  for (void* x : p) ASSERT_TRUE(alloc.Free(x).ok());
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.peak_in_use, 4u * 4096);
  EXPECT_EQ(s.bytes_reserved, 4u * 4096);  // cached, not returned
  void* again = *alloc.Allocate(4096);
  EXPECT_EQ(alloc.stats().num_cache_hits, 1);
  alloc.ResetPeakStats();
  EXPECT_EQ(alloc.stats().peak_in_use, 4096u);
  ASSERT_TRUE(alloc.Free(again).ok());
  ASSERT_TRUE(alloc.EmptyCache().ok());
  s = alloc.stats();
  EXPECT_EQ(s.bytes_reserved, 0u);
  EXPECT_EQ(s.num_backend_frees, 4);
  EXPECT_EQ(s.peak_reserved, 4u * 4096);
  // After emptying, a request goes to the backend again.
  void* fresh = *alloc.Allocate(4096);
  EXPECT_EQ(alloc.stats().num_backend_allocs, 5);
  ASSERT_TRUE(alloc.Free(fresh).ok());
}

TEST(CachingAllocatorTest, DoubleFreeAndForeignPointersAreErrors) {
  CachingAllocator alloc(HostMemoryBackend());
  void* p = *alloc.Allocate(100);
  ASSERT_TRUE(alloc.Free(p).ok());
  absl::Status st = alloc.Free(p);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("double free"));
  int local = 0;
  st = alloc.Free(&local);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("not a block from this allocator"));
  void* q = *alloc.Allocate(100);
  st = alloc.Free(static_cast<char*>(q) + 8);  // inside a block, not its start
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(alloc.Free(nullptr).ok());
  EXPECT_EQ(alloc.stats().num_frees, 1);  // the failed frees changed nothing
  EXPECT_EQ(alloc.stats().bytes_in_use, 512u);
  ASSERT_TRUE(alloc.Free(q).ok());
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  HostBackendOptions o;
  o.capacity = 8192;
  CachingAllocator alloc(HostMemoryBackend(o));
  void* a = *alloc.Allocate(4096);
  void* b = *alloc.Allocate(4096);
  ASSERT_TRUE(alloc.Free(a).ok());
  ASSERT_TRUE(alloc.Free(b).ok());
  // 8 KiB cached in 4 KiB blocks; an 8 KiB block fits only once they are returned.
  auto big = alloc.Allocate(8192);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(alloc.stats().bytes_reserved, 8192u);
  EXPECT_EQ(alloc.stats().num_backend_frees, 2);
  // Nothing left to return: the error says how much was asked and what is in use.
  auto more = alloc.Allocate(512);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("512 bytes with 8192 in use"));
  EXPECT_EQ(alloc.Allocate(CachingAllocator::kMaxBytes + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc.Free(*big).ok());
}

TEST(CachingAllocatorTest, IsThreadSafe) {
  CachingAllocator alloc(HostMemoryBackend());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&alloc, t] {
      for (int i = 0; i < 2000; ++i) {
        auto p = alloc.Allocate(512 * (1 + (i + t) % 5));
        ASSERT_TRUE(p.ok());
        static_cast<char*>(*p)[0] = static_cast<char>(t);
        ASSERT_TRUE(alloc.Free(*p).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.num_allocs, 8000);
  EXPECT_EQ(s.num_frees, 8000);
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_LE(s.num_backend_allocs, 4 * 5);  // at most one block per thread and class
}

TEST(CachingAllocatorTest, DestructorReturnsLiveAndCachedBlocks) {
  HostBackendOptions o;
  o.capacity = 4096;
  auto backend = HostMemoryBackend(o);
  {
    CachingAllocator alloc(std::move(backend));
    void* kept = *alloc.Allocate(2048);
    ASSERT_TRUE(alloc.Free(*alloc.Allocate(2048)).ok());
    (void)kept;  // never freed by the caller: the destructor returns it (no leak under ASan)
  }
}

TEST(CudaMemoryBackendTest, WithoutADriverFailsNamingIt) {
  auto backend = CudaMemoryBackend();
#ifndef TROUPE_HAVE_CUDART
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnimplemented);
#else
  if (backend.ok()) {
    // A GPU: the allocator works on it.
    CachingAllocator alloc(std::move(*backend));
    auto p = alloc.Allocate(1 << 20);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
    ASSERT_TRUE(alloc.Free(*p).ok());
    EXPECT_EQ(*alloc.Allocate(1 << 20), *p);
    return;
  }
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
  EXPECT_THAT(
      std::string(backend.status().message()),
      ::testing::AnyOf(HasSubstr("cudaErrorInsufficientDriver"), HasSubstr("cudaErrorNoDevice")));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("allocator.cc:"));
#endif
}

}  // namespace
}  // namespace troupe::kernels::cuda
