// The NCCL backend on a real GPU: a single-rank communicator all-reduces a device buffer.
// Without a usable CUDA device (or in a build without CUDA) the test skips and says why.
#include <gtest/gtest.h>

#include <vector>

#include "troupe/collectives/nccl_communicator.h"
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace troupe::collectives {
namespace {

TEST(Nccl, SingleRankDeviceAllReduce) {
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << "NCCL test skipped: " << why;
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
  std::printf("NCCL available: %s\n", why.c_str());
  auto server = TcpBootstrapServer::Start();
  ASSERT_TRUE(server.ok());
  auto boot = TcpBootstrapClient::Connect("127.0.0.1", (*server)->port());
  ASSERT_TRUE(boot.ok());
  NcclOptions o;
  auto comm = CreateNcclCommunicator(boot->get(), o);
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

}  // namespace
}  // namespace troupe::collectives
