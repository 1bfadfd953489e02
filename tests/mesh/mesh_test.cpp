#include "fourway/mesh/mesh.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace fw = fourway;
using fw::Axis;

namespace {
using Full = fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<2, 4>, fw::Sharded<3>>;
constexpr Full full(8);
// The rank <-> coordinate map is usable at compile time.
static_assert(full.tp() == 2 && full.pp() == 2 && full.dp() == 2);
static_assert(full.rank_of(fw::Coord{.tp = 1, .pp = 0, .dp = 1}) == 5);
static_assert(full.coord_of(6) == fw::Coord{.tp = 0, .pp = 1, .dp = 1});
static_assert(full.group_index(5, Axis::tp) == 2 && full.group_rank(5, Axis::tp) == 1);
static_assert(Full::has_axis<Axis::pp> && Full::policy_on<Axis::dp>::stage == 3);
static_assert(!fw::Mesh<fw::DataParallel>::has_axis<Axis::tp>);
static_assert(fw::Mesh<fw::DataParallel>::static_degree(Axis::tp) == 1);

bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }

template <class M>
std::string config_error(int world, fw::MeshDegrees d = {}) {
  try {
    M m(world, d);
    (void)m;
  } catch (const fw::ConfigError& e) {
    return e.what();
  }
  return "";
}

// Checks the three properties of the issue on one mesh, from the arithmetic alone.
template <class M>
void check_properties(const M& m) {
  const int n = m.size();
  const std::string where = m.describe();
  for (int r = 0; r < n; ++r) {
    const auto c = m.coord_of(r);
    ASSERT_EQ(m.rank_of(c), r) << where;
    ASSERT_TRUE(c.tp >= 0 && c.tp < m.tp() && c.cp >= 0 && c.cp < m.cp() && c.pp >= 0 &&
                c.pp < m.pp() && c.dp >= 0 && c.dp < m.dp());
  }
  for (int tp = 0; tp < m.tp(); ++tp) {
    for (int cp = 0; cp < m.cp(); ++cp) {
      for (int pp = 0; pp < m.pp(); ++pp) {
        for (int dp = 0; dp < m.dp(); ++dp) {
          const fw::Coord c{.tp = tp, .cp = cp, .pp = pp, .dp = dp};
          ASSERT_EQ(m.coord_of(m.rank_of(c)), c) << where;  // coordinate(rank(c)) == c
        }
      }
    }
  }
  for (std::uint8_t bits = 1; bits <= fw::AxisSet::nonempty_count; ++bits) {
    const auto axes = fw::AxisSet::from_bits(bits);
    const int gsize = m.group_size(axes);
    ASSERT_EQ(n % gsize, 0);
    // every rank is in exactly one group, at exactly one position
    std::vector<std::vector<int>> members(static_cast<std::size_t>(n / gsize),
                                          std::vector<int>(static_cast<std::size_t>(gsize), -1));
    for (int r = 0; r < n; ++r) {
      const int g = m.group_index(r, axes);
      const int i = m.group_rank(r, axes);
      ASSERT_TRUE(g >= 0 && g < n / gsize && i >= 0 && i < gsize) << where;
      ASSERT_EQ(members[g][i], -1) << where << ": two ranks at one place";
      members[g][i] = r;
      ASSERT_EQ(m.group_member(g, i, axes), r) << where;
      // members of a group agree on every coordinate outside the set
      const auto c0 = m.coord_of(m.group_member(g, 0, axes));
      const auto c = m.coord_of(r);
      for (Axis a : fw::all_axes) {
        if (!axes.contains(a)) {
          ASSERT_EQ(c[a], c0[a]) << where;
        }
      }
    }
  }
  // groups over orthogonal (disjoint) axis sets meet in exactly one rank when they share the
  // remaining coordinates, and in none otherwise: every pair of ranks against every rank, so on
  // meshes of up to 24 ranks (the larger ones take minutes under the sanitizers)
  if (n > 24) return;
  for (std::uint8_t a = 1; a <= fw::AxisSet::nonempty_count; ++a) {
    for (std::uint8_t b = 1; b <= fw::AxisSet::nonempty_count; ++b) {
      if (a & b) continue;
      const auto A = fw::AxisSet::from_bits(a), B = fw::AxisSet::from_bits(b);
      for (int x = 0; x < n; ++x) {
        for (int y = 0; y < n; ++y) {
          int meet = 0;
          for (int r = 0; r < n; ++r) {
            if (m.group_index(r, A) == m.group_index(x, A) &&
                m.group_index(r, B) == m.group_index(y, B))
              ++meet;
          }
          const auto cx = m.coord_of(x), cy = m.coord_of(y);
          bool share = true;
          for (Axis ax : fw::all_axes) {
            if (!A.contains(ax) && !B.contains(ax)) share = share && cx[ax] == cy[ax];
          }
          ASSERT_EQ(meet, share ? 1 : 0) << where << " sets " << int(a) << "," << int(b);
        }
      }
    }
  }
}
}  // namespace

