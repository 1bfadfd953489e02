// A model missing one of the members a ShardedStrategy needs must fail with the strategy's
// fourway: message naming it: units() with FOURWAY_HIDE_UNITS, visit_unit_parameters with
// FOURWAY_HIDE_UNIT_VISITOR. The control build has both.
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/train/sharded_strategy.hpp"

namespace fw = fourway;

#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
#undef FOURWAY_HIDE_UNITS
#undef FOURWAY_HIDE_UNIT_VISITOR
#endif

struct Model {  // fourway's GPT with a member hidden (a user's model that forgot it)
  using value_type = float;
  using backend_type = fw::Host;
  fw::models::Gpt<float, fw::Host> gpt;
  template <class F>
  void visit_parameters(F&& f) {
    gpt.visit_parameters(f);
  }
#if !defined(FOURWAY_HIDE_UNITS)
  [[nodiscard]] int units() const { return gpt.units(); }
#endif
#if !defined(FOURWAY_HIDE_UNIT_VISITOR)
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    gpt.visit_unit_parameters(u, f);
  }
#endif
};

using S = fw::ShardedStrategy<3, Model, fw::Precision<float>, fw::Host, fw::LocalComm>;
static_assert(sizeof(S) > 0);
int main() { return 0; }
