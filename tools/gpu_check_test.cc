// ToolsGpuCheck: troupe_gpu_check (tools/gpu_check.cc) as scripts/gpu-check runs it. On a GPU,
// GPT-2 124M's forward + backward on the GPU matches the CPU model (a small batch, to stay fast;
// gpu-check runs the full B=2, T=128 and the 20M training runs). Without a usable GPU, every
// subcommand fails at once, exit 2, naming the CUDA runtime's error. Built twice: as the gpu test
// (TROUPE_GPU_CHECK_ON_GPU) and as a unit test, so that CI machines without a GPU check the fast
// failure; each skips, saying why, where the other applies.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "shell_test_util.h"

namespace troupe::tools {
namespace {

// Runs troupe_gpu_check with `args`; returns the exit status, with stdout + stderr in *out.
int GpuCheck(const std::string& args, std::string* out) {
  return Shell("timeout 600 " TROUPE_GPU_CHECK_BINARY " " + args, out);
}

// Empty when a CUDA device is usable here; else the runtime's error name (or why not).
std::string NoGpuReason() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) return cudaGetErrorName(e);
  if (count == 0) return "no CUDA device";
  return "";
}

#ifdef TROUPE_GPU_CHECK_ON_GPU

TEST(ToolsGpuCheck, Gpt2ForwardAndBackwardOnTheGpuMatchTheCpuModel) {
  if (const std::string why = NoGpuReason(); !why.empty()) {
    GTEST_SKIP() << "no usable GPU here (" << why << ")";
  }
  std::string out;
  EXPECT_EQ(GpuCheck("gpt2 --b 1 --t 64", &out), 0) << out;
  std::printf("%s", out.c_str());
}

#else

TEST(ToolsGpuCheckWithoutAGpu, EverySubcommandExitsTwoAtOnceNamingTheCudaError) {
  const std::string why = NoGpuReason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is usable here: the gpu-labelled test covers it";
  for (const char* args : {"gpt2", "train20m --steps 3", "train20m --bf16"}) {
    std::string out;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(GpuCheck(args, &out), 2) << args << ": " << out;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The device is checked before any CPU model is built: ~0.1 s on an idle machine, about 1 s
    // on a loaded one; building GPT-2 124M's CPU model first would take several.
    EXPECT_LT(seconds, 3.0) << args;
    EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << args << ": " << out;
    if (why.rfind("cudaError", 0) == 0) {
      EXPECT_NE(out.find(why), std::string::npos) << args << ": " << out;
    }
    std::printf("troupe_gpu_check %s here: exit 2 in %.3f s: %s", args, seconds, out.c_str());
  }
}

#endif

}  // namespace
}  // namespace troupe::tools
