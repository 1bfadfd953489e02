// The demo: what fourway can do so far. Later issues make it train.
#include <cstdio>

#include "fourway/fourway.hpp"

namespace fw = fourway;

int main() {
  fw::MemoryAccountant memory(0);
  const std::int64_t params = 1 << 20;
  fw::Tensor<fw::bf16, fw::Host> w({params}, fw::MemTag::weights, memory);
  fw::Tensor<fw::bf16, fw::Host> g({params}, fw::MemTag::grads, memory);
  fw::Tensor<float, fw::Host> master({params}, fw::MemTag::master_weights, memory);
  fw::Tensor<float, fw::Host> moments({2, params}, fw::MemTag::optimizer_state, memory);
  std::printf("mixed-precision Adam state of %lld parameters: %zu B = %.1f B/parameter\n",
              static_cast<long long>(params), memory.total_current(),
              static_cast<double>(memory.total_current()) / static_cast<double>(params));
  std::printf("%s", memory.table().c_str());
  return 0;
}
