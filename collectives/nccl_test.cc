// The NCCL backend on real GPUs (the logic without one: nccl_logic_test.cc, over the fake):
// a single-rank all-reduce of a device buffer; Abort and a new generation on the device; with
// two or more GPUs, one rank per GPU, an abort that releases (or times out) the others and a new
// generation over the survivors; the ordered reduce-scatter's add kernel against the host's sum,
// and the ordered reduce-scatter itself, one rank per GPU, against the serial canonical tree.
// Without a usable CUDA device (or in a build without CUDA) each test skips and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "nccl_backend.h"
#include "troupe/collectives/nccl_communicator.h"
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace troupe::collectives {
namespace {

#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

struct Boot {
  std::unique_ptr<TcpBootstrapServer> server;
  std::vector<std::unique_ptr<TcpBootstrapClient>> clients;
  explicit Boot(int n) {
    auto s = TcpBootstrapServer::Start();
    EXPECT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    for (int i = 0; i < n; ++i) {
      auto c = TcpBootstrapClient::Connect("127.0.0.1", server->port());
      EXPECT_TRUE(c.ok()) << c.status();
      clients.push_back(*std::move(c));
    }
  }
};

NcclOptions Options(int rank, int size, uint64_t generation, int device) {
  NcclOptions o;
  o.rank = rank;
  o.size = size;
  o.generation = generation;
  o.device = device;
  o.key_prefix = "gpu-test";
  o.connect_timeout = absl::Seconds(60);
  return o;
}
#endif

TEST(Nccl, SingleRankDeviceAllReduce) {
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << "NCCL test skipped: " << why;
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  std::printf("NCCL available: %s\n", why.c_str());
  Boot boot(1);
  auto comm = CreateNcclCommunicator(boot.clients[0].get(), Options(0, 1, 0, 0));
  ASSERT_TRUE(comm.ok()) << comm.status();
  const size_t n = (size_t{1} << 20) + 3;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977) * 0.5f - 100.0f;
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    absl::Status st = (*comm)->AllReduce(Buffer::F32(dev, n), Buffer::F32(dev, n), op, {}).Wait();
    ASSERT_TRUE(st.ok()) << st;
  }
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);  // one rank: sum, avg and max are the identity
  ASSERT_TRUE((*comm)->Barrier({}).Wait().ok());
  std::printf("single-rank NCCL all-reduce of %zu floats on the device: ok; %s\n", n,
              (*comm)->DebugString().c_str());
  cudaFree(dev);
#endif
}

TEST(Nccl, AbortThenANewGenerationOnTheDevice) {
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << "NCCL test skipped: " << why;
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  Boot boot(1);
  auto g0 = CreateNcclCommunicator(boot.clients[0].get(), Options(0, 1, 0, 0));
  ASSERT_TRUE(g0.ok()) << g0.status();
  ASSERT_TRUE((*g0)->Barrier({}).Wait().ok());
  const absl::Status dead = absl::UnavailableError("liveness: a peer died");
  (*g0)->Abort(dead);  // ncclCommAbort on a real communicator
  Work later = (*g0)->Barrier({});
  EXPECT_TRUE(later.IsDone());
  EXPECT_EQ(later.Wait(), dead);
  g0->reset();
  auto g1 = CreateNcclCommunicator(boot.clients[0].get(), Options(0, 1, 1, 0));
  ASSERT_TRUE(g1.ok()) << g1.status();
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1024 * sizeof(float)), cudaSuccess);
  EXPECT_TRUE((*g1)
                  ->AllReduce(Buffer::F32(dev, 1024), Buffer::F32(dev, 1024), ReduceOp::kSum, {})
                  .Wait()
                  .ok());
  cudaFree(dev);
#endif
}

