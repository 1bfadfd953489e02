//! `Parameter<T, B>`: one named trainable tensor of a layer — weight, gradient, and whether
//! weight decay applies — plus the deterministic initialisation the layers use.
//!
//! Invariant: layers read `weight.data()` and `grad.data()` at every call and never keep the
//! pointers, so a parallel wrapper may rebind either to a view into a flat, sharded or gathered
//! buffer (ZeRO-3 frees the layer's own storage this way). Gradients accumulate (`+=`).
//! Initial values depend only on (seed, parameter name), never on construction order or rank:
//! every mesh that builds the same model starts from the same numbers.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

template <class T, backend B>
struct Parameter {
  std::string name;  // Hugging Face GPT-2 names in the GPT: "h.0.attn.c_attn.weight"
  Tensor<T, B> weight;
  Tensor<T, B> grad;   // same shape as weight
  bool decay = false;  // weight decay applies (2-D tensors: matrices and embeddings)

  Parameter() = default;
  /// Allocates weight (MemTag::weights) and a zeroed gradient (MemTag::grads) of `shape`.
  Parameter(const Context<B>& ctx, std::string param_name, Shape shape)
      : name(std::move(param_name)),
        weight(shape, MemTag::weights, ctx.memory()),
        grad(shape, MemTag::grads, ctx.memory()),
        decay(shape.rank() == 2) {
    Ops<B>::fill(ctx, grad.data(), grad.numel(), convert<T>(0.0f));
  }

  [[nodiscard]] std::int64_t numel() const { return weight.numel(); }
};

/// Sets every gradient of `model` (anything with `visit_parameters`) to zero.
template <class Model, class B>
void zero_grad(const Context<B>& ctx, Model& model) {
  model.visit_parameters([&](auto& p) {
    using T = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
    Ops<B>::fill(ctx, p.grad.data(), p.grad.numel(), convert<T>(0.0f));
  });
}

/// How a layer initialises its parameters: GPT-2 / nanoGPT (Radford et al. 2019; normal with
/// std 0.02, residual output projections 0.02/sqrt(2 * layers), biases 0, LayerNorm gain 1).
struct Init {
  std::uint64_t seed = 0;
  float std = 0.02f;
  float residual_std = 0.02f;  // c_proj weights of attention and MLP
  /// GPT-2's init for a model of `layers` blocks.
  static Init gpt2(std::uint64_t seed, int layers) {
    return Init{seed, 0.02f, 0.02f / std::sqrt(2.0f * static_cast<float>(layers))};
  }
};

namespace detail {
/// SplitMix64 (Steele, Lea & Flood 2014): a counter-based stream, one per parameter name.
class InitStream {
 public:
  InitStream(std::uint64_t seed, std::string_view name) : state_(seed ^ 0x9e3779b97f4a7c15ull) {
    for (char c : name) state_ = (state_ ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1), 53 bits.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  /// Standard normal by Box-Muller, in double so the result is the same on every platform.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double a = 6.283185307179586 * uniform();
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

template <class T, class B>
void upload(const Context<B>& ctx, Tensor<T, B>& dst, const std::vector<float>& values) {
  std::vector<T> conv(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) conv[i] = convert<T>(values[i]);
  Ops<B>::from_host(ctx, dst.data(), conv.data(), dst.numel());
}
}  // namespace detail

/// weight = normal(0, std) from the stream of (seed, p.name).
template <class T, class B>
void init_normal(const Context<B>& ctx, Parameter<T, B>& p, std::uint64_t seed, float std) {
  detail::InitStream rng(seed, p.name);
  std::vector<float> v(static_cast<std::size_t>(p.numel()));
  for (auto& x : v) x = static_cast<float>(std * rng.normal());
  detail::upload(ctx, p.weight, v);
}

/// weight = value everywhere.
template <class T, class B>
void init_constant(const Context<B>& ctx, Parameter<T, B>& p, float value) {
  Ops<B>::fill(ctx, p.weight.data(), p.numel(), convert<T>(value));
}

}  // namespace fourway
