// check_gradients of a bf16 layer must fail with a fourway: message (its rounding swamps any
// finite difference); the control checks the same layer built with float.
#include "fourway/backend/host/backend.hpp"
#include "fourway/layers/gradient_check.hpp"
#include "fourway/layers/linear.hpp"

namespace fw = fourway;

#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using Elem = float;
#else
using Elem = fw::bf16;
#endif

int main() {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::Linear<Elem, fw::Host> lin(ctx, "proj", 2, 2, 1);
  fw::Tensor<Elem, fw::Host> x(fw::Shape{1, 2}, fw::MemTag::activations, mem);
  return fw::check_gradients(ctx, lin, x).tensors.empty() ? 1 : 0;
}
