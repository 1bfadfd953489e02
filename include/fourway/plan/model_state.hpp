//! Model-state bytes per GPU: weights, gradients, fp32 master weights and optimizer state under
//! plain data parallelism and ZeRO stages 1, 2 and 3 (Rajbhandari et al. 2020, "ZeRO: Memory
//! Optimizations Toward Training Trillion Parameter Models", §5.1 and Figure 1).
//!
//! Two forms. `zero_paper_bytes` is the paper's real-valued formula (fp16 weights and gradients,
//! K bytes of optimizer state per parameter, Ψ/N exact): 16Ψ → 4Ψ + KΨ/N → 2Ψ + (2+K)Ψ/N →
//! (4+K)Ψ/N. `model_state_bytes` is the integer count a runtime allocates: a sharded buffer holds
//! `shard_elements(Ψ, N, padding)` elements, i.e. the flat count (or each unit's count) rounded
//! up to a multiple of the group size N before it is split — so the planner can equal the memory
//! accountant byte for byte. Everything here is constexpr; bad input throws `ConfigError`.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "fourway/core/error.hpp"
#include "fourway/mesh/policies.hpp"

namespace fourway::plan {

namespace detail {
/// `fourway::check<ConfigError>` usable in constant expressions: throws only when `cond` fails,
/// so a passing check is a constant expression and a failing one in a `static_assert` is an error.
template <class... Ts>
constexpr void require(bool cond, const Ts&... parts) {
  if (!cond) throw ConfigError(fourway::detail::cat(parts...));
}
}  // namespace detail

/// The training precision: fp32 throughout, or mixed (16-bit weights, activations and gradients,
/// fp32 master weights and optimizer state).
enum class Precision : std::uint8_t { fp32, bf16, fp16 };

constexpr std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

/// Bytes of one element of the working copy: weights, activations and gradients.
constexpr std::int64_t working_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

/// Mixed precision keeps an fp32 master copy of the weights; fp32 training updates in place.
constexpr std::int64_t master_bytes(Precision p) { return p == Precision::fp32 ? 0 : 4; }

/// Bytes of optimizer state per parameter, besides the master copy. Adam / AdamW: the first and
/// second moments in fp32, 8 B. SGD with momentum: 4 B; plain SGD: 0.
struct Optimizer {
  std::int64_t state_bytes_per_param = 8;

  static constexpr Optimizer adam() { return Optimizer{8}; }
  /// The ZeRO paper's K: master weights plus optimizer state, bytes per parameter (Adam in mixed
  /// precision: 4 + 4 + 4 = 12).
  [[nodiscard]] constexpr std::int64_t k(Precision p) const {
    return master_bytes(p) + state_bytes_per_param;
  }
};

/// ZeRO stage: 0 = plain data parallelism (every rank holds everything), 1 = optimizer state
/// (master weights and moments) sharded, 2 = + gradients, 3 = + parameters (FSDP).
constexpr void check_zero_stage(int stage) {
  detail::require(stage >= 0 && stage <= 3, "fourway: ZeRO stage ", stage,
                  " does not exist; use 0 (data parallel), 1, 2 or 3");
}

/// How a runtime rounds the count it shards across N ranks.
///   exact     Ψ must divide by N (no padding); any other Ψ is a ConfigError.
///   flat      the whole flat buffer is padded to a multiple of N: ceil(Ψ/N) per rank.
///   per_unit  each unit (FSDP unit: embedding, a block, ...) is padded separately:
///             Σ_u ceil(Ψ_u/N) per rank. The units must sum to Ψ.
struct Padding {
  enum class Kind : std::uint8_t { exact, flat, per_unit };
  Kind kind = Kind::flat;
  std::span<const std::int64_t> units{};

