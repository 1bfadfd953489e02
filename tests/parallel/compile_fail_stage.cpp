// ShardedStrategy<4, ...> must not compile: stages are 0 (DataParallel), 1, 2 and 3.
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/train/sharded_strategy.hpp"

namespace fw = fourway;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
constexpr int kStage = 3;
#else
constexpr int kStage = 4;
#endif
using S = fw::ShardedStrategy<kStage, fw::models::Gpt<float, fw::Host>, fw::Precision<float>,
                              fw::Host, fw::LocalComm>;
static_assert(sizeof(S) > 0);
int main() { return 0; }