TEST(Nccl, OneRankPerGpuAbortAndRegenerate) {
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << "NCCL test skipped: " << why;
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  const int n = DeviceCount();
  if (n < 2) GTEST_SKIP() << "needs two GPUs, found " << n;
  Boot boot(n);
  const size_t count = 4096;
  std::vector<absl::Status> first(n), pending(n), second(n);
  std::vector<std::unique_ptr<Communicator>> g0(n);
  auto on_ranks = [&](int from, auto f) {
    std::vector<std::thread> ts;
    for (int r = from; r < n; ++r) ts.emplace_back([&, r] { f(r); });
    for (auto& t : ts) t.join();
  };
  on_ranks(0, [&](int r) {
    auto c = CreateNcclCommunicator(boot.clients[r].get(), Options(r, n, 0, r));
    if (!c.ok()) {
      first[r] = c.status();
      return;
    }
    g0[r] = *std::move(c);
    std::vector<float> host(count, static_cast<float>(r + 1));
    float* dev = nullptr;
    cudaMalloc(&dev, count * sizeof(float));
    cudaMemcpy(dev, host.data(), count * 4, cudaMemcpyHostToDevice);
    first[r] = g0[r]
                   ->AllReduce(Buffer::F32(dev, count), Buffer::F32(dev, count), ReduceOp::kSum, {})
                   .Wait();
    cudaMemcpy(host.data(), dev, count * 4, cudaMemcpyDeviceToHost);
    if (first[r].ok() && host[count - 1] != static_cast<float>(n * (n + 1) / 2)) {
      first[r] = absl::InternalError("wrong sum");
    }
    // Ranks 1.. start an all-reduce rank 0 never joins: rank 0 aborts instead (its liveness saw
    // a peer die). Over NVLink the others may not notice: then their own deadline ends it.
    if (r > 0) {
      CollectiveOptions o;
      o.timeout = absl::Seconds(10);
      pending[r] =
          g0[r]
              ->AllReduce(Buffer::F32(dev, count), Buffer::F32(dev, count), ReduceOp::kSum, o)
              .Wait();
    } else {
      absl::SleepFor(absl::Milliseconds(200));
      g0[0]->Abort(absl::UnavailableError("liveness: a peer died"));
    }
    cudaFree(dev);
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(first[r].ok()) << "rank " << r << ": " << first[r];
  for (int r = 1; r < n; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(pending[r]) || absl::IsDeadlineExceeded(pending[r]))
        << "rank " << r << ": " << pending[r];
    std::printf("rank %d after rank 0's abort: %s\n", r, pending[r].ToString().c_str());
  }
  g0.clear();
  on_ranks(1, [&](int r) {  // generation 1: the survivors, ranks renumbered
    auto c = CreateNcclCommunicator(boot.clients[r].get(), Options(r - 1, n - 1, 1, r));
    second[r] = c.ok() ? (*c)->Barrier({}).Wait() : c.status();
  });
  for (int r = 1; r < n; ++r) EXPECT_TRUE(second[r].ok()) << "rank " << r << ": " << second[r];
#endif
}

#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
// Element k, i of microbatch k's gradient: magnitudes from 2^-20 to 2^20.
float Grad(uint64_t k, size_t i) {
  const float unit = static_cast<float>((k * 2654435761u + i * 40503u) % 2001) / 1000.0f - 1.0f;
  return std::ldexp(unit, static_cast<int>((k * 7 + i * 3) % 41) - 20);
}

float SubtreeAt(uint64_t lo, uint64_t hi, size_t i) {
  if (hi - lo == 1) return Grad(lo, i);
  const uint64_t mid = CanonicalMid(lo, hi);
  return SubtreeAt(lo, mid, i) + SubtreeAt(mid, hi, i);
}
#endif

TEST(Nccl, AddKernelIsTheHostSumBitForBit) {
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << "NCCL test skipped: " << why;
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  auto backend = RealNcclBackend();
  ASSERT_TRUE(backend.ok()) << backend.status();
  NcclBackend& b = **backend;
  const size_t n = (size_t{1} << 21) + 5;  // more than one grid's worth: the stride loop
  std::vector<float> x(n), y(n), want(n), got(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = Grad(i % 13, i);
    y[i] = i % 5 == 0 ? std::ldexp(1.0f, -140) : Grad(i % 7 + 20, i);  // subnormals too
    want[i] = x[i] + y[i];
  }
  ASSERT_EQ(b.SetDevice(0), kCudaSuccess);
  StreamHandle stream = nullptr;
  ASSERT_EQ(b.StreamCreateNonBlocking(&stream), kCudaSuccess);
  void *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(b.Malloc(&dx, n * 4), kCudaSuccess);
  ASSERT_EQ(b.Malloc(&dy, n * 4), kCudaSuccess);
  ASSERT_EQ(b.MemcpyAsync(dx, x.data(), n * 4, stream), kCudaSuccess);
  ASSERT_EQ(b.MemcpyAsync(dy, y.data(), n * 4, stream), kCudaSuccess);
  float* fx = static_cast<float*>(dx);
  ASSERT_EQ(b.AddF32(fx, fx, static_cast<float*>(dy), n, stream), kCudaSuccess);  // in place
  ASSERT_EQ(b.AddF32(fx, fx, static_cast<float*>(dy), 0, stream), kCudaSuccess);  // nothing
  ASSERT_EQ(b.MemcpyAsync(got.data(), dx, n * 4, stream), kCudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), cudaSuccess);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0);
  b.Free(dx);
  b.Free(dy);
  b.StreamDestroy(stream);