TEST(Mesh, PropertiesHoldForManyGeneratedMeshes) {
  using Dyn = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::Pipeline<fw::dynamic, 8, fw::GPipe>,
                       fw::DataParallel>;
  int meshes = 0;
  for (int tp = 1; tp <= 5; ++tp) {
    for (int pp = 1; pp <= 4; ++pp) {
      for (int dp = 1; dp <= 4; ++dp) {
        check_properties(Dyn(tp * pp * dp, {.tp = tp, .pp = pp}));
        ++meshes;
      }
    }
  }
  using WithCp = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::ContextParallel<fw::dynamic>,
                          fw::Pipeline<fw::dynamic, 4>, fw::Sharded<3>>;
  for (int cp = 2; cp <= 3; ++cp) {
    check_properties(WithCp(2 * cp * 2 * 1, {.tp = 2, .cp = cp, .pp = 2}));
    check_properties(WithCp(cp * 2, {.tp = 1, .cp = cp, .pp = 1}));
  }
  check_properties(fw::Mesh<fw::Sharded<2>>(7));
  check_properties(fw::Mesh<fw::TensorParallel<3>>(3));
  check_properties(fw::Mesh<>(1));
  EXPECT_EQ(meshes, 80);
}

TEST(Mesh, LayoutIsTensorParallelInnermost) {
  // Megatron's order: a TP group is consecutive ranks, a DP group strides by tp * pp.
  const Full m(8);
  EXPECT_EQ(m.group_member(0, 1, Axis::tp), 1);
  EXPECT_EQ(m.group_member(0, 1, Axis::pp), 2);
  EXPECT_EQ(m.group_member(0, 1, Axis::dp), 4);
  EXPECT_EQ(m.group_member(1, 1, fw::AxisSet(Axis::tp, Axis::dp)), 3);  // pp=1 slice: 2,3,6,7
  EXPECT_EQ(m.group_member(1, 2, fw::AxisSet(Axis::tp, Axis::dp)), 6);
  EXPECT_EQ(m.describe(), "tp=2 pp=2 dp=2 (8 ranks)");
}

TEST(Mesh, ContextAxisSitsBetweenTensorAndPipeline) {
  // the planner's order [tp, cp, pp, dp]: rank = tp + 2 * (cp + 2 * (pp + 2 * dp))
  using M =
      fw::Mesh<fw::TensorParallel<2>, fw::ContextParallel<2>, fw::Pipeline<2, 2>, fw::Sharded<3>>;
  const M m(16);
  EXPECT_EQ(m.cp(), 2);
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.rank_of(fw::Coord{.tp = 1, .cp = 1, .pp = 0, .dp = 0}), 3);
  EXPECT_EQ(m.rank_of(fw::Coord{.tp = 0, .cp = 0, .pp = 1, .dp = 0}), 4);
  EXPECT_EQ(m.group_member(0, 1, Axis::cp), 2);
  // the ranks a context rank reduces gradients with: cp × dp, cp fastest
  EXPECT_EQ(m.group_member(0, 1, fw::AxisSet(Axis::cp, Axis::dp)), 2);
  EXPECT_EQ(m.group_member(0, 2, fw::AxisSet(Axis::cp, Axis::dp)), 8);
  EXPECT_EQ(m.describe(), "tp=2 cp=2 pp=2 dp=2 (16 ranks)");
  EXPECT_EQ(m.position(3), "tp 1/2, cp 1/2, pp 0/2, dp 0/2");
  // a mesh without context parallelism reads as it always did; cp 1 is named only when given
  EXPECT_EQ(fw::Mesh<fw::ContextParallel<fw::dynamic>>(4, {.cp = 4}).describe(),
            "tp=1 cp=4 pp=1 dp=1 (4 ranks)");
  const auto e = config_error<M>(12);
  EXPECT_TRUE(contains(e, "world size 12 does not divide by tp 2 x cp 2 x pp 2 = 8")) << e;
  EXPECT_TRUE(
      contains(config_error<fw::Mesh<fw::ContextParallel<fw::dynamic>, fw::DataParallel>>(4),
               "ContextParallel<fw::dynamic> needs its degree at run time"));
  EXPECT_TRUE(contains(config_error<fw::Mesh<fw::DataParallel>>(4, {.cp = 2}),
                       "MeshDegrees.cp = 2 but the Mesh has no ContextParallel axis"));
}

