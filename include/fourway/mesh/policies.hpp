//! Policy tags: the axes a `Mesh<Policies...>` is made of, each a small type carrying its degree.
//!
//! A policy only names an axis and its degree here; how it transforms a layer lives in
//! `parallel/`. Degrees are compile-time integers or `fw::dynamic` (given at run time, checked
//! before any communicator exists). DataParallel and Sharded<S> take whatever the world leaves:
//! `dp = world / (tp * cp * pp)`.
//!
//!     axis   policy                         degree            innermost first (Megatron's order)
//!     tp     TensorParallel<N>              N | dynamic       ranks 0..tp-1 share a node (NVLink)
//!     cp     ContextParallel<N>             N | dynamic       each rank holds T/N of a sequence
//!     pp     Pipeline<S, M, Schedule>       S | dynamic
//!     dp     DataParallel | Sharded<1|2|3>  world/(tp*cp*pp)  outermost
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "fourway/config.hpp"

namespace fourway {

/// The logical axes of every mesh, innermost first. A mesh without a policy for an axis has
/// degree 1 on it (one rank is the degenerate mesh, never a separate code path).
enum class Axis : std::uint8_t { tp = 0, cp = 1, pp = 2, dp = 3 };

/// One row per axis, in `Axis` order: its short name, the policy that owns it, and whether
/// descriptions of a mesh name it when its degree is 1 (tp, pp and dp always; cp, added later,
/// only where a mesh uses it, so meshes without it read as they always did).
struct AxisInfo {
  Axis axis;
  std::string_view name;
  std::string_view policy;
  bool named_at_one = true;
};

/// The list of axes. Every loop over a mesh's axes (degrees, coordinates, ranks, groups, names)
/// runs over this table, so adding an axis (context or expert parallelism) is an enumerator and a
/// row here, plus its named field in `Coord` and `MeshDegrees` (mesh/mesh.hpp).
inline constexpr std::array<AxisInfo, 4> axis_table{{
    {Axis::tp, "tp", "TensorParallel"},
    {Axis::cp, "cp", "ContextParallel", false},
    {Axis::pp, "pp", "Pipeline"},
    {Axis::dp, "dp", "DataParallel"},
}};
inline constexpr int axis_count = static_cast<int>(axis_table.size());
static_assert(
    [] {
      for (int i = 0; i < axis_count; ++i) {
        if (static_cast<int>(axis_table[static_cast<std::size_t>(i)].axis) != i) return false;
      }
      return true;
    }(),
    "fourway: axis_table lists every Axis once, in enumerator order");

/// Every axis, innermost first.
inline constexpr std::array<Axis, axis_count> all_axes = [] {
  std::array<Axis, axis_count> out{};
  for (int i = 0; i < axis_count; ++i)
    out[static_cast<std::size_t>(i)] = axis_table[static_cast<std::size_t>(i)].axis;
  return out;
}();

/// The axis whose degree is not given but derived: what the world leaves, world / (product of
/// the others). Its policy (DataParallel or Sharded<S>) takes any number of ranks.
inline constexpr Axis derived_axis = Axis::dp;

constexpr std::string_view axis_name(Axis a) {
  const auto i = static_cast<std::size_t>(a);
  return i < axis_table.size() ? axis_table[i].name : std::string_view{"?"};
}
/// Whether descriptions name axis `a` at `degree` (mesh/mesh.hpp's `describe`, group names).
constexpr bool axis_named(Axis a, int degree) {
  const auto i = static_cast<std::size_t>(a);
  return degree != 1 || (i < axis_table.size() && axis_table[i].named_at_one);
}
/// The policy that owns axis `a`, e.g. "TensorParallel" (for messages).
constexpr std::string_view axis_policy(Axis a) {
  const auto i = static_cast<std::size_t>(a);
  return i < axis_table.size() ? axis_table[i].policy : std::string_view{"?"};
}

// ---- pipeline schedules -------------------------------------------------------------------------

/// All forwards of all micro-batches, then all backwards (Huang et al., GPipe, 2019).
struct GPipe {
  static constexpr std::string_view name = "GPipe";
};
/// One forward, one backward: stage s warms up with `stages - s - 1` forwards, then alternates
/// (Narayanan et al., PipeDream-Flush, 2021).
struct OneFOneB {
  static constexpr std::string_view name = "1F1B";
};

template <class S>
concept pipeline_schedule = std::same_as<S, GPipe> || std::same_as<S, OneFOneB>;

// ---- the policies -------------------------------------------------------------------------------

/// What a data-parallel policy shards over its group, read from a ZeRO stage: 1 shards the
/// optimizer state (fp32 masters and moments), 2 also the gradients, 3 also the parameters.
/// The one place a stage number becomes these properties; `DataParallel` and `Sharded<S>` carry
/// them as `shards_*` members, and code that holds a stage only at run time (the planner, the
/// parameter layout) asks `zero_sharding(stage)`.
struct ZeroSharding {
  bool shards_optimizer_state = false;
  bool shards_grads = false;
  bool shards_params = false;
};
constexpr ZeroSharding zero_sharding(int stage) {
  return ZeroSharding{stage >= 1, stage >= 2, stage >= 3};
}

/// Replicas of the whole model; gradients all-reduced (bucketed, overlapped with backward).
struct DataParallel {
  static constexpr Axis axis = Axis::dp;
  static constexpr int degree = dynamic;
  static constexpr int stage = 0;  // ZeRO stage 0: nothing sharded
  static constexpr bool shards_optimizer_state = zero_sharding(stage).shards_optimizer_state;
  static constexpr bool shards_grads = zero_sharding(stage).shards_grads;
  static constexpr bool shards_params = zero_sharding(stage).shards_params;
  static constexpr std::string_view name = "DataParallel";
};

/// ZeRO / FSDP over the data-parallel axis: Stage 1 shards optimizer state, 2 also gradients
/// (reduce-scatter), 3 also parameters (all-gathered just in time). Rajbhandari et al., 2020.
template <int Stage>
struct Sharded {
  static_assert(Stage >= 1 && Stage <= 3,
                "fourway: Sharded<Stage> needs Stage 1 (optimizer state), 2 (+ gradients) or 3 "
                "(+ parameters); for plain replicas use fw::DataParallel");
  static constexpr Axis axis = Axis::dp;
  static constexpr int degree = dynamic;
  static constexpr int stage = Stage;
  static constexpr bool shards_optimizer_state = zero_sharding(Stage).shards_optimizer_state;
  static constexpr bool shards_grads = zero_sharding(Stage).shards_grads;
  static constexpr bool shards_params = zero_sharding(Stage).shards_params;
  static constexpr std::string_view name = "Sharded";
};

/// Megatron tensor parallelism over N ranks (column/row pairs, heads split, vocab-parallel).
template <int N>
struct TensorParallel {
  static_assert(N >= 1 || N == dynamic,
                "fourway: TensorParallel<N> needs N >= 1, or fw::dynamic to give it at run time");
  static constexpr Axis axis = Axis::tp;
  static constexpr int degree = N;
  static constexpr std::string_view name = "TensorParallel";
};

/// Context parallelism over N ranks: every sequence is split over the group, rank r holding
/// chunks r and 2N−1−r of 2N (load-balanced for the causal mask), and attention passes keys and
/// values around the ring (parallel/cp/, docs/context-parallel.md). A context rank is a
/// data-parallel replica over the sequence: parameters' gradients reduce (and ZeRO shards) over
/// cp × dp.
template <int N>
struct ContextParallel {
  static_assert(N >= 1 || N == dynamic,
                "fourway: ContextParallel<N> needs N >= 1, or fw::dynamic to give it at run time");
  static constexpr Axis axis = Axis::cp;
  static constexpr int degree = N;
  static constexpr std::string_view name = "ContextParallel";
};

/// A pipeline of `Stages` stages running `MicroBatches` micro-batches per step under `Schedule`.
template <int Stages, int MicroBatches, class Schedule = OneFOneB>
struct Pipeline {
  static_assert(Stages >= 1 || Stages == dynamic,
                "fourway: Pipeline<Stages, MicroBatches> needs Stages >= 1, or fw::dynamic");
  static_assert(MicroBatches >= 1 || MicroBatches == dynamic,
                "fourway: Pipeline<Stages, MicroBatches> needs MicroBatches >= 1, or fw::dynamic");
  static_assert(pipeline_schedule<Schedule>,
                "fourway: Pipeline<Stages, MicroBatches, Schedule> needs Schedule = fw::GPipe or "
                "fw::OneFOneB");
  static_assert(!std::is_same_v<Schedule, OneFOneB> || Stages == dynamic ||
                    MicroBatches == dynamic || MicroBatches >= Stages,
                "fourway: Pipeline<Stages, MicroBatches> needs MicroBatches >= Stages for 1F1B; "
                "raise MicroBatches or use GPipe");
  static constexpr Axis axis = Axis::pp;
  static constexpr int degree = Stages;
  static constexpr int stages = Stages;
  static constexpr int micro_batches = MicroBatches;
  using schedule = Schedule;
  static constexpr std::string_view name = "Pipeline";
};

// ---- traits -------------------------------------------------------------------------------------

template <class P>
struct is_policy : std::false_type {};
template <>
struct is_policy<DataParallel> : std::true_type {};
template <int S>
struct is_policy<Sharded<S>> : std::true_type {};
template <int N>
struct is_policy<TensorParallel<N>> : std::true_type {};
template <int N>
struct is_policy<ContextParallel<N>> : std::true_type {};
template <int S, int M, class Sch>
struct is_policy<Pipeline<S, M, Sch>> : std::true_type {};

/// A policy tag: DataParallel, Sharded<S>, TensorParallel<N>, ContextParallel<N> or
/// Pipeline<S, M, Schedule>.
template <class P>
concept policy = is_policy<P>::value;

}  // namespace fourway
