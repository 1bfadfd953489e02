//! Causal multi-head attention from its definition, in double: the reference both attention
//! kernels (materialised and flash-style) are tested against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fourway_test {

struct AttRef {
  std::vector<double> out, att;
  std::vector<double> lse;  // (B, NH, T): log Σ_j exp(scaled score), per query row
};
/// Causal attention from its definition, one (batch, head, query) at a time, in double.
inline AttRef attention_ref(const std::vector<double>& qkv, std::int64_t B, std::int64_t T,
                            std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttRef r{std::vector<double>(static_cast<std::size_t>(B * T * C), 0.0),
           std::vector<double>(static_cast<std::size_t>(B * NH * T * T), 0.0),
           std::vector<double>(static_cast<std::size_t>(B * NH * T), 0.0)};
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      for (std::int64_t t = 0; t < T; ++t) {
        const double* q = qkv.data() + (b * T + t) * 3 * C + h * hs;
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (std::int64_t j = 0; j <= t; ++j) {
          const double* k = qkv.data() + (b * T + j) * 3 * C + C + h * hs;
          double d = 0.0;
          for (std::int64_t i = 0; i < hs; ++i) d += q[i] * k[i];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        r.lse[(b * NH + h) * T + t] = mx + std::log(sum);
        for (std::int64_t j = 0; j <= t; ++j) {
          const double p = s[j] / sum;
          r.att[((b * NH + h) * T + t) * T + j] = p;
          const double* v = qkv.data() + (b * T + j) * 3 * C + 2 * C + h * hs;
          for (std::int64_t i = 0; i < hs; ++i) r.out[(b * T + t) * C + h * hs + i] += p * v[i];
        }
      }
    }
  }
  return r;
}

}  // namespace fourway_test
