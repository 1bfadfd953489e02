// A Trainer whose model is fp32 under Precision<bf16> must fail with the Trainer's message; the
// control build uses a bf16 model.
#include <cstdint>

#include "fourway/train/trainer.hpp"

namespace fw = fourway;

#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
using Elem = fw::bf16;
#else
using Elem = float;
#endif

struct Model {
  using value_type = Elem;
  using backend_type = fw::Host;
  struct Stash {};
  float forward(const fw::Context<fw::Host>&, const fw::Tensor<std::int32_t, fw::Host>&,
                const fw::Tensor<std::int32_t, fw::Host>&, Stash&, fw::NoHooks&) {
    return 0.0f;
  }
  void backward(const fw::Context<fw::Host>&, Stash&, float, fw::NoHooks&) {}
  template <class F>
  void visit_parameters(F&&) {}
};

using Strategy = fw::SingleRank<Model, fw::Precision<fw::bf16>, fw::Host>;
int main() { return sizeof(fw::Trainer<Strategy>) > 0 ? 0 : 1; }
