#include "fourway/mesh/groups.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
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
    // Groups are split on first use: tp, dp, all and pp were asked for, so 4 of the 7.
    EXPECT_EQ(world.counters().get("world", fw::CommOp::split).calls, 4u);
  });
}

// A context-parallel axis is named in groups where its degree is above 1, and create_all makes
// every one of the 15 sets' groups; cp + dp is the group a context rank reduces gradients over.
TEST(MeshGroups, ContextGroupsAreNamedAndMadeWhenTheMeshHasThem) {
  using M = fw::Mesh<fw::ContextParallel<2>, fw::DataParallel>;
  const M mesh(4);
  fw::launch<fw::LocalWorld>(4, [&](fw::World<fw::LocalWorld>& w) {
    fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
    const auto c = mesh.coord_of(w.rank());
    EXPECT_EQ(groups.cp().name(), "cp[tp=0,pp=0,dp=" + std::to_string(c.dp) + "]");
    EXPECT_EQ(groups.cp().size(), 2);
    EXPECT_EQ(groups.cp().rank(), c.cp);
    auto& replicas = groups.group({Axis::cp, Axis::dp});
    EXPECT_EQ(replicas.name(), "cp+dp[tp=0,pp=0]");
    EXPECT_EQ(replicas.size(), 4);
    EXPECT_EQ(replicas.rank(), c.cp + 2 * c.dp);
    fw::MeshGroups<fw::LocalComm> eager(mesh, w.comm());
    eager.create_all();
    EXPECT_EQ(eager.splits(), 15);
  });
}

// Lazily created groups: only those asked for exist, each split once however often it is asked
// for, and each holds the same ranks, ranked the same, as the eager path (`create_all`) makes.
TEST(MeshGroups, CreatedOnFirstUseOnceEachAndLikeTheEagerOnes) {
  using M = fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<fw::dynamic, 2>, fw::DataParallel>;
  const M mesh(8, {.pp = 2});
  fw::launch<fw::LocalWorld>(8, [&](fw::World<fw::LocalWorld>& w) {
    fw::Counting<fw::LocalComm> world(std::move(w.comm()));
    const auto splits = [&] { return world.counters().get("world", fw::CommOp::split).calls; };
    fw::MeshGroups<fw::Counting<fw::LocalComm>> lazy(mesh, world);
    EXPECT_EQ(splits(), 0u);
    EXPECT_EQ(lazy.splits(), 0);
    auto& tp = lazy.tp();
    EXPECT_EQ(&lazy.tp(), &tp);
    EXPECT_EQ(&lazy.group(Axis::tp), &tp);
    auto& pp_dp = lazy.group({Axis::pp, Axis::dp});
    EXPECT_EQ(&lazy.group({Axis::dp, Axis::pp}), &pp_dp);
    EXPECT_EQ(splits(), 2u);
    EXPECT_EQ(lazy.splits(), 2);
    for (std::uint8_t bits = 1; bits <= fw::AxisSet::nonempty_count; ++bits) {
      const auto axes = fw::AxisSet::from_bits(bits);
      EXPECT_EQ(lazy.created(axes),
                axes == fw::AxisSet(Axis::tp) || axes == fw::AxisSet(Axis::pp, Axis::dp))
          << lazy.group_name(axes);
    }

    fw::MeshGroups<fw::Counting<fw::LocalComm>> eager(mesh, world);
    eager.create_all();
    EXPECT_EQ(eager.splits(),
              7);  // the sets of tp, pp, dp; those with cp (degree 1) only on asking
    EXPECT_EQ(splits(), 9u);
    const std::int32_t me = w.rank();
    for (auto axes : {fw::AxisSet(Axis::tp), fw::AxisSet(Axis::pp, Axis::dp)}) {
      auto& a = lazy.group(axes);
      auto& b = eager.group(axes);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(a.rank(), b.rank());
      EXPECT_EQ(a.name(), b.name());
      std::vector<std::int32_t> ma(static_cast<std::size_t>(a.size()));
      std::vector<std::int32_t> mb(ma.size());
      a.all_gather(&me, ma.data(), 1);
      b.all_gather(&me, mb.data(), 1);
      EXPECT_EQ(ma, mb) << lazy.group_name(axes);
    }
    EXPECT_EQ(lazy.splits(), 2);  // nothing split again
    EXPECT_EQ(splits(), 9u);
  });
}

// A rank that asks for a different group first than its peers gets a ConfigError, never a group
// of the wrong ranks: with TP=2 on 2 ranks, rank 0 asks for tp (2 ranks) while rank 1 asks for
// dp (1 rank); rank 0's split comes back with 1 rank.
TEST(MeshGroups, FirstUsesInDifferentOrdersAreAConfigError) {
  const fw::Mesh<fw::TensorParallel<2>, fw::DataParallel> mesh(2);
  std::array<std::string, 2> errors;
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
    try {
      if (w.rank() == 0) {
        (void)groups.tp();
      } else {
        EXPECT_EQ(groups.dp().size(), 1);
      }
    } catch (const fw::ConfigError& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("made group tp[pp=0,dp=0] with 1 ranks but the mesh says 2"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("same order on every rank"), std::string::npos) << errors[0];
  EXPECT_TRUE(errors[1].empty()) << errors[1];
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
