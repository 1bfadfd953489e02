//! Mesh<Policies...>: named, ordered axes and the constexpr rank <-> coordinate map.
//!
//! Every mesh has the four axes tp, cp, pp, dp (innermost first); an axis without a policy has
//! degree 1. The policies may be written in any order: the layout below is the axes', not the
//! list's (`Mesh<Sharded<1>, TensorParallel<2>>` places ranks as `Mesh<TensorParallel<2>,
//! Sharded<1>>` does). Ranks are laid out with tp fastest, so a tensor-parallel group is a run of
//! consecutive ranks (one node), then cp, then pp, then dp (the planner's order):
//!
//!     rank = tp + TP * (cp + CP * (pp + PP * dp))   e.g. TP=2, PP=2, DP=2 (8 ranks, CP=1):
//!                                                 dp=0: pp=0 [0 1]  pp=1 [2 3]
//!                                                 dp=1: pp=0 [4 5]  pp=1 [6 7]
//!
//! A group over a set of axes A (an `AxisSet`) holds the ranks that agree on every coordinate
//! outside A; inside it, ranks are ordered by their coordinates on A, innermost fastest. The
//! arithmetic is `constexpr FOURWAY_HOST_DEVICE` and never touches a communicator; `validate`
//! runs in the constructor, so a bad configuration fails before any group exists.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/mesh/policies.hpp"

namespace fourway {

/// Degrees given at run time. Each is needed exactly for a `fw::dynamic` axis of the type; `dp`
/// may be given to state an expectation (it is checked against world / (tp * cp * pp)).
struct MeshDegrees {
  int tp = dynamic;
  int cp = dynamic;
  int pp = dynamic;
  int dp = dynamic;
  /// The field of axis `a` (one case per field above).
  [[nodiscard]] constexpr int operator[](Axis a) const {
    switch (a) {
      case Axis::tp: return tp;
      case Axis::cp: return cp;
      case Axis::pp: return pp;
      case Axis::dp: return dp;
    }
    return dynamic;
  }
};

/// A set of axes, e.g. `AxisSet{Axis::tp, Axis::dp}`; bit i is axis i.
struct AxisSet {
  std::uint8_t bits = 0;
  constexpr AxisSet() = default;
  // Implicit on purpose: `groups.group(Axis::tp)` reads as a one-axis set.
  constexpr AxisSet(Axis a)  // NOLINT(google-explicit-constructor)
      : bits(static_cast<std::uint8_t>(1u << static_cast<int>(a))) {}
  constexpr AxisSet(Axis a, Axis b) : AxisSet(a) { bits |= AxisSet(b).bits; }
  constexpr AxisSet(Axis a, Axis b, Axis c) : AxisSet(a, b) { bits |= AxisSet(c).bits; }
  static constexpr AxisSet from_bits(std::uint8_t b) {
    AxisSet s;
    s.bits = b;
    return s;
  }
  /// Every axis: the group over the whole mesh.
  static constexpr AxisSet all() { return from_bits((1u << axis_count) - 1u); }
  /// Number of distinct non-empty sets (the groups a mesh can have): 2^axis_count - 1.
  static constexpr int nonempty_count = (1 << axis_count) - 1;
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr bool contains(Axis a) const {
    return (bits >> static_cast<int>(a)) & 1u;
  }
  friend constexpr bool operator==(AxisSet, AxisSet) = default;
};

/// A rank's position: one coordinate per axis.
struct Coord {
  int tp = 0;
  int cp = 0;
  int pp = 0;
  int dp = 0;
  /// The coordinate on axis `a`.
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int operator[](Axis a) const { return at(*this, a); }
  FOURWAY_HOST_DEVICE constexpr int& operator[](Axis a) { return at(*this, a); }
  friend constexpr bool operator==(const Coord&, const Coord&) = default;