#endif
}

// One rank per GPU (one rank with one GPU), M = 8 microbatches split into aligned blocks: every
// rank's block is the serial canonical tree's, bit for bit, out of place and in place.
TEST(Nccl, OrderedReduceScatterOnTheDeviceIsTheCanonicalTree) {
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << "NCCL test skipped: " << why;
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  const int n = std::min(DeviceCount(), 8);
  const uint64_t m = 8;
  std::vector<std::pair<uint64_t, uint64_t>> iv = {{0, m}};  // the trainer's split
  while (static_cast<int>(iv.size()) < n) {
    size_t best = 0;
    for (size_t i = 1; i < iv.size(); ++i) {
      if (iv[i].second - iv[i].first > iv[best].second - iv[best].first) best = i;
    }
    const auto [lo, hi] = iv[best];
    iv[best] = {lo, CanonicalMid(lo, hi)};
    iv.insert(iv.begin() + best + 1, {CanonicalMid(lo, hi), hi});
  }
  const size_t block = (size_t{1} << 18) + 7;
  Boot boot(n);
  std::vector<absl::Status> st(n);
  std::vector<std::vector<float>> out(n, std::vector<float>(block)), in_place(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      auto c = CreateNcclCommunicator(boot.clients[r].get(), Options(r, n, 0, r));
      if (!c.ok()) {
        st[r] = c.status();
        return;
      }
      std::vector<float> host(n * block);
      for (size_t i = 0; i < host.size(); ++i) host[i] = SubtreeAt(iv[r].first, iv[r].second, i);
      float *din = nullptr, *dout = nullptr;
      cudaMalloc(&din, host.size() * 4);
      cudaMalloc(&dout, block * 4);
      cudaMemcpy(din, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      CollectiveOptions o;
      o.algorithm = Algorithm::kOrdered;
      o.interval_lo = iv[r].first;
      o.interval_hi = iv[r].second;
      Work a = (*c)->ReduceScatter(Buffer::F32(din, host.size()), Buffer::F32(dout, block),
                                   ReduceOp::kSum, o);
      Work b = (*c)->ReduceScatter(Buffer::F32(din, host.size()),
                                   Buffer::F32(din + r * block, block), ReduceOp::kSum, o);
      st[r] = a.Wait();
      if (st[r].ok()) st[r] = b.Wait();
      cudaMemcpy(out[r].data(), dout, block * 4, cudaMemcpyDeviceToHost);
      in_place[r].resize(block);
      cudaMemcpy(in_place[r].data(), din + r * block, block * 4, cudaMemcpyDeviceToHost);
      cudaFree(din);
      cudaFree(dout);
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    std::vector<float> want(block);
    for (size_t i = 0; i < block; ++i) want[i] = SubtreeAt(0, m, r * block + i);
    EXPECT_EQ(std::memcmp(out[r].data(), want.data(), block * 4), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(in_place[r].data(), want.data(), block * 4), 0) << "rank " << r;
  }
  std::printf("ordered reduce-scatter on %d GPU(s), %zu floats per rank: bit-exact\n", n, block);
#endif
}

}  // namespace
}  // namespace troupe::collectives
