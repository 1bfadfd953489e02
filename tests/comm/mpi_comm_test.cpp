// Run under mpirun -np 2 and -np 4 (ctest label mpi). Every rank runs every test; a test fails
// on all ranks if it fails on one (the result is all-reduced in main).
#include "fourway/comm/mpi_comm.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "fourway/comm/counting.hpp"
#include "fourway/mesh/groups.hpp"

namespace fw = fourway;
using Clock = std::chrono::steady_clock;

namespace {
fw::CommOptions opts(int ms, bool debug = false) {
  fw::CommOptions o;
  o.deadline = std::chrono::milliseconds(ms);
  o.debug = debug;
  return o;
}
bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }
}  // namespace

static_assert(fw::communicator<fw::MpiComm>);
static_assert(fw::communicator<fw::Counting<fw::MpiComm>>);

template <class T>
class MpiOps : public ::testing::Test {};
using ElementTypes =
    ::testing::Types<float, fw::bf16, fw::fp16, double, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(MpiOps, ElementTypes);

TYPED_TEST(MpiOps, EveryOpMatchesReference) {
  fw::MpiComm world(MPI_COMM_WORLD, opts(60000, /*debug=*/true));
  comm_test::check_every_op<TypeParam>(world, 777u);
  // and inside a split group (odd sizes when np = 4: groups of 3 and 1)
  auto sub = world.split(world.rank() == 0 ? 1 : 0, world.rank());
  comm_test::check_every_op<TypeParam>(sub, 778u);
}

static_assert(fw::call_options_communicator<fw::MpiComm>);
static_assert(fw::call_options_communicator<fw::Counting<fw::MpiComm>>);

TEST(Mpi, CallOptionsTimeoutIsUsedAndAStreamIsRefused) {
  fw::MpiComm world(MPI_COMM_WORLD, opts(60000));
  float x = 1.0f;
  world.all_reduce(&x, &x, 1, fw::ReduceOp::sum,
                   fw::CallOptions{.timeout = std::chrono::milliseconds(30000)});
  EXPECT_EQ(x, static_cast<float>(world.size()));
  int stream_stand_in = 0;
  try {
    world.all_reduce(&x, &x, 1, fw::ReduceOp::sum, fw::CallOptions{.stream = &stream_stand_in});
    ADD_FAILURE() << "a stream was accepted";
  } catch (const fw::ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot honour CallOptions::stream")) << e.what();
  }
  world.barrier();  // the refused call entered no collective: the ranks are still in step
}

TEST(Mpi, AsyncOperationsOverlapAndComplete) {
  // Three operations in flight at once, on buffers that do not overlap: an in-place all_reduce
  // writes a while it runs, so the all_gather reads its own copy c, never a.
  fw::MpiComm world(MPI_COMM_WORLD, opts(60000));
  const int n = world.size();
  const int r = world.rank();
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f), c(1000, static_cast<float>(r)), g(1000 * n);
  fw::Work wa = world.all_reduce_async(a.data(), a.data(), 1000, fw::ReduceOp::sum);
  fw::Work wb = world.all_reduce_async(b.data(), b.data(), 1000, fw::ReduceOp::avg);
  fw::Work wg = world.all_gather_async(c.data(), g.data(), 1000);
  wg.wait();
  wb.wait();
  wa.wait();
  EXPECT_EQ(a[999], static_cast<float>(n));
  EXPECT_EQ(b[0], 2.0f);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(g[static_cast<std::size_t>(q) * 1000], static_cast<float>(q)) << q;
    EXPECT_EQ(g[static_cast<std::size_t>(q) * 1000 + 999], static_cast<float>(q)) << q;
  }
  EXPECT_TRUE(wa.test());
}

