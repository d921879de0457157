#include "troupe/kernels/matmul.h"

#include <string>
#include <vector>

#include "fast_math.h"
#include "troupe/kernels/parallel.h"

#ifdef TROUPE_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#endif

namespace troupe::kernels {
namespace {

// Block sizes are a function of the problem size only, never of the thread count, so results are
// identical at any thread count. Two blocks per product from 513 to 4096 rows (one for each of two
// threads), one up to 512, four and more past 4096: as large as that allows, because every block
// re-packs the whole shared operand (with 64-row blocks that packing cost a third of dweight's GEMM
// time; four blocks instead of two made the 20M step 3% slower on 2 threads and 7% slower on 1, a
// training rank's count). A third thread finds no block of a product under 4097 rows; the
// step's other loops (attention's heads, the element-wise kernels) still use it.
int64_t BlockRows(int64_t rows) {
  const int64_t b = std::min<int64_t>(2048, std::max<int64_t>(256, (rows + 1) / 2));
  return (b + 15) / 16 * 16;
}

// dbias[o] += Σ_i dout[i, o] for o in [lo, hi), the rows in order.
template <typename T>
TROUPE_WIDE_SIMD void BiasGradColumns(T* __restrict dbias, const T* __restrict dout, int64_t lo,
                                      int64_t hi, int64_t n, int64_t oc) {
  for (int64_t i = 0; i < n; ++i) {
    const T* row = dout + i * oc;
    for (int64_t o = lo; o < hi; ++o) dbias[o] += row[o];
  }
}

#ifdef TROUPE_HAVE_OPENBLAS
// OpenBLAS is loaded here, at the first GEMM, not linked: it fixes its kernel set (its "core
// type") once, when it is loaded, from OPENBLAS_CORETYPE or its own CPU detection — and the
// OpenBLAS of Debian 12 (0.3.21) takes CPUs newer than itself for a Prescott (SSE3 kernels, 3-5x
// slower than the AVX2 / AVX-512 ones those CPUs have). Loading it ourselves lets troupe name the
// core type by instruction set, the same on every process of a job on machines with the same
// instruction set (deterministic mode needs one GEMM everywhere), unless the user set
// OPENBLAS_CORETYPE. Loaded on use, not before main: a program that never runs a CPU GEMM (a GPU
// worker, the GPU bundle's tools) runs on a machine without OpenBLAS; one that does and cannot
// load it stops at that GEMM, naming the library. Our kernels parallelise over fixed blocks, so
// OpenBLAS runs single-threaded.
struct Blas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
  void (*set_threads)(int) = nullptr;
  std::string core;
  std::string error;  // why it could not be loaded ("" when it was)
};

const char* CoreForThisCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;  // OpenBLAS's own detection
}

// Before main, while the process has one thread: setenv is not safe beside other threads.
[[maybe_unused]] const bool core_type_set = [] {
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    if (const char* core = CoreForThisCpu()) setenv("OPENBLAS_CORETYPE", core, 0);
  }
  return true;
}();

Blas LoadBlas() {
  Blas blas;
  void* lib = dlopen(TROUPE_OPENBLAS_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    blas.error = std::string("cannot load OpenBLAS (") + TROUPE_OPENBLAS_LIBRARY +
                 "): " + (why != nullptr ? why : "unknown error");
    return blas;
  }
  blas.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
  blas.dgemm = reinterpret_cast<decltype(&cblas_dgemm)>(dlsym(lib, "cblas_dgemm"));
  blas.set_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
  auto core_name = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
  if (blas.sgemm == nullptr || blas.dgemm == nullptr || blas.set_threads == nullptr) {
    blas.error = std::string(TROUPE_OPENBLAS_LIBRARY) +
                 " lacks cblas_sgemm/cblas_dgemm/openblas_set_num_threads";
    return blas;
  }
  blas.core = core_name != nullptr ? core_name() : "unknown";
  return blas;
}

const Blas& GetBlas() {
  static const Blas blas = LoadBlas();
  return blas;
}

