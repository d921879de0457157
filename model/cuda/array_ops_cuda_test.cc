// The CUDA ArrayOps (array_ops_cuda.h) where no GPU can be used: creating one fails with
// FailedPrecondition naming the CUDA runtime's error and where it was raised, with its own stream
// or a borrowed one, and the same for GptDevice. On a GPU machine these skip;
// model_cuda_array_ops_gpu_test covers the operations there.
#include "array_ops_cuda.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpt_device.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/config.h"

namespace troupe::model::cuda {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// `who`: the entry point, which the message starts with.
void ExpectNoUsableGpu(const absl::Status& status, const char* who) {
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const std::string message(status.message());
  EXPECT_THAT(message,
              AnyOf(HasSubstr("cudaErrorInsufficientDriver"), HasSubstr("cudaErrorNoDevice")));
  EXPECT_THAT(message, HasSubstr("cuda:0"));
  EXPECT_THAT(message, ::testing::StartsWith(who));
  EXPECT_THAT(message, HasSubstr("check.h:"));  // file:line of the failing call
}

TEST(CudaArrayOpsTest, CreateWithoutAGpuFailsNamingTheCause) {
  absl::StatusOr<std::unique_ptr<model::ArrayOps>> ops = CreateCudaArrayOps(0);
  if (ops.ok()) {
    GTEST_SKIP() << "a GPU is present (" << (*ops)->name()
                 << "); model_cuda_array_ops_gpu_test covers it";
  }
  ExpectNoUsableGpu(ops.status(), "CreateCudaArrayOps");
  // The message says what failed.
  EXPECT_THAT(std::string(ops.status().message()), HasSubstr("cudaGetDeviceCount"));
}

TEST(CudaArrayOpsTest, CreateOnABorrowedStreamWithoutAGpuFailsNamingTheCause) {
  absl::StatusOr<std::unique_ptr<model::ArrayOps>> ops =
      CreateCudaArrayOpsOnStream(0, /*stream=*/nullptr);
  if (ops.ok()) GTEST_SKIP() << "a GPU is present; model_cuda_array_ops_gpu_test covers it";
  ExpectNoUsableGpu(ops.status(), "CreateCudaArrayOps");
}

TEST(CudaArrayOpsTest, GptDeviceWithoutAGpuFailsNamingTheCause) {
  absl::StatusOr<std::unique_ptr<GptDevice>> gpt =
      GptDevice::Create(model::GptConfig::Tiny(64), 0, /*bf16=*/false);
  if (gpt.ok()) GTEST_SKIP() << "a GPU is present; model_cuda_array_ops_gpu_test covers it";
  ExpectNoUsableGpu(gpt.status(), "GptDevice");
}

}  // namespace
}  // namespace troupe::model::cuda
