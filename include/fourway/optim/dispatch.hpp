//! Backend dispatch of the precision and optimizer kernels (cast, scale, has_inf_nan, sum_squares,
//! adamw_update): `detail::optim_ops<B>` forwards to the `fourway::host` or `fourway::cuda` kernel
//! of the same name (docs/contracts.md, kernels table); fill, copy, to_host and from_host too, so
//! a strategy can name one kernel set. The layer kernels go through `Ops<B>` (layers/ops.hpp).
//!
//! The CUDA specialisation exists only when nvcc compiles the translation unit, so a `.hpp` that
//! uses it still compiles with any C++20 compiler for the host backend.
#pragma once

#include <cstdint>
#include <utility>

#include "fourway/backend/host/adamw.hpp"
#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/elementwise.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include "fourway/backend/cuda/adamw.cuh"
#include "fourway/backend/cuda/backend.cuh"
#include "fourway/backend/cuda/elementwise.cuh"
#endif

namespace fourway::detail {

template <class B>
struct optim_ops;

template <>
struct optim_ops<Host> {
  template <class... A>
  static void fill(A&&... a) { host::fill(std::forward<A>(a)...); }
  template <class... A>
  static void copy(A&&... a) { host::copy(std::forward<A>(a)...); }
  template <class... A>
  static void from_host(A&&... a) { host::from_host(std::forward<A>(a)...); }
  template <class... A>
  static void to_host(A&&... a) { host::to_host(std::forward<A>(a)...); }
  template <class... A>
  static void cast(A&&... a) { host::cast(std::forward<A>(a)...); }
  template <class... A>
  static void scale(A&&... a) { host::scale(std::forward<A>(a)...); }
  template <class... A>
  static bool has_inf_nan(A&&... a) { return host::has_inf_nan(std::forward<A>(a)...); }
  template <class... A>
  static double sum_squares(A&&... a) { return host::sum_squares(std::forward<A>(a)...); }
  template <class... A>
  static void adamw_update(A&&... a) { host::adamw_update(std::forward<A>(a)...); }
};

#if defined(FOURWAY_CUDA_COMPILATION)
template <>
struct optim_ops<Cuda> {
  template <class... A>
  static void fill(A&&... a) { cuda::fill(std::forward<A>(a)...); }
  template <class... A>
  static void copy(A&&... a) { cuda::copy(std::forward<A>(a)...); }
  template <class... A>
  static void from_host(A&&... a) { cuda::from_host(std::forward<A>(a)...); }
  template <class... A>
  static void to_host(A&&... a) { cuda::to_host(std::forward<A>(a)...); }
  template <class... A>
  static void cast(A&&... a) { cuda::cast(std::forward<A>(a)...); }
  template <class... A>
  static void scale(A&&... a) { cuda::scale(std::forward<A>(a)...); }
  template <class... A>
  static bool has_inf_nan(A&&... a) { return cuda::has_inf_nan(std::forward<A>(a)...); }
  template <class... A>
  static double sum_squares(A&&... a) { return cuda::sum_squares(std::forward<A>(a)...); }
  template <class... A>
  static void adamw_update(A&&... a) { cuda::adamw_update(std::forward<A>(a)...); }
};
#endif

}  // namespace fourway::detail
