#include <cstdio>
#include <fourway/fourway.hpp>

namespace fw = fourway;

static_assert(FOURWAY_HAS_CUDA == 0, "a host-only consumer gets no CUDA flag");

int main() {
  fw::MemoryAccountant memory(0);
  fw::Tensor<fw::bf16, fw::Host> w({3, 5}, fw::MemTag::weights, memory);
  const fw::Context<fw::Host> ctx(memory);
  fw::host::fill(ctx, w.data(), w.numel(), fw::bf16(0.5f));
  if (memory.current(fw::MemTag::weights) != 30 || static_cast<float>(w[14]) != 0.5f) return 1;
  std::printf("fourway consumer ok: %s\n", memory.json().c_str());
  return 0;
}
