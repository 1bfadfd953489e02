// A rank that throws under launch<MpiWorld> ends the whole job instead of leaving the others
// waiting: ctest passes when the job prints the failure (and fails on its 30 s timeout if the
// other ranks hang in their all_reduce, whose deadline is a minute).
#include <chrono>
#include <stdexcept>
#include <vector>

#include "fourway/comm/mpi_comm.hpp"

namespace fw = fourway;

int main() {
  fw::CommOptions o;
  o.deadline = std::chrono::seconds(60);
  fw::launch<fw::MpiWorld>(
      0,
      [](fw::World<fw::MpiWorld>& w) {
        std::vector<float> x(1000, 1.0f);
        w.comm().all_reduce(x.data(), x.data(), 1000, fw::ReduceOp::sum);
        if (w.rank() == 1) throw std::runtime_error("boom in step 1");
        w.comm().all_reduce(x.data(), x.data(), 1000, fw::ReduceOp::sum);  // rank 1 never comes
      },
      o);
  return 0;
}
