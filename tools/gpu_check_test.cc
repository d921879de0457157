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
#include <cstdlib>
#include <string>

#include "shell_test_util.h"

namespace troupe::tools {
namespace {

// Runs troupe_gpu_check with `args`; returns the exit status, with stdout + stderr in *out. The
// binary is the build's, or $TROUPE_GPU_CHECK_BINARY where that is set (the GPU bundle's runner:
// scripts/gpu-bundle moves the binaries out of the build tree).
std::string GpuCheckBinary() {
  const char* env = std::getenv("TROUPE_GPU_CHECK_BINARY");
  return env != nullptr && *env != '\0' ? env : TROUPE_GPU_CHECK_BINARY;
}
int GpuCheck(const std::string& args, std::string* out) {
  return Shell("timeout 600 '" + GpuCheckBinary() + "' " + args, out);
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

// OpenBLAS is loaded at the first CPU matrix product, not before main: with it unloadable (the
// library covered by /dev/null in a mount namespace of this test's own), troupe_gpu_check still
// reaches its device check and names the CUDA error, while a program that multiplies on the CPU
// stops at its first product naming OpenBLAS — not before main, with no word of why.
TEST(ToolsGpuCheckWithoutAGpu, WithoutOpenBlasOnlyACpuMatrixProductFailsAndSaysWhy) {
  const std::string why = NoGpuReason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is usable here: the gpu-labelled test covers it";
  // unshare -m: the bind mount is this command's alone and goes with it.
  auto without_blas = [](const std::string& command) {
    return std::string(
               R"sh(unshare -m sh -ec 'lib=$(ldconfig -p | awk "/libopenblas.so.0 /{print \$NF; exit}"); )sh"
               R"sh(test -n "$lib"; mount --bind /dev/null "$(readlink -f "$lib")"; )sh") +
           command + "'";
  };
  std::string out;
  EXPECT_EQ(Shell(without_blas("exec timeout 60 " + GpuCheckBinary() + " gpt2"), &out), 2) << out;
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;
  EXPECT_EQ(out.find("OpenBLAS"), std::string::npos) << out;
  EXPECT_NE(Shell(without_blas("exec timeout 60 " TROUPE_MODEL_BENCH_BINARY
                               " time --steps 1 --layers 1 --heads 2 --width 16 --vocab 32 "
                               "--context 8 --batch 1 --seq 8 --threads 1"),
                  &out),
            0)
      << out;
  EXPECT_NE(
      out.find("a CPU matrix product needs OpenBLAS: cannot load OpenBLAS (libopenblas.so.0)"),
      std::string::npos)
      << out;
}

// train20m's CPU side alone (--write-cpu-losses, as scripts/gpu-bundle precomputes it) needs no
// GPU; a --cpu-losses file is checked against the run's settings before the device (exit 2 naming
// both), and one that fits gets as far as the device, which fails naming the CUDA error.
TEST(ToolsGpuCheckWithoutAGpu, CpuLossesAreWrittenWithoutAGpuAndMustFitTheRun) {
  const std::string why = NoGpuReason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is usable here: the gpu-labelled test covers it";
  const std::string file = ::testing::TempDir() + "gpu_check_test_losses.txt";
  std::string out;
  ASSERT_EQ(
      GpuCheck("train20m --steps 2 --b 1 --t 16 --threads 1 --write-cpu-losses " + file, &out), 0)
      << out;
  std::string written;
  ASSERT_EQ(Shell("cat " + file, &written), 0);
  EXPECT_NE(written.find("train20m-cpu-losses steps=2 b=1 t=16 seed=1 bf16=0 params="),
            std::string::npos)
      << written;
  EXPECT_NE(written.find("\n1 "), std::string::npos) << written;  // one line per step

  EXPECT_EQ(GpuCheck("train20m --steps 2 --b 1 --t 16 --bf16 --cpu-losses " + file, &out), 2);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  EXPECT_NE(out.find("bf16=0"), std::string::npos) << out;  // what the file was written for
  EXPECT_NE(out.find("bf16=1"), std::string::npos) << out;  // what this run is
  EXPECT_EQ(out.find("FAILED_PRECONDITION"), std::string::npos) << out;

  EXPECT_EQ(GpuCheck("train20m --steps 2 --b 1 --t 16 --cpu-losses " + file, &out), 2);
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;
  if (why.rfind("cudaError", 0) == 0) {
    EXPECT_NE(out.find(why), std::string::npos) << out;
  }
  std::remove(file.c_str());
}

#endif

}  // namespace
}  // namespace troupe::tools