 private:
  /// The field of axis `a` (one case per field above).
  template <class Self>
  FOURWAY_HOST_DEVICE static constexpr auto at(Self& self, Axis a) -> decltype((self.tp)) {
    switch (a) {
      case Axis::tp: return self.tp;
      case Axis::cp: return self.cp;
      case Axis::pp: return self.pp;
      case Axis::dp: break;
    }
    return self.dp;
  }
};

namespace detail {
/// A constexpr-friendly check: throws ConfigError (so `constexpr Mesh m(...)` of a bad
/// configuration fails to compile, and a run-time one throws).
template <class... Ts>
[[noreturn]] void mesh_fail(const Ts&... parts) {
  throw ConfigError(cat(parts...));
}
template <class... Ts>
constexpr void mesh_require(bool cond, const Ts&... parts) {
  if (!cond) mesh_fail(parts...);
}
template <class... Ps>
constexpr int policies_on(Axis a) {
  (void)a;  // unused for Mesh<>
  return ((Ps::axis == a ? 1 : 0) + ... + 0);
}
template <Axis A, class... Ps>
struct policy_on {
  using type = void;
};
template <Axis A, class P, class... Ps>
struct policy_on<A, P, Ps...> {
  using type = std::conditional_t<P::axis == A, P, typename policy_on<A, Ps...>::type>;
};
}  // namespace detail

template <class... Policies>
class Mesh {
  static_assert((policy<Policies> && ...),
                "fourway: Mesh<...> takes policy tags: fw::TensorParallel<N>, "
                "fw::ContextParallel<N>, fw::Pipeline<S, M>, fw::DataParallel or "
                "fw::Sharded<Stage>");
  static_assert(
      [] {
        for (Axis a : all_axes) {
          if (a != derived_axis && detail::policies_on<Policies...>(a) > 1) return false;
        }
        return true;
      }(),
      "fourway: Mesh<...> lists TensorParallel, ContextParallel and Pipeline at most once each");
  static_assert(detail::policies_on<Policies...>(derived_axis) <= 1,
                "fourway: Mesh<...> has more than one data-parallel policy; use one of "
                "fw::DataParallel or fw::Sharded<Stage> (Sharded replaces DataParallel)");

 public:
  /// The policy on axis `A`, or void when the mesh has none.
  template <Axis A>
  using policy_on = typename detail::policy_on<A, Policies...>::type;
  template <Axis A>
  static constexpr bool has_axis = !std::is_void_v<policy_on<A>>;

  /// The degree the type fixes on `a`: its policy's degree (maybe fw::dynamic), 1 if absent.
  static constexpr int static_degree(Axis a) {
    int d = 1;
    (void)a;  // unused for Mesh<>
    ((d = Policies::axis == a ? Policies::degree : d), ...);
    return d;
  }

  /// Validates and fixes the degrees for a world of `world_size` ranks (ConfigError otherwise):
  /// every axis but `derived_axis` from the type or `given`, then the derived one from the rest.
  explicit constexpr Mesh(int world_size, MeshDegrees given = {}) : world_(world_size) {
    detail::mesh_require(world_size >= 1, "fourway: a Mesh needs a world of at least 1 rank, got ",
                         world_size);
    int inner = 1;
    for (Axis a : all_axes) {
      if (a == derived_axis) continue;
      deg_[index(a)] = resolve(a, given[a]);
      inner *= deg_[index(a)];
    }
    const std::string_view d = axis_name(derived_axis);
    const int given_d = given[derived_axis];
    int& deg_d = deg_[index(derived_axis)];
    if constexpr (!has_axis<derived_axis>) {
      if (world_size != inner) {
        detail::mesh_fail("fourway: world size ", world_size, " is not ", inner_text(), " = ",
                          inner,
                          " and the Mesh has no data-parallel axis to take the rest; add "
                          "fw::DataParallel or fw::Sharded<Stage> to the Mesh, or run on ",
                          inner, " ranks");
      }
      detail::mesh_require(given_d == dynamic || given_d == 1, "fourway: MeshDegrees.", d, " = ",
                           given_d,
                           " but the Mesh has no data-parallel axis; add "
                           "fw::DataParallel or fw::Sharded<Stage>");
      deg_d = 1;
    } else {
      if (world_size % inner != 0) {
        detail::mesh_fail("fourway: world size ", world_size, " does not divide by ", inner_text(),
                          " = ", inner, "; run on a multiple of ", inner,
                          " ranks or change the degrees");
      }
      deg_d = world_size / inner;
      if (given_d != dynamic && given_d != deg_d) {
        detail::mesh_fail("fourway: MeshDegrees.", d, " = ", given_d, " but world size ",
                          world_size, " / (", inner_text(), ") leaves ", d, " = ", deg_d,
                          "; drop .", d, " (it is derived) or change the world size");
      }
    }
  }

  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int size() const { return world_; }
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int degree(Axis a) const {
    return deg_[static_cast<int>(a)];
  }
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int tp() const { return degree(Axis::tp); }
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int cp() const { return degree(Axis::cp); }
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int pp() const { return degree(Axis::pp); }
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int dp() const { return degree(Axis::dp); }

  /// rank = tp + TP * (cp + CP * (pp + PP * dp)): coordinates innermost fastest.
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int rank_of(Coord c) const {
    int r = 0;
    for (int a = axis_count - 1; a >= 0; --a) r = c[static_cast<Axis>(a)] + deg_[a] * r;
    return r;
  }
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr Coord coord_of(int rank) const {
    Coord c;
    for (int a = 0; a < axis_count - 1; ++a) {
      c[static_cast<Axis>(a)] = rank % deg_[a];
      rank /= deg_[a];
    }
    c[static_cast<Axis>(axis_count - 1)] = rank;
    return c;
  }

