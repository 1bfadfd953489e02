// Includes the CUDA backend rather than the umbrella fourway.cuh: this test is about the package
// (targets, flags, include paths, link); every .cuh is compiled alone by the hygiene tests.
#include <cstdio>
#include <fourway/backend/cuda/backend.cuh>
#include <fourway/core/tensor.hpp>

namespace fw = fourway;

static_assert(FOURWAY_HAS_CUDA == 1, "fourway::cuda defines FOURWAY_HAS_CUDA");

__global__ void scale(fw::native_t<fw::bf16>* p, int n, float s) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = __float2bfloat16_rn(__bfloat162float(p[i]) * s);
}

int main() {
  if (fw::cuda::device_count() == 0) {
    std::printf("fourway consumer ok (no CUDA device, nothing run)\n");
    return 0;
  }
  fw::MemoryAccountant memory(0);
  fw::Context<fw::Cuda> ctx(memory, 0);
  fw::Tensor<fw::bf16, fw::Cuda> w({1000}, fw::MemTag::weights, memory);
  fw::cuda::fill(ctx, w.data(), w.numel(), fw::bf16(1.5f));
  scale<<<4, 256, 0, ctx.stream()>>>(reinterpret_cast<fw::native_t<fw::bf16>*>(w.data()), 1000,
                                     2.0f);
  fw::bf16 back[1000];
  fw::cuda::to_host(ctx, back, w.data(), 1000);
  for (fw::bf16 x : back) {
    if (static_cast<float>(x) != 3.0f) return 1;
  }
  std::printf("fourway consumer ok: %s\n", memory.json().c_str());
  return 0;
}
