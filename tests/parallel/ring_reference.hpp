// The reference ring attention is held to, shared by the host test (ring_attention_test.cpp) and
// the CUDA one (ring_attention_cuda_test.cu): random q|k|v and dO, the host flash kernels on the
// whole sequences (themselves tested against the attention's definition in double,
// tests/backend/flash_attention_test.cpp), and the worst difference relative to the largest value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fourway/backend/host/flash_attention.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/memory.hpp"

namespace ring_reference {

namespace fw = fourway;

template <class E>
std::vector<E> random_values(std::size_t n, std::uint32_t seed, float spread) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-spread, spread);
  std::vector<E> v(n);
  for (auto& x : v) x = fw::convert<E>(d(gen));
  return v;
}

template <class E>
double value(E x) {
  return static_cast<double>(fw::convert<float>(x));
}

/// The worst difference between `got` and `want`, and the largest |value| of `want`.
template <class A, class B>
std::pair<double, double> worst_and_scale(const A& got, const B& want) {
  double scale = 0.0, worst = 0.0;
  for (const auto& v : want) scale = std::max(scale, std::abs(value(v)));
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(value(got[i]) - value(want[i])));
  return {worst, scale};
}

/// The unsplit attention of random sequences: inputs and the flash kernels' results.
template <class E>
struct Unsplit {
  std::vector<E> qkv, dout, out, dqkv;
  std::vector<float> lse;

  Unsplit(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::uint32_t seed)
      : qkv(random_values<E>(static_cast<std::size_t>(B * T * 3 * C), 11 + seed, 1.5f)),
        dout(random_values<E>(static_cast<std::size_t>(B * T * C), 23 + seed, 1.0f)),
        out(dout.size()),
        dqkv(qkv.size()),
        lse(static_cast<std::size_t>(B * NH * T)) {
    fw::MemoryAccountant acct;
    fw::Context<fw::Host> ctx(acct);
    std::vector<float> delta(lse.size());
    fw::host::flash_attention_forward(ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH);
    fw::host::flash_attention_backward(ctx, dqkv.data(), delta.data(), dout.data(), qkv.data(),
                                       out.data(), lse.data(), B, T, C, NH);
  }
};

}  // namespace ring_reference
