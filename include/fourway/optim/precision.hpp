//! Mixed precision: the `Precision<T>` policy tag and the fp32 optimizer state it implies.
//!
//! `Precision<T>` says in which type the model keeps its weights, activations and gradients
//! (fp32, bf16 or fp16). The optimizer always works in fp32: `MasterState` holds, for a list of
//! contiguous segments of parameters, fp32 master weights (only when `T` is not float) and the two
//! Adam moments. Model state per parameter, as the accountant measures it (K = 12 of ZeRO):
//!
//!   Precision<bf16|fp16>: weights 2 + grads 2 + master_weights 4 + optimizer_state 8 = 16 B
//!   Precision<fp32>:      weights 4 + grads 4 +                  optimizer_state 8 = 16 B
//!
//! In fp32 the working weights *are* the master weights: no separate copy is allocated, and the
//! optimizer updates the model's weights in place. The state is a flat range of elements cut into
//! segments, so a sharded strategy (ZeRO) can hold the state of any slice of the flattened
//! parameters with the same type; a one-rank strategy has one segment per parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/ops.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

/// The precision policy tag: weights, activations and gradients in `T`; optimizer in fp32.
template <class T>
struct Precision {
  static_assert(floating_dtype<T>,
                "fourway: Precision<T> needs T = float (fw::fp32), fw::bf16 or fw::fp16");
  using param_type = T;
  /// A separate fp32 copy of the weights exists only when the working weights are 16-bit.
  static constexpr bool keeps_master = !std::is_same_v<T, float>;
  /// fp16 has too little range for raw gradients; its loss is scaled dynamically.
  static constexpr bool loss_scaling = std::is_same_v<T, fp16>;
  /// Model-state bytes per parameter: weights + grads (+ master) + two fp32 moments.
  static constexpr std::size_t bytes_per_param =
      2 * sizeof(T) + (keeps_master ? sizeof(float) : 0) + 2 * sizeof(float);
};

template <class P>
struct is_precision : std::false_type {};
template <class T>
struct is_precision<Precision<T>> : std::true_type {};
template <class P>
concept precision_policy = is_precision<P>::value;

static_assert(Precision<bf16>::bytes_per_param == 16 && Precision<fp16>::bytes_per_param == 16 &&
              Precision<float>::bytes_per_param == 16);

/// One contiguous run of optimizer elements: `numel` elements stored from `offset` in the flat
/// state, belonging to a parameter that takes weight decay when `decay` is set.
struct StateSegment {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  bool decay = false;
};

/// fp32 master weights (for 16-bit `T`) and Adam moments of a flat range of parameter elements.
///
/// Memory tags: masters under `MemTag::master_weights`, moments under `MemTag::optimizer_state`.
/// `step()` is the number of optimizer updates applied so far (PyTorch's `state['step']`).
template <floating_dtype T, backend B>
class MasterState {
 public:
  static constexpr bool keeps_master = !std::is_same_v<T, float>;

  /// Segments must be laid out back to back from offset 0 (checked). Moments start at zero;
  /// masters are uninitialised until `init_master` is called for each segment.
  MasterState(const Context<B>& ctx, std::vector<StateSegment> segments)
      : segments_(std::move(segments)) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      check<ConfigError>(
          segments_[i].offset == n && segments_[i].numel >= 0, "fourway: optimizer state segment ",
          i, " starts at ", segments_[i].offset, " with ", segments_[i].numel,
          " elements; segments must be back to back from 0 (expected offset ", n, ")");
      n += segments_[i].numel;
    }
    numel_ = n;
    auto& mem = ctx.memory();
    if constexpr (keeps_master) master_ = Tensor<float, B>({n}, MemTag::master_weights, mem);
    m_ = Tensor<float, B>({n}, MemTag::optimizer_state, mem);
    v_ = Tensor<float, B>({n}, MemTag::optimizer_state, mem);
    Ops<B>::fill(ctx, m_.data(), n, 0.0f);
    Ops<B>::fill(ctx, v_.data(), n, 0.0f);
  }

  /// Copies (widens) the working weights of segment `i` into its fp32 master; no-op in fp32.
  void init_master(const Context<B>& ctx, std::size_t i, const T* working) {
    if constexpr (keeps_master) {
      Ops<B>::cast(ctx, master_.data() + segments_.at(i).offset, working, segments_.at(i).numel);
    } else {
      (void)ctx, (void)i, (void)working;
    }
  }

  [[nodiscard]] std::span<const StateSegment> segments() const { return segments_; }
  [[nodiscard]] std::int64_t numel() const { return numel_; }
  /// fp32 master elements of segment `i`, or nullptr in fp32 (the working weights are masters).
  [[nodiscard]] float* master(std::size_t i) const {
    if constexpr (keeps_master) return master_.data() + segments_.at(i).offset;
    return nullptr;
  }
  [[nodiscard]] float* m(std::size_t i) const { return m_.data() + segments_.at(i).offset; }
  [[nodiscard]] float* v(std::size_t i) const { return v_.data() + segments_.at(i).offset; }
  /// The whole flat buffers (for checkpoints and tests). `masters()` is empty in fp32.
  [[nodiscard]] const Tensor<float, B>& masters() const { return master_; }
  [[nodiscard]] const Tensor<float, B>& first_moments() const { return m_; }
  [[nodiscard]] const Tensor<float, B>& second_moments() const { return v_; }

  [[nodiscard]] int step() const { return step_; }
  /// Called by the optimizer after each applied (not skipped) update.
  void advance() { ++step_; }
  /// Sets the update count when optimizer state is restored from a checkpoint.
  void restore_step(int step) {
    check<CheckpointError>(step >= 0, "fourway: a checkpoint's Adam step must be >= 0, got ", step);
    step_ = step;
  }

 private:
  std::vector<StateSegment> segments_;
  std::int64_t numel_ = 0;
  Tensor<float, B> master_;
  Tensor<float, B> m_;
  Tensor<float, B> v_;
  int step_ = 0;
};

}  // namespace fourway
