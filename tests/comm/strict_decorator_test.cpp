// Strict<C> (comm/strict.hpp) over LocalWorld's lenient LocalComm: the decorator's logic without
// MPI (its MPI run is strict_mpi_test.cpp). Each check runs on two fresh ranks.
#include <gtest/gtest.h>

#include "fourway/comm/local_world.hpp"
#include "fourway/comm/strict.hpp"
#include "strict_checks.hpp"

namespace fw = fourway;

namespace {

static_assert(fw::call_options_communicator<fw::Strict<fw::LocalComm>>);

template <class Check>
void on_two_ranks(Check check) {
  fw::CommOptions o;
  o.deadline = std::chrono::seconds(2);  // the transport's: a stuck check's leftovers end soon
  fw::launch<fw::LocalWorld>(
      2,
      [&](fw::World<fw::LocalWorld>& w) {
        fw::Strict<fw::LocalComm> c(w.comm().split(0, w.rank(), "strict"));
        c.bind_memory(w.memory());
        check(c, w.memory());
      },
      o);
}

TEST(StrictDecorator, RefusesHostMemory) {
  on_two_ranks([](auto& c, auto& m) { strict_test::host_memory_is_refused(c, m); });
}
TEST(StrictDecorator, UngroupedExchangeTimesOutNamingThePendingSend) {
  on_two_ranks([](auto& c, auto& m) { strict_test::ungrouped_exchange_times_out(c, m); });
}
TEST(StrictDecorator, GroupedExchangeCompletes) {
  on_two_ranks([](auto& c, auto& m) { strict_test::grouped_exchange_completes(c, m); });
}
TEST(StrictDecorator, MessagesMatchByOrder) {
  on_two_ranks([](auto& c, auto& m) { strict_test::messages_match_by_order(c, m); });
}
TEST(StrictDecorator, ACommunicatorIsAStream) {
  on_two_ranks([](auto& c, auto& m) { strict_test::a_communicator_is_a_stream(c, m); });
}
TEST(StrictDecorator, CrossedCollectivesTimeOut) {
  on_two_ranks([](auto& c, auto& m) { strict_test::crossed_collectives_time_out(c, m); });
}

}  // namespace
