// Matrix multiply for linear layers (forward and backward), on OpenBLAS or a portable reference.
//
// Layout follows llm.c: activations are row-major [N, C], weights are [OC, C] (PyTorch's
// nn.Linear layout), so out = inp · weightᵀ + bias. Work is split into fixed blocks of output rows
// and each block is one single-threaded GEMM, so the result does not depend on the thread count.
// Backward accumulates (+=) into the parameters' gradients (microbatches add up there) and
// overwrites the input's: each GEMM writes its block of it (beta = 0), so the caller clears
// nothing — a cleared buffer was a serial memset of up to 16 MB per product on the step's path.
//
// Example:
//   MatmulForward<float>(out, inp, w, b, /*n=*/B * T, /*c=*/C, /*oc=*/3 * C);
//   MatmulBackward<float>(dinp, dw, db, dout, inp, w, B * T, C, 3 * C);
#ifndef TROUPE_KERNELS_MATMUL_H_
#define TROUPE_KERNELS_MATMUL_H_

#include <cstdint>
#include <string>

namespace troupe::kernels {

// Which GEMM runs: "OpenBLAS <core type>" (TROUPE_BLAS=ON) or "reference". OpenBLAS's core type
// is the one troupe names for this CPU's instruction set (SkylakeX with AVX-512, Haswell with
// AVX2 + FMA), or OPENBLAS_CORETYPE when the user set it. OpenBLAS is loaded at the first GEMM
// (or here): where it cannot be, this says "unavailable: <why>", and a GEMM stops the process
// with that message — a program that never multiplies on the CPU runs without OpenBLAS.
std::string GemmBackend();

// C[m, n] = alpha * op(A) · op(B) + beta * C, row-major, single-threaded. op(X) is X or Xᵀ.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// out[n, oc] = inp[n, c] · weight[oc, c]ᵀ + bias[oc]. bias may be null. Overwrites out.
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t n, int64_t c,
                   int64_t oc);

// dinp = dout · weight (overwritten); dweight += doutᵀ · inp; dbias += column sums of dout. dbias
// may be null.
template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int64_t n, int64_t c, int64_t oc);

}  // namespace troupe::kernels

#endif  // TROUPE_KERNELS_MATMUL_H_