TEST(Mesh, PositionListsEveryAxisInnermostFirst) {
  const Full m(8);  // rank = tp + 2 * (pp + 2 * dp)
  EXPECT_EQ(m.position(0), "tp 0/2, pp 0/2, dp 0/2");
  EXPECT_EQ(m.position(5), "tp 1/2, pp 0/2, dp 1/2");
  EXPECT_EQ(m.position(6), "tp 0/2, pp 1/2, dp 1/2");
  EXPECT_EQ(fw::Mesh<fw::DataParallel>(3).position(2), "tp 0/1, pp 0/1, dp 2/3");
}

TEST(Mesh, PoliciesInAnyOrderGiveTheSameLayout) {
  // the layout is the axes' (tp fastest, then pp, then dp), not the order the policies are written
  using Reversed = fw::Mesh<fw::Sharded<3>, fw::Pipeline<2, 4>, fw::TensorParallel<2>>;
  using Middle = fw::Mesh<fw::Pipeline<2, 4>, fw::Sharded<3>, fw::TensorParallel<2>>;
  const Full canonical(8);
  const Reversed reversed(8);
  const Middle middle(8);
  EXPECT_EQ(reversed.describe(), canonical.describe());
  EXPECT_EQ(middle.describe(), canonical.describe());
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(reversed.coord_of(r), canonical.coord_of(r)) << r;
    EXPECT_EQ(middle.coord_of(r), canonical.coord_of(r)) << r;
    EXPECT_EQ(reversed.position(r), canonical.position(r)) << r;
  }
  static_assert(std::is_same_v<Reversed::policy_on<fw::Axis::dp>, fw::Sharded<3>>);
  static_assert(Reversed::static_degree(fw::Axis::tp) == 2);
}

TEST(Mesh, DataParallelDegreeIsWhatTheWorldLeaves) {
  EXPECT_EQ(Full(16).dp(), 4);
  using DynTp = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::DataParallel>;
  EXPECT_EQ(DynTp(12, {.tp = 3}).dp(), 4);
  EXPECT_EQ(fw::Mesh<fw::TensorParallel<4>>(4).dp(), 1);
}

TEST(Mesh, BadConfigurationsAreConfigErrorsNamingTheNumbers) {
  auto e = config_error<Full>(10);
  EXPECT_TRUE(contains(e, "world size 10 does not divide by tp 2 x pp 2 = 4")) << e;
  EXPECT_TRUE(contains(e, "run on a multiple of 4 ranks")) << e;
  e = config_error<fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<2, 2>>>(8);
  EXPECT_TRUE(
      contains(e, "world size 8 is not tp 2 x pp 2 = 4 and the Mesh has no data-parallel axis"))
      << e;
  e = config_error<fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::DataParallel>>(8);
  EXPECT_TRUE(contains(e, "TensorParallel<fw::dynamic> needs its degree at run time")) << e;
  e = config_error<Full>(8, {.tp = 4});
  EXPECT_TRUE(contains(e, "fixes TensorParallel degree 2 but MeshDegrees.tp = 4")) << e;
  e = config_error<fw::Mesh<fw::DataParallel>>(8, {.pp = 2});
  EXPECT_TRUE(contains(e, "MeshDegrees.pp = 2 but the Mesh has no Pipeline axis")) << e;
  e = config_error<Full>(8, {.dp = 4});
  EXPECT_TRUE(contains(e, "MeshDegrees.dp = 4 but world size 8 / (tp 2 x pp 2) leaves dp = 2"))
      << e;
  e = config_error<fw::Mesh<fw::TensorParallel<fw::dynamic>>>(4, {.tp = 0});
  EXPECT_TRUE(contains(e, "MeshDegrees.tp = 0; degrees are >= 1")) << e;
  e = config_error<Full>(0);
  EXPECT_TRUE(contains(e, "at least 1 rank, got 0")) << e;
}
