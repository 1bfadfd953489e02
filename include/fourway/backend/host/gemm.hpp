//! Host GEMM: `C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C`, row-major, plain and
//! strided-batched.
//!
//! Two implementations, the same results up to summation order:
//!  - `detail::gemm_blas`: CBLAS `sgemm` (OpenBLAS), compiled when `FOURWAY_HAS_CBLAS` is 1
//!    (link `fourway::cblas`);
//!  - `detail::gemm_builtin`: a cache-blocked GEMM in the BLIS loop order (Goto & van de Geijn,
//!    "Anatomy of high-performance matrix multiplication", TOMS 2008): B panels of KC x NC and A
//!    blocks of MC x KC are packed into contiguous slivers, and an MR x NR register-blocked micro
//!    kernel written with GCC/Clang vector extensions does the rank-1 updates.
//! `host::gemm` uses BLAS when it is there, the built-in otherwise.
//!
//! Invariants: arithmetic and accumulation are fp32 for every element type (16-bit operands are
//! converted while packing, or into fp32 copies for BLAS); `beta == 0` means C is not read (NaN
//! in C does not survive), as in BLAS. C may be fp32 while A and B are 16-bit.
//!
//! Threads: ranks are threads, so one GEMM runs on the calling thread only. The first BLAS call
//! sets OpenBLAS to one thread (`openblas_set_num_threads(1)`) unless the environment variable
//! `OPENBLAS_NUM_THREADS` is set, which is then respected. Conversion and packing scratch is
//! thread-local, grows to the largest call and is not counted by the memory accountant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

#if FOURWAY_HAS_CBLAS
#include <cblas.h>
#endif

namespace fourway::host {

namespace detail {

/// C = beta * C over an m x n block; beta == 0 writes zeros without reading C.
template <class TC>
void scale_c(std::int64_t m, std::int64_t n, float beta, TC* c, std::int64_t ldc) {
  if (beta == 1.0f) return;
  for (std::int64_t i = 0; i < m; ++i) {
    TC* row = c + i * ldc;
    if (beta == 0.0f) {
      for (std::int64_t j = 0; j < n; ++j) row[j] = convert<TC>(0.0f);
    } else {
      for (std::int64_t j = 0; j < n; ++j) row[j] = convert<TC>(beta * convert<float>(row[j]));
    }
  }
}

/// Copies a rows x cols block (leading dimension ld) into dense fp32 storage.
template <class T>
void to_float_block(const T* src, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                    float* dst) {
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) dst[i * cols + j] = convert<float>(src[i * ld + j]);
  }
}

// ---- built-in GEMM -------------------------------------------------------------------------
// Register block: MR rows x NR columns of C live in registers during the k loop. NR is two
// vectors wide; with 32 vector registers (AVX-512) MR = 8 uses 16 accumulators, with 16 (AVX2,
// SSE) MR = 6 uses 12. KC x NR slivers of B stay in L1, MC x KC of A in L2 (1 MiB per core on
// the EPYC this was tuned on, see docs/benchmarks/kernels.md), KC x NC of B in L3.
#if defined(__AVX512F__)
inline constexpr int gemm_vw = 16;
inline constexpr int gemm_mr = 8;
#elif defined(__AVX__)
inline constexpr int gemm_vw = 8;
inline constexpr int gemm_mr = 6;
#else
inline constexpr int gemm_vw = 4;
inline constexpr int gemm_mr = 6;
#endif
inline constexpr int gemm_nr = 2 * gemm_vw;
inline constexpr std::int64_t gemm_kc = 256;
inline constexpr std::int64_t gemm_mc = std::int64_t{16} * gemm_mr;
inline constexpr std::int64_t gemm_nc = 1024;
static_assert(gemm_nc % gemm_nr == 0 && gemm_mc % gemm_mr == 0);

using gemm_vec = float __attribute__((vector_size(gemm_vw * sizeof(float))));

inline gemm_vec load_vec(const float* p) {
  gemm_vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, gemm_vec v) { std::memcpy(p, &v, sizeof v); }

/// Packs op(A)[i0:i0+mc, p0:p0+kc] into slivers of MR rows: sliver s holds A[s*MR + ii, p] at
/// [s * kc * MR + p * MR + ii]; rows past mc are zero.
template <class T>
void pack_a(Trans ta, const T* a, std::int64_t lda, std::int64_t i0, std::int64_t p0,
            std::int64_t mc, std::int64_t kc, float* dst) {
  for (std::int64_t s = 0; s < mc; s += gemm_mr) {
    const std::int64_t rows = std::min<std::int64_t>(gemm_mr, mc - s);
    float* out = dst + s * kc;
    if (ta == Trans::none) {
      for (std::int64_t ii = 0; ii < rows; ++ii) {
        const T* src = a + (i0 + s + ii) * lda + p0;
        for (std::int64_t p = 0; p < kc; ++p) out[p * gemm_mr + ii] = convert<float>(src[p]);
      }
    } else {
      for (std::int64_t p = 0; p < kc; ++p) {
        const T* src = a + (p0 + p) * lda + i0 + s;
        for (std::int64_t ii = 0; ii < rows; ++ii) out[p * gemm_mr + ii] = convert<float>(src[ii]);
      }
    }
    for (std::int64_t ii = rows; ii < gemm_mr; ++ii) {
      for (std::int64_t p = 0; p < kc; ++p) out[p * gemm_mr + ii] = 0.0f;
    }
  }
}

