//! CUDA GEMMs with an epilogue through cuBLASLt, twins of `host/gemm_epilogue.hpp`:
//!
//!   gemm_bias   c = op(A)·op(B) + bias                             epilogue BIAS
//!               pre_gelu = op(A)·op(B) + bias, c = gelu(pre_gelu)  epilogue GELU_AUX_BIAS
//!   gemm_bgrad  c += op(A)·op(B), dbias += Σ over B's k rows       epilogue BGRADA
//!   gemm_dgelu  c = gelu'(pre_gelu) ⊙ (op(A)·op(B)), dbias += Σ over c's rows
//!                                                                  epilogue DGELU(_BGRAD)
//!
//! row-major, C (m, n) with leading dimension ldc (pre_gelu too), bias and dbias (n), fp32
//! accumulation (TF32 for fp32 operands only when the context allows it, as `gemm`). One kernel
//! does what a GEMM and one or two passes over its output did. Row-major onto cuBLASLt's
//! column-major as in gemm.cuh: the operands swap, so D is (n x m), cuBLASLt's A is our B, the
//! bias and its gradient run along D's rows, the GELU input is the aux matrix with D's leading
//! dimension, and our B's column sums are a reduction of cuBLASLt's A over k (BGRADA).
//! cuBLASLt's GELU is the tanh form GPT-2 uses (the host twin's `gelu_forward`).
//!
//! The bias gradients come out of cuBLASLt written, not added, and in fp32: into a scratch at
//! the end of the context's persistent workspace (`Context<Cuda>::lt_workspace`; the GEMM gets
//! the rest), then one pass of n elements adds them to `dbias`. Each shape's algorithm is asked
//! of cuBLASLt's heuristic once per thread and device and cached (`lt_algorithm`): the query
//! costs host time on every call otherwise. The preference states 16-byte operands, so the
//! algorithm holds for any call of that shape whose pointers are 16-byte aligned.
//!
//! When cuBLASLt offers no algorithm for the call (a pointer off a 16-byte boundary, an aux
//! leading dimension not a multiple of 8, a bias gradient longer than the scratch, a shape or an
//! epilogue it declines) the same result is computed unfused: `gemm`, then elementwise passes.
// fourway-requires: cuda
#pragma once

#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <map>
#include <optional>

#include "fourway/backend/cuda/bias.cuh"
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
template <class V>
void lt_prefer(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const V& v) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof(v)),
               "cublasLtMatmulPreferenceSetAttribute");
}

inline bool on_16_bytes(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// Bytes at the end of the persistent workspace that hold a bias gradient (fp32) between the GEMM
/// that reduces it and the pass that adds it; the GEMM's own workspace is the rest.
inline constexpr std::size_t lt_bias_scratch_bytes = Context<Cuda>::lt_tail_bytes;
inline constexpr std::size_t lt_gemm_workspace_bytes =
    Context<Cuda>::lt_workspace_bytes - lt_bias_scratch_bytes;
inline float* lt_bias_scratch(const Context<Cuda>& ctx) {
  return reinterpret_cast<float*>(static_cast<char*>(ctx.lt_workspace()) + lt_gemm_workspace_bytes);
}

/// What one cuBLASLt call adds to the product.
struct LtEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS / GELU_AUX_BIAS: read; BGRAD*: written
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;  // GELU_AUX_BIAS: written; DGELU*: read
  std::int64_t aux_ld = 0;
};

/// One entry of the algorithm cache: everything the heuristic's answer depends on.
struct LtKey {
  int device, epilogue, type, bias_type, ta, tb;
  bool tf32;
  std::int64_t m, n, k, lda, ldb, ldc, aux_ld;
  auto operator<=>(const LtKey&) const = default;
};

/// The algorithm cuBLASLt's heuristic picks for `key`, asked once per thread (`query` runs the
/// heuristic) and kept: nullopt when it offers none, which is kept too.
template <class Query>
std::optional<cublasLtMatmulAlgo_t> lt_algorithm(const LtKey& key, Query&& query) {
  thread_local std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, query()).first;
  return it->second;
}

