#include "fourway/mesh/groups.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "fourway/comm/counting.hpp"
#include "fourway/comm/local_world.hpp"

namespace fw = fourway;
using fw::Axis;

namespace {
// Every group the factory made holds exactly the ranks the mesh arithmetic names, in its order.
template <class M, class C>
void check_groups(const M& mesh, fw::MeshGroups<C>& groups, int world_rank) {
  for (std::uint8_t bits = 1; bits <= 7; ++bits) {
    const auto axes = fw::AxisSet::from_bits(bits);
    auto& g = groups.group(axes);
    ASSERT_EQ(g.size(), mesh.group_size(axes));
    ASSERT_EQ(g.rank(), mesh.group_rank(world_rank, axes));
    std::vector<std::int32_t> members(static_cast<std::size_t>(g.size()));
    const std::int32_t me = world_rank;
    g.all_gather(&me, members.data(), 1);
    const int index = mesh.group_index(world_rank, axes);
    for (int i = 0; i < g.size(); ++i) {
      ASSERT_EQ(members[static_cast<std::size_t>(i)], mesh.group_member(index, i, axes))
          << groups.group_name(axes);
    }
  }
}
}  // namespace

TEST(MeshGroups, GroupsMatchTheMeshArithmetic) {
  using M = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::Pipeline<fw::dynamic, 4, fw::GPipe>,
                     fw::Sharded<3>>;
  for (auto [tp, pp, dp] :
       {std::array{2, 2, 2}, std::array{1, 3, 2}, std::array{4, 1, 2}, std::array{1, 1, 3}}) {
    const M mesh(tp * pp * dp, {.tp = tp, .pp = pp});
    fw::launch<fw::LocalWorld>(mesh.size(), [&](fw::World<fw::LocalWorld>& w) {
      fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
      EXPECT_EQ(groups.coord(), mesh.coord_of(w.rank()));
      check_groups(mesh, groups, w.rank());
    });
  }
}

TEST(MeshGroups, NamesCarryTheSharedCoordinatesAndCountingSeesThem) {
  using M = fw::Mesh<fw::TensorParallel<2>, fw::DataParallel>;
  const M mesh(4);
  fw::launch<fw::LocalWorld>(4, [&](fw::World<fw::LocalWorld>& w) {
    fw::Counting<fw::LocalComm> world(std::move(w.comm()));
    fw::MeshGroups<fw::Counting<fw::LocalComm>> groups(mesh, world);
    const auto c = mesh.coord_of(w.rank());
    const std::string tp_name = "tp[pp=0,dp=" + std::to_string(c.dp) + "]";
    EXPECT_EQ(groups.tp().name(), tp_name);
    EXPECT_EQ(groups.dp().name(), "dp[tp=" + std::to_string(c.tp) + ",pp=0]");
    EXPECT_EQ(groups.all().name(), "tp+pp+dp");
    EXPECT_EQ(groups.pp().size(), 1);  // absent axis: degree 1
    float x = 1.0f;
    groups.tp().all_reduce(&x, &x, 1, fw::ReduceOp::sum);
    EXPECT_EQ(x, 2.0f);
    EXPECT_EQ(world.counters().get(tp_name, fw::CommOp::all_reduce).calls, 1u);
    EXPECT_EQ(world.counters().get("world", fw::CommOp::split).calls, 7u);
  });
}

TEST(MeshGroups, WorldOfTheWrongSizeIsAConfigError) {
  const fw::Mesh<fw::TensorParallel<2>, fw::DataParallel> mesh(4);
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    try {
      fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
      ADD_FAILURE();
    } catch (const fw::ConfigError& e) {
      EXPECT_NE(
          std::string(e.what()).find("has 2 ranks but the mesh tp=2 pp=1 dp=2 (4 ranks) needs 4"),
          std::string::npos)
          << e.what();
    }
  });
}