TEST(Mpi, MissingRankTurnsIntoCommTimeoutNamingIt) {
  constexpr int deadline_ms = 2000;
  fw::MpiComm world(MPI_COMM_WORLD, opts(deadline_ms));
  world.barrier();
  std::vector<float> x(8, 1.0f);
  if (world.rank() == 0) {
    // arrives 1.5 s after the others gave up (a margin for loaded CI cores), so their abandoned
    // requests complete
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline_ms + 1500));
    world.all_reduce(x.data(), x.data(), 8, fw::ReduceOp::sum);
  } else {
    const auto t0 = Clock::now();
    try {
      world.all_reduce(x.data(), x.data(), 8, fw::ReduceOp::sum);
      ADD_FAILURE() << "no timeout";
    } catch (const fw::CommTimeout& e) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      // deadline + 10%, plus 0.3 s for oversubscribed CI cores (see the LocalWorld test)
      EXPECT_GE(s, deadline_ms / 1000.0);
      EXPECT_LE(s, deadline_ms / 1000.0 * 1.1 + 0.3);
      const std::string m = e.what();
      EXPECT_TRUE(contains(m, "group 'world'")) << m;
      EXPECT_TRUE(contains(m, "all_reduce(fp32, count 8, sum) #2")) << m;
      EXPECT_TRUE(contains(m, "for rank 0 [last entered #1 barrier]")) << m;
    }
  }
  world.barrier();
}

TEST(Mpi, MismatchInDebugModeThrowsTheSameOnEveryRank) {
  fw::MpiComm world(MPI_COMM_WORLD, opts(30000, /*debug=*/true));
  std::vector<float> x(100, 1.0f);
  const std::int64_t count = world.rank() == 1 ? 99 : 100;
  try {
    world.all_reduce(x.data(), x.data(), count, fw::ReduceOp::sum);
    ADD_FAILURE() << "no mismatch";
  } catch (const fw::CommMismatch& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "rank 1 called all_reduce(fp32, count 99, sum) (count differ)")) << m;
    EXPECT_TRUE(contains(m, "collective #1")) << m;
  }
  std::int32_t v = world.rank(), s = 0;
  world.all_reduce(&v, &s, 1, fw::ReduceOp::sum);  // still usable
  EXPECT_EQ(s, world.size() * (world.size() - 1) / 2);
}

TEST(Mpi, RecvOfTheWrongCountIsCommMismatch) {
  fw::MpiComm world(MPI_COMM_WORLD, opts(30000));
  if (world.rank() == 0) {
    std::vector<float> v(3, 1.0f);
    world.send(v.data(), 3, 1, 11);
    world.send(v.data(), 3, 1, 12);
  } else if (world.rank() == 1) {
    std::vector<float> v(5);
    EXPECT_THROW(world.recv(v.data(), 2, 0, 11), fw::CommMismatch);  // longer message
    EXPECT_THROW(world.recv(v.data(), 5, 0, 12), fw::CommMismatch);  // shorter message
  }
  world.barrier();
}

TEST(Mpi, MeshGroupsOverMpi) {
  fw::MpiComm world(MPI_COMM_WORLD, opts(60000));
  const int n = world.size();
  using M = fw::Mesh<fw::TensorParallel<2>, fw::DataParallel>;
  const M mesh(n);
  fw::Counting<fw::MpiComm> counted(std::move(world));
  fw::MeshGroups<fw::Counting<fw::MpiComm>> groups(mesh, counted);
  std::int32_t me = counted.rank();
  std::vector<std::int32_t> tp(2);
  groups.tp().all_gather(&me, tp.data(), 1);
  const int first = mesh.group_member(mesh.group_index(me, fw::Axis::tp), 0, fw::Axis::tp);
  EXPECT_EQ(tp[0], first);
  EXPECT_EQ(tp[1], first + 1);
  EXPECT_EQ(groups.dp().size(), n / 2);
  EXPECT_DOUBLE_EQ(counted.counters()
                       .get(std::string(groups.tp().name()), fw::CommOp::all_gather)
                       .modelled_bytes,
                   4.0);
}

TEST(Mpi, LaunchRunsOnEveryProcess) {
  int ran = 0;
  fw::launch<fw::MpiWorld>(0, [&](fw::World<fw::MpiWorld>& w) {
    std::int64_t one = 1, total = 0;
    w.comm().all_reduce(&one, &total, 1, fw::ReduceOp::sum);
    EXPECT_EQ(total, w.size());
    EXPECT_EQ(w.memory().rank(), w.rank());
    ran = 1;
  });
  EXPECT_EQ(ran, 1);
}

int main(int argc, char** argv) {
  fw::detail::mpi_init_once();
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) GTEST_FLAG_SET(brief, true);  // rank 0 prints progress; all print failures
  int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
