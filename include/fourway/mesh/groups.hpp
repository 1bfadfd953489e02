//! MeshGroups: the communicators of one rank of a mesh, created once from the world and injected.
//!
//! The constructor is a collective over the world communicator: it splits it once per non-empty
//! set of axes (7 splits: tp, pp, dp, tp+pp, tp+dp, pp+dp and all three), with the split color
//! `mesh.group_index(rank, axes)` and key `mesh.group_rank(rank, axes)`, so a group's ranks are
//! exactly the mesh arithmetic's and rank i of a group is `mesh.group_member(index, i, axes)`.
//! Nothing is global: code that needs the tensor-parallel group receives `groups.tp()`.
//!
//! Group names carry the fixed coordinates, e.g. "tp[pp=1,dp=0]", so a timeout says which group.
#pragma once

#include <array>
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
      : rank_(world.rank()), coord_(mesh.coord_of(world.rank())) {
    check<ConfigError>(world.size() == mesh.size(), "fourway: the world communicator '",
                       world.name(), "' has ", world.size(), " ranks but the mesh ",
                       mesh.describe(), " needs ", mesh.size());
    for (std::uint8_t bits = 1; bits <= 7; ++bits) {
      const auto axes = AxisSet::from_bits(bits);
      const int color = mesh.group_index(rank_, axes);
      const int key = mesh.group_rank(rank_, axes);
      std::string name = group_name(axes);
      if constexpr (requires { world.split(color, key, std::string{}); }) {
        groups_[bits].emplace(world.split(color, key, std::move(name)));
      } else {
        groups_[bits].emplace(world.split(color, key));
      }
    }
  }

  /// The group over one axis or a set of axes, e.g. `group({Axis::tp, Axis::dp})`.
  [[nodiscard]] C& group(AxisSet axes) {
    check<ConfigError>(axes.bits >= 1 && axes.bits <= 7,
                       "fourway: MeshGroups::group needs a non-empty set of axes");
    return *groups_[axes.bits];
  }
  [[nodiscard]] C& tp() { return group(Axis::tp); }
  [[nodiscard]] C& pp() { return group(Axis::pp); }
  [[nodiscard]] C& dp() { return group(Axis::dp); }
  /// All ranks of the mesh, ordered as the mesh orders them.
  [[nodiscard]] C& all() { return group(AxisSet::all()); }

  [[nodiscard]] const Coord& coord() const { return coord_; }
  [[nodiscard]] int rank() const { return rank_; }

  /// "tp[pp=1,dp=0]": the axes of the group, then the coordinates its members share.
  [[nodiscard]] std::string group_name(AxisSet axes) const {
    std::string in;
    std::string fixed;
    for (int a = 0; a < axis_count; ++a) {
      const auto ax = static_cast<Axis>(a);
      std::string& part = axes.contains(ax) ? in : fixed;
      if (!part.empty()) part.append(axes.contains(ax) ? "+" : ",");
      part.append(axis_name(ax));
      if (!axes.contains(ax)) part.append("=").append(std::to_string(coord_[ax]));
    }
    if (!fixed.empty()) in.append("[").append(fixed).append("]");
    return in;
  }

 private:
  int rank_;
  Coord coord_;
  std::array<std::optional<C>, 8> groups_;
};

}  // namespace fourway
