//! CUDA GEMM through cuBLAS: `C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C`, row-major,
//! plain and strided-batched; the same parameters as `host::gemm`.
//!
//! Row-major onto column-major: a row-major (r x c) array read column-major is its transpose,
//! so `C = op(A) op(B)` is computed as the column-major `C^T (n x m) = op(B)^T op(A)^T`, i.e.
//! cuBLAS is called with the operands swapped (B first), the sizes (n, m, k), and each operand's
//! own transpose flag unchanged. Compute type is `CUBLAS_COMPUTE_32F` for all element types:
//! fp32 stays true fp32 (no TF32) unless the context enables TF32 (`Context<Cuda>::set_tf32`,
//! then `CUBLAS_COMPUTE_32F_FAST_TF32` for fp32 operands); 16-bit operands accumulate in fp32. C
//! may be fp32 with 16-bit A and B. Work goes to the context's stream through its cuBLAS handle.
// fourway-requires: cuda
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/backend/gemm_types.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::cuda {

namespace detail {
template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
  return CUDA_R_16F;
}
inline cublasOperation_t cublas_op(Trans t) { return t == Trans::none ? CUBLAS_OP_N : CUBLAS_OP_T; }
/// fp32 accumulation always; TF32 products for fp32 operands when the context allows them.
template <class T>
cublasComputeType_t compute_type(const Context<Cuda>& ctx) {
  return std::is_same_v<T, float> && ctx.tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}
inline int to_int(std::int64_t v, const char* what) {
  check<ShapeError>(v <= INT_MAX, "fourway: cuBLAS takes 32-bit sizes; ", what, "=", v, " exceeds ",
                    INT_MAX, " (split the GEMM)");
  return static_cast<int>(v);
}
}  // namespace detail

/// C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C, row-major; fp32 accumulation.
template <floating_dtype T, floating_dtype TC>
requires fourway::detail::gemm_output<T, TC>
void gemm(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
          float beta, TC* c, std::int64_t ldc) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  check_cublas(
      cublasGemmEx(ctx.cublas(), detail::cublas_op(tb), detail::cublas_op(ta),
                   detail::to_int(n, "n"), detail::to_int(m, "m"), detail::to_int(k, "k"), &alpha,
                   b, detail::cuda_type<T>(), detail::to_int(ldb, "ldb"), a, detail::cuda_type<T>(),
                   detail::to_int(lda, "lda"), &beta, c, detail::cuda_type<TC>(),
                   detail::to_int(ldc, "ldc"), detail::compute_type<T>(ctx), CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

/// `batch` independent GEMMs; matrix i starts at A + i*stride_a, B + i*stride_b, C + i*stride_c.
template <floating_dtype T, floating_dtype TC>
requires fourway::detail::gemm_output<T, TC>
void gemm_strided_batched(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m,
                          std::int64_t n, std::int64_t k, float alpha, const T* a, std::int64_t lda,
                          std::int64_t stride_a, const T* b, std::int64_t ldb,
                          std::int64_t stride_b, float beta, TC* c, std::int64_t ldc,
                          std::int64_t stride_c, std::int64_t batch) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  check<ShapeError>(batch >= 0, "fourway: gemm_strided_batched batch=", batch, " must be >= 0");
  if (m == 0 || n == 0 || batch == 0) return;
  check_cublas(
      cublasGemmStridedBatchedEx(
          ctx.cublas(), detail::cublas_op(tb), detail::cublas_op(ta), detail::to_int(n, "n"),
          detail::to_int(m, "m"), detail::to_int(k, "k"), &alpha, b, detail::cuda_type<T>(),
          detail::to_int(ldb, "ldb"), stride_b, a, detail::cuda_type<T>(),
          detail::to_int(lda, "lda"), stride_a, &beta, c, detail::cuda_type<TC>(),
          detail::to_int(ldc, "ldc"), stride_c, detail::to_int(batch, "batch"),
          detail::compute_type<T>(ctx), CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

}  // namespace fourway::cuda