/// Packs op(B)[p0:p0+kc, j0:j0+nc] into slivers of NR columns: sliver s holds B[p, s*NR + jj]
/// at [s * kc * NR + p * NR + jj]; columns past nc are zero.
template <class T>
void pack_b(Trans tb, const T* b, std::int64_t ldb, std::int64_t p0, std::int64_t j0,
            std::int64_t kc, std::int64_t nc, float* dst) {
  for (std::int64_t s = 0; s < nc; s += gemm_nr) {
    const std::int64_t cols = std::min<std::int64_t>(gemm_nr, nc - s);
    float* out = dst + s * kc;
    if (tb == Trans::none) {
      for (std::int64_t p = 0; p < kc; ++p) {
        const T* src = b + (p0 + p) * ldb + j0 + s;
        float* o = out + p * gemm_nr;
        for (std::int64_t jj = 0; jj < cols; ++jj) o[jj] = convert<float>(src[jj]);
        for (std::int64_t jj = cols; jj < gemm_nr; ++jj) o[jj] = 0.0f;
      }
    } else {
      for (std::int64_t jj = 0; jj < cols; ++jj) {
        const T* src = b + (j0 + s + jj) * ldb + p0;
        for (std::int64_t p = 0; p < kc; ++p) out[p * gemm_nr + jj] = convert<float>(src[p]);
      }
      for (std::int64_t p = 0; p < kc; ++p) {
        for (std::int64_t jj = cols; jj < gemm_nr; ++jj) out[p * gemm_nr + jj] = 0.0f;
      }
    }
  }
}

/// C[0:mr, 0:nr] += alpha * Ap(MR x kc) * Bp(kc x NR), from packed slivers.
inline void micro_kernel(std::int64_t kc, const float* ap, const float* bp, float alpha, float* c,
                         std::int64_t ldc, int mr, int nr) {
  gemm_vec acc[gemm_mr][2];
  for (auto& row : acc) row[0] = row[1] = gemm_vec{};
  for (std::int64_t p = 0; p < kc; ++p) {
    const gemm_vec b0 = load_vec(bp + p * gemm_nr);
    const gemm_vec b1 = load_vec(bp + p * gemm_nr + gemm_vw);
    const float* a = ap + p * gemm_mr;
    for (int i = 0; i < gemm_mr; ++i) {
      acc[i][0] += a[i] * b0;
      acc[i][1] += a[i] * b1;
    }
  }
  if (mr == gemm_mr && nr == gemm_nr) {
    for (int i = 0; i < gemm_mr; ++i) {
      float* row = c + i * ldc;
      store_vec(row, load_vec(row) + alpha * acc[i][0]);
      store_vec(row + gemm_vw, load_vec(row + gemm_vw) + alpha * acc[i][1]);
    }
  } else {
    float tile[gemm_mr][gemm_nr];
    for (int i = 0; i < gemm_mr; ++i) {
      store_vec(tile[i], acc[i][0]);
      store_vec(tile[i] + gemm_vw, acc[i][1]);
    }
    for (int i = 0; i < mr; ++i) {
      for (int j = 0; j < nr; ++j) c[i * ldc + j] += alpha * tile[i][j];
    }
  }
}

template <class T>
void gemm_builtin_f32c(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       float alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                       float* c, std::int64_t ldc) {
  thread_local std::vector<float> a_pack;
  thread_local std::vector<float> b_pack;
  a_pack.resize(static_cast<std::size_t>(gemm_mc * gemm_kc));
  b_pack.resize(static_cast<std::size_t>(gemm_nc * gemm_kc));
  for (std::int64_t jc = 0; jc < n; jc += gemm_nc) {
    const std::int64_t nc = std::min(gemm_nc, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += gemm_kc) {
      const std::int64_t kc = std::min(gemm_kc, k - pc);
      pack_b(tb, b, ldb, pc, jc, kc, nc, b_pack.data());
      for (std::int64_t ic = 0; ic < m; ic += gemm_mc) {
        const std::int64_t mc = std::min(gemm_mc, m - ic);
        pack_a(ta, a, lda, ic, pc, mc, kc, a_pack.data());
        for (std::int64_t jr = 0; jr < nc; jr += gemm_nr) {
          const int nr = static_cast<int>(std::min<std::int64_t>(gemm_nr, nc - jr));
          for (std::int64_t ir = 0; ir < mc; ir += gemm_mr) {
            const int mr = static_cast<int>(std::min<std::int64_t>(gemm_mr, mc - ir));
            micro_kernel(kc, a_pack.data() + ir * kc, b_pack.data() + jr * kc, alpha,
                         c + (ic + ir) * ldc + jc + jr, ldc, mr, nr);
          }
        }
      }
    }
  }
}