/// D = op(A)·op(B) (+ beta·C) with epilogue `e`, one cublasLtMatmul; false when cuBLASLt has no
/// algorithm for it (nothing was written).
template <floating_dtype T>
bool lt_matmul(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
               std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
               float beta, T* c, std::int64_t ldc, const LtEpilogue& e) {
  if (!on_16_bytes(a) || !on_16_bytes(b) || !on_16_bytes(c)) return false;
  if (e.bias != nullptr && !on_16_bytes(e.bias)) return false;
  if (e.aux != nullptr && (!on_16_bytes(e.aux) || e.aux_ld % 8 != 0)) return false;
  LtHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> op;
  check_cublas(cublasLtMatmulDescCreate(&op.h, compute_type<T>(ctx), CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  // D^T = op(B)^T · op(A)^T: cuBLASLt's A is our B, its B our A
  const cublasOperation_t op_a = cublas_op(tb), op_b = cublas_op(ta);
  lt_set(op.h, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  lt_set(op.h, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, e.kind);
  if (e.bias != nullptr) {
    lt_set(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
    lt_set(op.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, e.bias_type);
  }
  if (e.aux != nullptr) {
    lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux);
    lt_set(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, e.aux_ld);
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
  const std::size_t ws = lt_gemm_workspace_bytes;
  const LtKey key{ctx.device(),
                  static_cast<int>(e.kind),
                  static_cast<int>(cuda_type<T>()),
                  e.bias != nullptr ? static_cast<int>(e.bias_type) : -1,
                  static_cast<int>(ta),
                  static_cast<int>(tb),
                  compute_type<T>(ctx) != CUBLAS_COMPUTE_32F,
                  m,
                  n,
                  k,
                  lda,
                  ldb,
                  ldc,
                  e.aux != nullptr ? e.aux_ld : 0};
  const std::optional<cublasLtMatmulAlgo_t> algo = lt_algorithm(key, [&] {
    LtHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
    lt_prefer(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    const std::uint32_t align = 16;
    lt_prefer(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align);
    lt_prefer(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align);
    lt_prefer(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align);
    lt_prefer(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align);
    cublasLtMatmulHeuristicResult_t found{};
    int count = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), op.h, la.h, lb.h, lc.h,
                                                            lc.h, pref.h, 1, &found, &count);
    return h == CUBLAS_STATUS_SUCCESS && count > 0 ? std::optional(found.algo) : std::nullopt;
  });
  if (!algo) return false;
  const float alpha = 1.0f;
  check_cublas(cublasLtMatmul(ctx.cublaslt(), op.h, &alpha, b, la.h, a, lb.h, &beta, c, lc.h, c,
                              lc.h, &*algo, ctx.lt_workspace(), ws, ctx.stream()),
               "cublasLtMatmul");
  return true;
}

/// dbias (n) += the fp32 sums the epilogue left in the scratch.
template <floating_dtype T>
void add_bias_scratch(const Context<Cuda>& ctx, T* dbias, std::int64_t n) {
  const float* sums = lt_bias_scratch(ctx);
  for_each(
      ctx, n, [=] __device__(std::int64_t i) { store(dbias + i, load(dbias + i) + sums[i]); },
      "bias gradient from the GEMM epilogue");
}

inline bool fits_bias_scratch(std::int64_t n) {
  return static_cast<std::size_t>(n) * sizeof(float) <= lt_bias_scratch_bytes;
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
  const bool gelu = pre_gelu != nullptr;
  detail::LtEpilogue e{gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS, bias,
                       detail::cuda_type<T>(), pre_gelu, gelu ? ldc : 0};
  if (detail::lt_matmul(ctx, ta, tb, m, n, k, a, lda, b, ldb, 0.0f, c, ldc, e)) return;
  T* y = gelu ? pre_gelu : c;
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, y, ldc);
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

/// c (m, n) += op(A)·op(B) and dbias (n) += the column sums of B, the dense untransposed (k, n)
/// output gradient: a weight gradient and its bias's in one call. See the file comment.
template <floating_dtype T>
void gemm_bgrad(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                std::int64_t ldc, T* dbias) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  fourway::detail::check_bgrad_operand(tb, k, n, ldb);
  if (n == 0) return;
  if (m > 0 && k > 0 && detail::fits_bias_scratch(n)) {
    const detail::LtEpilogue e{CUBLASLT_EPILOGUE_BGRADA, detail::lt_bias_scratch(ctx), CUDA_R_32F};
    if (detail::lt_matmul(ctx, ta, tb, m, n, k, a, lda, b, ldb, 1.0f, c, ldc, e)) {
      detail::add_bias_scratch(ctx, dbias, n);
      return;
    }
  }
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
  bias_backward(ctx, dbias, b, k, n);
}

/// c (m, n) = gelu'(pre_gelu) ⊙ (op(A)·op(B)) and, with `dbias`, dbias (n) += Σ over c's rows
/// (c dense). See the file comment.
template <floating_dtype T>
void gemm_dgelu(const Context<Cuda>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                const T* pre_gelu, T* c, std::int64_t ldc, T* dbias = nullptr) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  fourway::detail::check_dgelu_output(dbias, n, ldc);
  if (m == 0 || n == 0) return;
  const bool grad = dbias != nullptr;
  if (!grad || detail::fits_bias_scratch(n)) {
    const detail::LtEpilogue e{grad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU,
                               grad ? detail::lt_bias_scratch(ctx) : nullptr, CUDA_R_32F,
                               const_cast<T*>(pre_gelu), ldc};
    if (detail::lt_matmul(ctx, ta, tb, m, n, k, a, lda, b, ldb, 0.0f, c, ldc, e)) {
      if (grad) detail::add_bias_scratch(ctx, dbias, n);
      return;
    }
  }
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  detail::for_each(
      ctx, m * n,
      [=] __device__(std::int64_t i) {
        const std::int64_t at = (i / n) * ldc + i % n;
        detail::store(c + at,
                      detail::gelu_grad(detail::load(pre_gelu + at)) * detail::load(c + at));
      },
      "gemm_dgelu epilogue");
  if (grad) bias_backward(ctx, dbias, c, m, n);
}

}  // namespace fourway::cuda