  /// Number of ranks in a group over `axes`.
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int group_size(AxisSet axes) const {
    int n = 1;
    for (int a = 0; a < axis_count; ++a) {
      if (axes.contains(static_cast<Axis>(a))) n *= deg_[a];
    }
    return n;
  }
  /// Which group over `axes` holds `rank` (0 .. size/group_size - 1): its coordinates outside
  /// `axes`, linearised innermost fastest. The `color` of the split that creates the groups.
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int group_index(int rank, AxisSet axes) const {
    return linear(coord_of(rank), axes, false);
  }
  /// `rank`'s rank inside its group over `axes`: its coordinates on `axes`, innermost fastest.
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int group_rank(int rank, AxisSet axes) const {
    return linear(coord_of(rank), axes, true);
  }
  /// The world rank of member `member` of group `index` over `axes` (inverse of the two above).
  [[nodiscard]] FOURWAY_HOST_DEVICE constexpr int group_member(int index, int member,
                                                               AxisSet axes) const {
    Coord c;
    for (int a = 0; a < axis_count; ++a) {
      const auto ax = static_cast<Axis>(a);
      int& slot = c[ax];
      if (axes.contains(ax)) {
        slot = member % deg_[a];
        member /= deg_[a];
      } else {
        slot = index % deg_[a];
        index /= deg_[a];
      }
    }
    return rank_of(c);
  }

  /// "tp=2 pp=1 dp=4 (8 ranks)"; cp is named where its degree is above 1 ("tp=2 cp=2 pp=1 ...").
  [[nodiscard]] std::string describe() const {
    std::string out;
    for (Axis a : all_axes) {
      if (axis_named(a, deg_[index(a)])) out += detail::cat(axis_name(a), "=", deg_[index(a)], " ");
    }
    return out + detail::cat("(", world_, " ranks)");
  }
  /// Where `rank` sits, coordinate / degree on every axis: "tp 1/2, pp 0/2, dp 1/2".
  [[nodiscard]] std::string position(int rank) const {
    const Coord c = coord_of(rank);
    std::string out;
    for (Axis a : all_axes) {
      if (!axis_named(a, deg_[index(a)])) continue;
      out += detail::cat(out.empty() ? "" : ", ", axis_name(a), " ", c[a], "/", deg_[index(a)]);
    }
    return out;
  }

 private:
  static constexpr int index(Axis a) { return static_cast<int>(a); }

  /// "tp 2 x pp 2": the degrees the derived axis divides the world by (for messages).
  [[nodiscard]] std::string inner_text() const {
    std::string out;
    for (Axis a : all_axes) {
      if (a == derived_axis || !axis_named(a, deg_[index(a)])) continue;
      out += detail::cat(out.empty() ? "" : " x ", axis_name(a), " ", deg_[index(a)]);
    }
    return out;
  }

  constexpr int resolve(Axis a, int given) const {
    const std::string_view field = axis_name(a);
    const std::string_view pname = axis_policy(a);
    const int fixed = static_degree(a);
    const bool present = detail::policies_on<Policies...>(a) > 0;
    detail::mesh_require(given == dynamic || given >= 1, "fourway: MeshDegrees.", field, " = ",
                         given, "; degrees are >= 1");
    if (!present) {
      detail::mesh_require(given == dynamic || given == 1, "fourway: MeshDegrees.", field, " = ",
                           given, " but the Mesh has no ", pname, " axis; add fw::", pname,
                           "<...> to the Mesh type");
      return 1;
    }
    if (fixed == dynamic) {
      detail::mesh_require(given != dynamic, "fourway: ", pname,
                           "<fw::dynamic> needs its degree at run time: fw::Mesh<...>(world, {.",
                           field, " = N})");
      return given;
    }
    detail::mesh_require(given == dynamic || given == fixed, "fourway: the Mesh type fixes ", pname,
                         " degree ", fixed, " but MeshDegrees.", field, " = ", given, "; drop .",
                         field, " or make the type's degree fw::dynamic");
    return fixed;
  }

  FOURWAY_HOST_DEVICE constexpr int linear(Coord c, AxisSet axes, bool inside) const {
    int v = 0;
    int stride = 1;
    for (int a = 0; a < axis_count; ++a) {
      const auto ax = static_cast<Axis>(a);
      if (axes.contains(ax) == inside) {
        v += c[ax] * stride;
        stride *= deg_[a];
      }
    }
    return v;
  }

  int world_;
  int deg_[axis_count] = {};
};

}  // namespace fourway
