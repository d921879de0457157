// Helpers for the tests that run on a real GPU (CTest label gpu): whether a GPU is usable, so that
// such a test skips naming the CUDA error where none is (TROUPE_SKIP_WITHOUT_GPU), and device
// buffers for one test case (DeviceBuffers). Host C++ against the CUDA runtime API only: compiles
// under g++ and nvcc; link CUDA::cudart. Private to kernels/cuda/ tests.
//
// DeviceBuffers records the first failure (a CUDA call, a launcher's Status) instead of stopping
// the test at once: after one, it launches nothing more and its downloads come back zeroed, and
// status() names it. RunTwice runs a case twice, each time on fresh buffers, and fails unless every
// download is bit-identical between the two runs (run-to-run determinism).
//
// Example:
//   TEST(GeluGpuTest, Forward) {
//     TROUPE_SKIP_WITHOUT_GPU();
//     absl::StatusOr<std::vector<float>> out = RunTwice([&](DeviceBuffers& d) {
//       const float* inp_d = d.Upload(inp);
//       float* out_d = d.Alloc<float>(inp.size());
//       d.Launch([&] { return gelu_forward(out_d, inp_d, n, nullptr); });
//       return d.Download(out_d);
//     });
//     ASSERT_TRUE(out.ok()) << out.status();
//   }
#ifndef TROUPE_KERNELS_CUDA_GPU_TEST_UTIL_H_
#define TROUPE_KERNELS_CUDA_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace troupe::kernels::cuda::testing {

inline std::string CudaErrorText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// Empty when device 0 is usable (a context can be created on it); otherwise why not, naming the
// CUDA call and its error, e.g. "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver
// version is insufficient for CUDA runtime version". Probed once per process.
inline const std::string& NoUsableGpuReason() {
  static const std::string* const reason = [] {
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      return new std::string(absl::StrCat("cudaGetDeviceCount: ", CudaErrorText(e)));
    }
    if (count == 0) return new std::string("cudaGetDeviceCount: no CUDA device");
    if (const cudaError_t e = cudaSetDevice(0); e != cudaSuccess) {
      return new std::string(absl::StrCat("cudaSetDevice(0): ", CudaErrorText(e)));
    }
    if (const cudaError_t e = cudaFree(nullptr); e != cudaSuccess) {  // creates the context
      return new std::string(
          absl::StrCat("cudaFree(nullptr) (context creation): ", CudaErrorText(e)));
    }
    return new std::string();
  }();
  return *reason;
}

// In a TEST body or a fixture's SetUp: skips the test, saying why, unless a GPU is usable.
#define TROUPE_SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                             \
    if (const std::string& troupe_no_gpu_ = ::troupe::kernels::cuda::testing::NoUsableGpuReason(); \
        !troupe_no_gpu_.empty()) {                                                                 \
      GTEST_SKIP() << "GPU test skipped, no usable GPU: " << troupe_no_gpu_;                       \
    }                                                                                              \
  } while (false)

// Device memory for one test case, freed with it (see the header comment).
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (const Buffer& b : buffers_) {
      const cudaError_t e = cudaFree(b.ptr);
      // After a failure the context may be unusable and every cudaFree fail: reported already.
      if (e != cudaSuccess && status_.ok()) ADD_FAILURE() << "cudaFree: " << CudaErrorText(e);
    }
  }

  // n elements of device memory filled with 0xFF bytes (a NaN as float or bf16), so that an output
  // element a kernel should have written and did not shows. Null after a failure.
  template <typename T>
  T* Alloc(size_t n) {
    if (!status_.ok()) return nullptr;
    void* p = nullptr;
    const size_t bytes = n * sizeof(T);
    if (!Check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc")) return nullptr;
    buffers_.push_back({p, bytes});
    if (!Check(cudaMemset(p, 0xFF, bytes), "cudaMemset")) return nullptr;
    return static_cast<T*>(p);
  }

  // A device copy of host. Null after a failure.
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* p = Alloc<T>(host.size());
    if (p == nullptr) return nullptr;
    if (!host.empty() &&
        !Check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
               "cudaMemcpy to the device")) {
      return nullptr;
    }
    return p;
  }

  // Runs launch() (a launcher call, returning absl::Status) unless a step before failed.
  template <typename F>
  void Launch(F&& launch) {
    if (!status_.ok()) return;
    status_.Update(std::forward<F>(launch)());
  }

  // All of buffer p (from Alloc or Upload of this object) once every kernel launched so far has
  // finished; zeroed after a failure. Each download's bytes are kept for RunTwice.
  template <typename T>
  std::vector<T> Download(const T* p) {
    const Buffer* b = Find(p);
    if (b == nullptr && status_.ok()) {
      status_.Update(
          absl::InternalError("Download: not the start of a buffer of this DeviceBuffers"));
    }
    std::vector<T> host(b == nullptr ? 0 : b->bytes / sizeof(T));
    if (Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the kernels") &&
        (host.empty() ||
         Check(cudaMemcpy(host.data(), p, host.size() * sizeof(T), cudaMemcpyDeviceToHost),
               "cudaMemcpy to the host"))) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
      downloads_.emplace_back(bytes, bytes + host.size() * sizeof(T));
      return host;
    }
    return std::vector<T>(host.size(), T{});
  }

  const absl::Status& status() const { return status_; }
  std::vector<std::vector<unsigned char>> TakeDownloads() { return std::move(downloads_); }

 private:
  struct Buffer {
    void* ptr;
    size_t bytes;
  };

  // True on cudaSuccess; otherwise records the first failure (if none yet) and returns false.
  bool Check(cudaError_t e, const char* what) {
    if (!status_.ok()) return false;
    if (e == cudaSuccess) return true;
    status_.Update(absl::InternalError(absl::StrCat(what, ": ", CudaErrorText(e))));
    return false;
  }

  const Buffer* Find(const void* p) const {
    for (const Buffer& b : buffers_) {
      if (b.ptr == p) return &b;
    }
    return nullptr;
  }

  std::vector<Buffer> buffers_;
  std::vector<std::vector<unsigned char>> downloads_;
  absl::Status status_;
};

// Runs run(DeviceBuffers&) twice, each time on fresh buffers, and returns the first run's result:
// an error if either run failed, or if any download differs in a single bit between the runs.
// The first run's buffers are freed before the second starts.
template <typename F>
auto RunTwice(F&& run) -> absl::StatusOr<decltype(run(std::declval<DeviceBuffers&>()))> {
  std::optional<decltype(run(std::declval<DeviceBuffers&>()))> result;
  std::vector<std::vector<unsigned char>> a, b;
  {
    DeviceBuffers first;
    result.emplace(run(first));
    if (!first.status().ok()) return first.status();
    a = first.TakeDownloads();
  }
  {
    DeviceBuffers second;
    (void)run(second);
    if (!second.status().ok()) return second.status();
    b = second.TakeDownloads();
  }
  if (a.size() != b.size()) {
    return absl::InternalError(
        absl::StrCat("the second run made ", b.size(), " downloads, the first ", a.size()));
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      const size_t at = static_cast<size_t>(
          std::mismatch(a[i].begin(), a[i].end(), b[i].begin(), b[i].end()).first - a[i].begin());
      return absl::InternalError(absl::StrCat("not bit-identical run to run: download ", i, " (",
                                              a[i].size(), " bytes) differs at byte ", at));
    }
  }
  return std::move(*result);
}

}  // namespace troupe::kernels::cuda::testing

#endif  // TROUPE_KERNELS_CUDA_GPU_TEST_UTIL_H_