// The library for a GEMM that is about to run: without it this process cannot compute at all.
// Single-threaded on every thread that calls it: the OpenMP build of OpenBLAS (Debian's
// libopenblas0-openmp) takes its thread count from the calling thread's OpenMP setting, which is
// per thread, and otherwise starts a team of its own beside our pool (measured: the 20M step
// 1.5x slower on 2 vCPUs).
const Blas& UsableBlas() {
  const Blas& blas = GetBlas();
  thread_local const bool single_threaded = [&blas] {
    if (blas.error.empty()) blas.set_threads(1);
    return true;
  }();
  (void)single_threaded;
  if (!blas.error.empty()) {
    std::fprintf(stderr,
                 "troupe: a CPU matrix product needs OpenBLAS: %s (install libopenblas0, or put "
                 "its folder on LD_LIBRARY_PATH)\n",
                 blas.error.c_str());
    std::abort();
  }
  return blas;
}

void BlasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  UsableBlas().sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                     m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void BlasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
              int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  UsableBlas().dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                     m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

// Portable GEMM: packs op(B) as a row-major [k, n] panel so the inner loop is an axpy over
// contiguous memory that the compiler vectorises without reassociating sums.
template <typename T>
void ReferenceGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  constexpr int64_t kColBlock = 256;
  std::vector<T> panel;
  std::vector<T> acc;
  for (int64_t j0 = 0; j0 < n; j0 += kColBlock) {
    const int64_t nb = std::min(kColBlock, n - j0);
    panel.assign(k * nb, T(0));
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < nb; ++j)
        panel[p * nb + j] = tb ? b[(j0 + j) * ldb + p] : b[p * ldb + j0 + j];
    }
    acc.assign(nb, T(0));
    for (int64_t i = 0; i < m; ++i) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t p = 0; p < k; ++p) {
        const T av = ta ? a[p * lda + i] : a[i * lda + p];
        const T* row = &panel[p * nb];
        for (int64_t j = 0; j < nb; ++j) acc[j] += av * row[j];
      }
      T* crow = c + i * ldc + j0;
      for (int64_t j = 0; j < nb; ++j) {
        crow[j] = (beta == T(0) ? T(0) : beta * crow[j]) + alpha * acc[j];
      }
    }
  }
}

}  // namespace

std::string GemmBackend() {
#ifdef TROUPE_HAVE_OPENBLAS
  const Blas& blas = GetBlas();
  return blas.error.empty() ? "OpenBLAS " + blas.core : "unavailable: " + blas.error;
#else
  return "reference";
#endif
}

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
#ifdef TROUPE_HAVE_OPENBLAS
  BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  ReferenceGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t c,
                   int64_t oc) {
  ParallelForRange(n, BlockRows(n), [&](int64_t lo, int64_t hi) {
    T* o = out + lo * oc;
    if (bias != nullptr) {
      for (int64_t i = lo; i < hi; ++i) std::copy(bias, bias + oc, out + i * oc);
    }
    Gemm<T>(false, true, hi - lo, oc, c, T(1), inp + lo * c, c, weight, c,
            bias != nullptr ? T(1) : T(0), o, oc);
  });
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int64_t n, int64_t c, int64_t oc) {
  if (dinp != nullptr) {
    ParallelForRange(n, BlockRows(n), [&](int64_t lo, int64_t hi) {
      Gemm<T>(false, false, hi - lo, c, oc, T(1), dout + lo * oc, oc, weight, c, T(0),
              dinp + lo * c, c);
    });
  }
  ParallelForRange(oc, BlockRows(oc), [&](int64_t lo, int64_t hi) {
    Gemm<T>(true, false, hi - lo, c, n, T(1), dout + lo, oc, inp, c, T(1), dweight + lo * c, c);
    if (dbias != nullptr) BiasGradColumns(dbias, dout, lo, hi, n, oc);
  });
}

#define TROUPE_INSTANTIATE(T)                                                                  \
  template void Gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, \
                        int64_t, T, T*, int64_t);                                              \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void MatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                  int64_t);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::kernels
