// Strict<MpiComm> (comm/strict.hpp, comm/strict_mpi.hpp) under mpirun -np 2 (label mpi): the
// strict decorator's checks (strict_checks.hpp) over MPI, each on a fresh duplicate of
// MPI_COMM_WORLD, and StrictMpiWorld's launch binding the accountant.
#include "fourway/comm/strict_mpi.hpp"

#include <gtest/gtest.h>

#include "strict_checks.hpp"

namespace fw = fourway;

namespace {

static_assert(fw::call_options_communicator<fw::Strict<fw::MpiComm>>);

template <class Check>
void on_world(Check check) {
  fw::CommOptions o;
  o.deadline = std::chrono::seconds(2);  // the transport's: a stuck check's leftovers end soon
  // Left alive on purpose (leaked): a check that times out leaves a token in flight, and a freed
  // communicator's context could be reused by the next one's, which would then receive it.
  auto* memory = new fw::MemoryAccountant(0);
  auto* c = new fw::Strict<fw::MpiComm>(fw::MpiComm(MPI_COMM_WORLD, o, "strict"));
  c->bind_memory(*memory);
  check(*c, *memory);
}

TEST(StrictMpi, RefusesHostMemory) {
  on_world([](auto& c, auto& m) { strict_test::host_memory_is_refused(c, m); });
}
TEST(StrictMpi, UngroupedExchangeTimesOutNamingThePendingSend) {
  on_world([](auto& c, auto& m) { strict_test::ungrouped_exchange_times_out(c, m); });
}
TEST(StrictMpi, GroupedExchangeCompletes) {
  on_world([](auto& c, auto& m) { strict_test::grouped_exchange_completes(c, m); });
}
TEST(StrictMpi, MessagesMatchByOrder) {
  on_world([](auto& c, auto& m) { strict_test::messages_match_by_order(c, m); });
}
TEST(StrictMpi, ACommunicatorIsAStream) {
  on_world([](auto& c, auto& m) { strict_test::a_communicator_is_a_stream(c, m); });
}
TEST(StrictMpi, CrossedCollectivesTimeOut) {
  on_world([](auto& c, auto& m) { strict_test::crossed_collectives_time_out(c, m); });
}

TEST(StrictMpi, TheWorldKindBindsTheAccountant) {
  fw::launch<fw::StrictMpiWorld>(0, [](fw::World<fw::StrictMpiWorld>& w) {
    auto t = strict_test::filled(w.memory(), 8, 1.0f);
    w.comm().all_reduce(t.data(), t.data(), 8, fw::ReduceOp::sum);
    EXPECT_EQ(t[7], 2.0f * 8.0f);
    double scalar = 0;
    EXPECT_THROW(w.comm().broadcast(&scalar, 1, 0), fw::CommError);
  });
}

}  // namespace

int main(int argc, char** argv) {
  fw::detail::mpi_init_once();
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) GTEST_FLAG_SET(brief, true);
  int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
