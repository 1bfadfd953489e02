//! MeshGroups: the communicators of one rank of a mesh, each split from the world on first use.
//!
//! A group over a non-empty set of axes (tp, cp, pp, dp, tp+pp, ... all of them:
//! 2^axis_count - 1 sets) is created by splitting the world communicator the first time the rank
//! asks for it, and kept: asking again returns the same communicator, and a set never asked for
//! costs nothing (no NCCL communicator per unused group). The split's key is `mesh.group_rank(rank,
//! axes)`, so a group's ranks are exactly the mesh arithmetic's and rank i of a group is
//! `mesh.group_member(index, i, axes)`. Nothing is global: code that needs the tensor-parallel
//! group receives `groups.tp()`. `create_all()` makes every group at once (the eager path).
//!
//! The rule that comes with it: a split is a collective over the *world*, so the first use of a
//! group is one too. Every rank asks for groups for the first time in the same order (ask them
//! where every rank runs the same code, e.g. when the strategy is built, not under a branch on the
//! rank). A rank that breaks the rule cannot get a wrong group: the split's color carries the set
//! of axes as well as `mesh.group_index`, so ranks asking for different sets never share a group,
//! and a group that comes back smaller than the mesh says is a ConfigError naming the set.
//!
//! One MeshGroups belongs to one rank, like its world communicator (ranks that are threads of a
//! LocalWorld each build their own); it is not shared between threads. It keeps a pointer to the
//! world communicator, which must outlive it.
//!
//! Group names carry the fixed coordinates, e.g. "tp[pp=1,dp=0]", so a timeout says which group
//! (cp is named where its degree is above 1, as in `Mesh::describe`).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/mesh/mesh.hpp"

namespace fourway {

template <communicator C>
class MeshGroups {
 public:
  template <class... Policies>
  MeshGroups(const Mesh<Policies...>& mesh, C& world)
      : world_(&world), rank_(world.rank()), coord_(mesh.coord_of(world.rank())) {
    for (Axis a : all_axes) degree_[a] = mesh.degree(a);
    check<ConfigError>(world.size() == mesh.size(), "fourway: the world communicator '",
                       world.name(), "' has ", world.size(), " ranks but the mesh ",
                       mesh.describe(), " needs ", mesh.size());
    for (std::uint8_t bits = 1; bits <= AxisSet::nonempty_count; ++bits) {
      const auto axes = AxisSet::from_bits(bits);
      auto& p = plans_[bits];
      p.color = mesh.group_index(rank_, axes) * set_slots + bits;
      p.key = mesh.group_rank(rank_, axes);
      p.size = mesh.group_size(axes);
    }
  }
  /// The group over one axis or a set of axes, e.g. `group({Axis::tp, Axis::dp})`; split from
  /// the world on the first call (a collective over the world: see the rule above).
  [[nodiscard]] C& group(AxisSet axes) {
    check<ConfigError>(axes.bits >= 1 && axes.bits <= AxisSet::nonempty_count,
                       "fourway: MeshGroups::group needs a non-empty set of axes");
    auto& g = groups_[axes.bits];
    if (!g) create(axes);
    return *g;
  }
  [[nodiscard]] C& tp() { return group(Axis::tp); }
  [[nodiscard]] C& cp() { return group(Axis::cp); }
  [[nodiscard]] C& pp() { return group(Axis::pp); }
  [[nodiscard]] C& dp() { return group(Axis::dp); }
  /// All ranks of the mesh, ordered as the mesh orders them.
  [[nodiscard]] C& all() { return group(AxisSet::all()); }

  /// Creates every group not created yet, in the order of their axis bits (a collective). A set
  /// holding an axis that descriptions leave out at degree 1 (cp, on a mesh without context
  /// parallelism) is left out too: it has the members of the set without that axis, and is
  /// split only when asked for.
  void create_all() {
    for (std::uint8_t bits = 1; bits <= AxisSet::nonempty_count; ++bits) {
      const AxisSet axes = AxisSet::from_bits(bits);
      bool every_named = true;
      for (Axis a : all_axes) every_named = every_named && (!axes.contains(a) || named(a));
      if (every_named) (void)group(axes);
    }
  }
  /// Whether the group over `axes` exists yet (asks nothing of the world).
  [[nodiscard]] bool created(AxisSet axes) const {
    return axes.bits >= 1 && axes.bits <= AxisSet::nonempty_count && groups_[axes.bits];
  }
  /// Splits made so far: one per group created, never two for one group.
  [[nodiscard]] int splits() const { return splits_; }

  [[nodiscard]] const Coord& coord() const { return coord_; }
  /// The mesh's degree on axis `a`.
  [[nodiscard]] int degree(Axis a) const { return degree_[a]; }
  [[nodiscard]] int rank() const { return rank_; }

  /// "tp[pp=1,dp=0]": the axes of the group, then the coordinates its members share.
  [[nodiscard]] std::string group_name(AxisSet axes) const {
    std::string in;
    std::string fixed;
    bool names_inside = false;  // the set has an axis descriptions name: leave unnamed ones out
    for (Axis ax : all_axes) names_inside = names_inside || (axes.contains(ax) && named(ax));
    for (Axis ax : all_axes) {
      if (!named(ax) && (!axes.contains(ax) || names_inside)) continue;
      std::string& part = axes.contains(ax) ? in : fixed;
      if (!part.empty()) part.append(axes.contains(ax) ? "+" : ",");
      part.append(axis_name(ax));
      if (!axes.contains(ax)) part.append("=").append(std::to_string(coord_[ax]));
    }
    if (!fixed.empty()) in.append("[").append(fixed).append("]");
    return in;
  }

 private:
  /// Colors leave room for every set's bits: color = group_index * set_slots + bits.
  static constexpr int set_slots = AxisSet::nonempty_count + 1;

  struct Plan {
    int color = 0;
    int key = 0;
    int size = 0;
  };

  /// Whether descriptions name axis `a` of this mesh (cp only above degree 1).
  [[nodiscard]] bool named(Axis a) const { return axis_named(a, degree_[a]); }

  void create(AxisSet axes) {
    const Plan& p = plans_[axes.bits];
    std::string name = group_name(axes);
    C made = [&] {
      if constexpr (requires { world_->split(p.color, p.key, std::string{}); }) {
        return world_->split(p.color, p.key, name);
      } else {
        return world_->split(p.color, p.key);
      }
    }();
    ++splits_;
    check<ConfigError>(made.size() == p.size, "fourway: MeshGroups made group ", name, " with ",
                       made.size(), " ranks but the mesh says ", p.size,
                       "; the ranks of the world asked for their groups in different orders. The "
                       "first use of a group is a collective over the world: ask for groups in "
                       "the same order on every rank");
    groups_[axes.bits].emplace(std::move(made));
  }

  C* world_;
  int rank_;
  Coord coord_;
  Coord degree_;  // the mesh's degree on every axis
  int splits_ = 0;
  std::array<Plan, set_slots> plans_{};
  std::array<std::optional<C>, set_slots> groups_;
};

}  // namespace fourway
