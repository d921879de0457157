// The driver's embedded cluster on a GPU machine: how worker nodes share the GPUs.
#include "troupe/actors/training.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace troupe::actors {
namespace {

// Ranks sharing one GPU are separate hosts to NCCL (it refuses two ranks of a communicator on
// one device): each slot its own NCCL_HOSTID, sockets on loopback; a GPU each needs none of it.
TEST(EmbeddedGpuTest, RanksSharingAGpuAreEachAHostOfTheirOwnToNccl) {
  using Env = std::map<std::string, std::string>;
  EXPECT_EQ(EmbeddedGpuEnvironment(1, 0, 1), (Env{{"CUDA_VISIBLE_DEVICES", "1"}}));
  std::set<std::string> host_ids;
  for (int gpu = 0; gpu < 2; ++gpu) {
    for (int slot = 0; slot < 4; ++slot) {
      Env env = EmbeddedGpuEnvironment(gpu, slot, 4);
      EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], std::to_string(gpu));
      EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "lo");
      EXPECT_EQ(env["NCCL_IB_DISABLE"], "1");
      EXPECT_FALSE(env["NCCL_HOSTID"].empty());
      host_ids.insert(env["NCCL_HOSTID"]);
      EXPECT_EQ(env.size(), 4u);
    }
  }
  EXPECT_EQ(host_ids.size(), 4u) << "one host id per slot: ranks sharing a GPU differ";
  EXPECT_NE(EmbeddedGpuEnvironment(0, 0, 4)["NCCL_HOSTID"],
            EmbeddedGpuEnvironment(0, 1, 4)["NCCL_HOSTID"]);
  EXPECT_EQ(EmbeddedGpuEnvironment(0, 2, 4)["NCCL_HOSTID"],
            EmbeddedGpuEnvironment(1, 2, 4)["NCCL_HOSTID"]);
}

TEST(EmbeddedGpuTest, TooManyWorkersForTheGpusNameRanksPerGpu) {
  train::JobSpec spec;
  spec.model.device = "cuda";
  spec.workers = 4;
  EXPECT_TRUE(CheckEmbeddedGpuCount(spec, 4).ok());
  absl::Status s = CheckEmbeddedGpuCount(spec, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "elastic.workers: expected at most 1 with model.device = \"cuda\" (this machine has 1 "
            "GPU(s) and elastic.ranks_per_gpu = 1; set [elastic] ranks_per_gpu = 4 to let that "
            "many ranks share a GPU), got 4");
  s = CheckEmbeddedGpuCount(spec, 3);
  EXPECT_NE(s.message().find("set [elastic] ranks_per_gpu = 2"), absl::string_view::npos) << s;
  spec.ranks_per_gpu = 4;
  EXPECT_TRUE(CheckEmbeddedGpuCount(spec, 1).ok());
  EXPECT_EQ(CheckEmbeddedGpuCount(spec, 0).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace troupe::actors
