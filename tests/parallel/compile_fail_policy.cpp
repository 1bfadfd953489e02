// A policy of another axis is not a data-parallel strategy: compile error, no silent fallback.
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/train/sharded_strategy.hpp"

namespace fw = fourway;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using Policy = fw::Sharded<2>;
#else
using Policy = fw::TensorParallel<2>;
#endif
using S = fw::data_parallel_strategy_t<Policy, fw::models::Gpt<float, fw::Host>,
                                       fw::Precision<float>, fw::Host, fw::LocalComm>;
static_assert(sizeof(S) > 0);
int main() { return 0; }