  static constexpr Padding exact() { return Padding{Kind::exact, {}}; }
  static constexpr Padding flat() { return Padding{Kind::flat, {}}; }
  static constexpr Padding per_unit(std::span<const std::int64_t> u) {
    return Padding{Kind::per_unit, u};
  }
};

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// Elements of one rank's shard of `params` elements split over `n` ranks.
constexpr std::int64_t shard_elements(std::int64_t params, int n,
                                      Padding padding = Padding::flat()) {
  detail::require(params >= 0, "fourway: parameter count ", params, " is negative");
  detail::require(n >= 1, "fourway: cannot shard over ", n, " ranks; the group needs >= 1");
  switch (padding.kind) {
    case Padding::Kind::exact:
      detail::require(params % n == 0, "fourway: ", params, " parameters do not divide by ", n,
                      " ranks; pad them (Padding::flat) or choose a divisor");
      return params / n;
    case Padding::Kind::flat: return ceil_div(params, n);
    case Padding::Kind::per_unit: {
      std::int64_t sum = 0;
      std::int64_t shard = 0;
      for (std::int64_t u : padding.units) {
        detail::require(u >= 0, "fourway: unit of ", u, " parameters is negative");
        sum += u;
        shard += ceil_div(u, n);
      }
      detail::require(sum == params, "fourway: the units hold ", sum,
                      " parameters but the model has ", params);
      return shard;
    }
  }
  return 0;
}

/// Model-state bytes of one rank, by the memory accountant's tags.
struct ModelStateBytes {
  std::int64_t weights = 0;          // MemTag::weights
  std::int64_t grads = 0;            // MemTag::grads
  std::int64_t master_weights = 0;   // MemTag::master_weights
  std::int64_t optimizer_state = 0;  // MemTag::optimizer_state
  [[nodiscard]] constexpr std::int64_t total() const {
    return weights + grads + master_weights + optimizer_state;
  }
  constexpr bool operator==(const ModelStateBytes&) const = default;
};

/// Model-state bytes of one rank that holds `params` parameters (already divided by tensor and
/// pipeline parallelism) in a data-parallel group of `dp` ranks under ZeRO `zero_stage`.
/// What is sharded holds `shard_elements(params, dp, padding)` elements; what is replicated
/// holds the whole padded flat buffer, `dp` shards (the padding is allocated and counted like any
/// other element, parallel/dp/flat_layout.hpp) — `params` itself under stage 0, which shards
/// nothing.
constexpr ModelStateBytes model_state_bytes(std::int64_t params, Precision precision,
                                            int zero_stage, int dp,
                                            Padding padding = Padding::flat(),
                                            Optimizer optimizer = Optimizer::adam()) {
  check_zero_stage(zero_stage);
  detail::require(dp >= 1, "fourway: data-parallel degree ", dp, " must be >= 1");
  detail::require(optimizer.state_bytes_per_param >= 0,
                  "fourway: optimizer state bytes per parameter must be >= 0");
  const ZeroSharding z = zero_sharding(zero_stage);
  const std::int64_t shard = shard_elements(params, dp, padding);
  // Nothing sharded: no padding either.
  const std::int64_t full = z.shards_optimizer_state ? shard * dp : params;
  const std::int64_t w = working_bytes(precision);
  ModelStateBytes b;
  b.weights = (z.shards_params ? shard : full) * w;
  b.grads = (z.shards_grads ? shard : full) * w;
  b.master_weights = (z.shards_optimizer_state ? shard : full) * master_bytes(precision);
  b.optimizer_state = (z.shards_optimizer_state ? shard : full) * optimizer.state_bytes_per_param;
  return b;
}

/// The ZeRO paper's per-GPU model-state bytes (§5.1, Figure 1): fp16 weights and gradients, K
/// bytes per parameter of optimizer state (12 for mixed-precision Adam), Ψ/N real-valued.
constexpr double zero_paper_bytes(double psi, int zero_stage, double n, double k = 12.0) {
  check_zero_stage(zero_stage);
  detail::require(n >= 1.0, "fourway: data-parallel degree ", n, " must be >= 1");
  switch (zero_stage) {
    case 0: return (2.0 + 2.0 + k) * psi;
    case 1: return 2.0 * psi + 2.0 * psi + k * psi / n;
    case 2: return 2.0 * psi + (2.0 + k) * psi / n;
    default: return (2.0 + 2.0 + k) * psi / n;
  }
}

}  // namespace fourway::plan