/// Runs `body(float* c, ldc)` on fp32 storage for C: C itself when it is fp32, else a
/// thread-local fp32 copy (holding beta * C) that is converted back afterwards.
template <class TC, class Body>
void with_float_c(std::int64_t m, std::int64_t n, float beta, TC* c, std::int64_t ldc,
                  Body&& body) {
  if constexpr (std::is_same_v<TC, float>) {
    scale_c(m, n, beta, c, ldc);
    body(c, ldc);
  } else {
    thread_local std::vector<float> cf;
    cf.resize(static_cast<std::size_t>(m * n));
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        cf[i * n + j] = beta == 0.0f ? 0.0f : beta * convert<float>(c[i * ldc + j]);
      }
    }
    body(cf.data(), n);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = convert<TC>(cf[i * n + j]);
    }
  }
}

/// The built-in blocked GEMM (always available).
template <floating_dtype T, floating_dtype TC>
requires fourway::detail::gemm_output<T, TC>
void gemm_builtin(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const T* a, std::int64_t lda, const T* b, std::int64_t ldb, float beta, TC* c,
                  std::int64_t ldc) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  with_float_c(m, n, beta, c, ldc, [&](float* cf, std::int64_t ldcf) {
    if (k > 0 && alpha != 0.0f) gemm_builtin_f32c(ta, tb, m, n, k, alpha, a, lda, b, ldb, cf, ldcf);
  });
}

#if FOURWAY_HAS_CBLAS
inline void blas_single_thread_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);
  });
}

/// CBLAS sgemm; 16-bit operands are converted into thread-local fp32 copies first.
template <floating_dtype T, floating_dtype TC>
requires fourway::detail::gemm_output<T, TC>
void gemm_blas(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const T* a, std::int64_t lda, const T* b, std::int64_t ldb, float beta, TC* c,
               std::int64_t ldc) {
  fourway::detail::check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  blas_single_thread_once();
  const auto op = [](Trans t) { return t == Trans::none ? CblasNoTrans : CblasTrans; };
  const float* af = nullptr;
  const float* bf = nullptr;
  thread_local std::vector<float> a_copy;
  thread_local std::vector<float> b_copy;
  if constexpr (std::is_same_v<T, float>) {
    af = a;
    bf = b;
  } else {
    const std::int64_t ar = fourway::detail::stored_rows(ta, m, k);
    const std::int64_t ac = fourway::detail::stored_cols(ta, m, k);
    const std::int64_t br = fourway::detail::stored_rows(tb, k, n);
    const std::int64_t bc = fourway::detail::stored_cols(tb, k, n);
    a_copy.resize(static_cast<std::size_t>(ar * ac));
    b_copy.resize(static_cast<std::size_t>(br * bc));
    to_float_block(a, ar, ac, lda, a_copy.data());
    to_float_block(b, br, bc, ldb, b_copy.data());
    af = a_copy.data();
    bf = b_copy.data();
    lda = std::max<std::int64_t>(1, ac);
    ldb = std::max<std::int64_t>(1, bc);
  }
  if constexpr (std::is_same_v<TC, float>) {
    cblas_sgemm(CblasRowMajor, op(ta), op(tb), static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), alpha, af, static_cast<blasint>(lda), bf,
                static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
  } else {
    with_float_c(m, n, beta, c, ldc, [&](float* cf, std::int64_t ldcf) {
      cblas_sgemm(CblasRowMajor, op(ta), op(tb), static_cast<blasint>(m), static_cast<blasint>(n),
                  static_cast<blasint>(k), alpha, af, static_cast<blasint>(lda), bf,
                  static_cast<blasint>(ldb), 1.0f, cf, static_cast<blasint>(ldcf));
    });
  }
}
#endif

}  // namespace detail

/// C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C, row-major; fp32 accumulation.
template <floating_dtype T, floating_dtype TC>
requires fourway::detail::gemm_output<T, TC>
void gemm(const Context<Host>& /*ctx*/, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
          float beta, TC* c, std::int64_t ldc) {
#if FOURWAY_HAS_CBLAS
  detail::gemm_blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  detail::gemm_builtin(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

/// `batch` independent GEMMs; matrix i starts at A + i*stride_a, B + i*stride_b, C + i*stride_c.
template <floating_dtype T, floating_dtype TC>
requires fourway::detail::gemm_output<T, TC>
void gemm_strided_batched(const Context<Host>& ctx, Trans ta, Trans tb, std::int64_t m,
                          std::int64_t n, std::int64_t k, float alpha, const T* a, std::int64_t lda,
                          std::int64_t stride_a, const T* b, std::int64_t ldb,
                          std::int64_t stride_b, float beta, TC* c, std::int64_t ldc,
                          std::int64_t stride_c, std::int64_t batch) {
  check<ShapeError>(batch >= 0, "fourway: gemm_strided_batched batch=", batch, " must be >= 0");
  for (std::int64_t i = 0; i < batch; ++i) {
    gemm(ctx, ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
         c + i * stride_c, ldc);
  }
}

}  // namespace fourway::host
