//! CUDA GEMM with a bias (and GELU) epilogue through cuBLASLt, twin of `host/gemm_epilogue.hpp`:
//!
//!   c = op(A)·op(B) + bias                     epilogue BIAS
//!   pre_gelu = op(A)·op(B) + bias, c = gelu(pre_gelu)   epilogue GELU_AUX_BIAS
//!
//! row-major, C (m, n) with leading dimension ldc (pre_gelu too), bias (n), fp32 accumulation
//! (TF32 for fp32 operands only when the context allows it, as `gemm`). One kernel writes what a
//! GEMM, a bias pass and a GELU pass wrote before, and reads the GEMM's output zero times instead
//! of twice or three times. Row-major onto cuBLASLt's column-major as in gemm.cuh: the operands
//! swap, so D is (n x m), the bias runs along D's rows (cuBLASLt's bias vector) and the GELU input
//! goes to the aux matrix with D's leading dimension. cuBLASLt's GELU is the tanh form GPT-2 uses
//! (the host twin's `gelu_forward`). The workspace is the context's persistent one
//! (`Context<Cuda>::lt_workspace`).
//!
//! When cuBLASLt offers no algorithm for the call (a pointer off a 16-byte boundary, an aux
//! leading dimension not a multiple of 8, a shape it declines) the same result is computed
//! unfused: `gemm`, then one elementwise pass for the bias (and GELU).
// fourway-requires: cuda
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/elementwise.cuh"
#include "fourway/backend/cuda/gemm.cuh"
#include "fourway/backend/gemm_types.hpp"

namespace fourway::cuda {

namespace detail {

/// Destroys a cuBLASLt descriptor at scope exit.
template <class H, cublasStatus_t (*Destroy)(H)>
struct LtHandle {
  H h = nullptr;
  LtHandle() = default;
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  ~LtHandle() {
    if (h != nullptr) (void)Destroy(h);
  }
};

template <class V>
void lt_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
  check_cublas(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)),
               "cublasLtMatmulDescSetAttribute");
}

inline bool on_16_bytes(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// The fused call; false when cuBLASLt has no algorithm for it (nothing was written).
template <floating_dtype T>
bool lt_gemm_bias(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                  std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                  const T* bias, T* c, std::int64_t ldc, T* pre_gelu) {
  if (!on_16_bytes(a) || !on_16_bytes(b) || !on_16_bytes(c) || !on_16_bytes(bias)) return false;
  if (pre_gelu != nullptr && (!on_16_bytes(pre_gelu) || ldc % 8 != 0)) return false;
  LtHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> op;
  check_cublas(cublasLtMatmulDescCreate(&op.h, compute_type<T>(ctx), CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  // D^T = op(B)^T · op(A)^T: cuBLASLt's A is our B, its B our A
  const cublasOperation_t op_a = cublas_op(tb), op_b = cublas_op(ta);
  lt_set(op.h, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  lt_set(op.h, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  const cublasLtEpilogue_t epilogue =
      pre_gelu != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  lt_set(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
  lt_set(op.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type<T>());
  if (pre_gelu != nullptr) {
    lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(pre_gelu));
    lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldc);
    lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, cuda_type<T>());
  }
  using Layout = LtHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
  Layout la, lb, lc;
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  check_cublas(cublasLtMatrixLayoutCreate(&la.h, cuda_type<T>(), u(op_a == CUBLAS_OP_N ? n : k),
                                          u(op_a == CUBLAS_OP_N ? k : n), ldb),
               "cublasLtMatrixLayoutCreate (A)");
  check_cublas(cublasLtMatrixLayoutCreate(&lb.h, cuda_type<T>(), u(op_b == CUBLAS_OP_N ? k : m),
                                          u(op_b == CUBLAS_OP_N ? m : k), lda),
               "cublasLtMatrixLayoutCreate (B)");
  check_cublas(cublasLtMatrixLayoutCreate(&lc.h, cuda_type<T>(), u(n), u(m), ldc),
               "cublasLtMatrixLayoutCreate (C)");
  LtHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
  const std::size_t ws = Context<Cuda>::lt_workspace_bytes;
  check_cublas(cublasLtMatmulPreferenceSetAttribute(
                   pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
               "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t found{};
  int count = 0;
  const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), op.h, la.h, lb.h, lc.h,
                                                          lc.h, pref.h, 1, &found, &count);
  if (h != CUBLAS_STATUS_SUCCESS || count == 0) return false;
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(ctx.cublaslt(), op.h, &alpha, b, la.h, a, lb.h, &beta, c, lc.h, c,
                              lc.h, &found.algo, ctx.lt_workspace(), ws, ctx.stream()),
               "cublasLtMatmul");
  return true;
}

}  // namespace detail

/// c (m, n) = op(A)·op(B) + bias, or with `pre_gelu`: pre_gelu = op(A)·op(B) + bias and
/// c = gelu(pre_gelu); row-major, fp32 accumulation. See the file comment.
template <floating_dtype T>
void gemm_bias(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
               std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
               const T* bias, T* c, std::int64_t ldc, T* pre_gelu = nullptr) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (detail::lt_gemm_bias(ctx, ta, tb, m, n, k, a, lda, b, ldb, bias, c, ldc, pre_gelu)) return;
  T* y = pre_gelu != nullptr ? pre_gelu : c;
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, y, ldc);
  const bool gelu = pre_gelu != nullptr;
  detail::for_each(
      ctx, m * n,
      [=] __device__(std::int64_t i) {
        const std::int64_t at = (i / n) * ldc + i % n;
        const float v = detail::load(y + at) + detail::load(bias + i % n);
        detail::store(y + at, v);
        if (gelu) detail::store(c + at, detail::gelu(detail::load(y + at)));
      },
      "gemm_bias epilogue");
}

}  // namespace fourway::cuda
