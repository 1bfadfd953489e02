// compare_weights A.safetensors B.safetensors TOL [KEY_ABS]: exit 0 when both files hold the same
// tensor names and shapes and every tensor of A is within TOL of B's, relative in the L2 norm
// (||a - b|| / ||b||); prints the worst tensor. TOL 0 asks for bitwise-equal values.
// With KEY_ABS, the key third of every attn.c_attn.bias (whose exact gradient is zero: softmax
// ignores a constant added to a row of scores, so Adam turns rounding noise into steps of about
// lr) is held to |a - b| <= KEY_ABS instead, as tests/parallel/sharded_test.cpp does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/core/error.hpp"

namespace fw = fourway;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: compare_weights A.safetensors B.safetensors TOL [KEY_ABS]\n");
    return 2;
  }
  try {
    const auto a = fw::SafetensorsFile::read(argv[1]);
    const auto b = fw::SafetensorsFile::read(argv[2]);
    const double tol = std::strtod(argv[3], nullptr);
    const double key_abs = argc == 5 ? std::strtod(argv[4], nullptr) : -1.0;
    if (a.entries().size() != b.entries().size()) {
      std::fprintf(stderr, "%zu tensors vs %zu\n", a.entries().size(), b.entries().size());
      return 1;
    }
    double worst = 0;
    std::string worst_name;
    for (const auto& ea : a.entries()) {
      const auto* eb = b.find(ea.name);
      if (eb == nullptr || eb->shape != ea.shape) {
        std::fprintf(stderr, "%s: missing or reshaped in %s\n", ea.name.c_str(), argv[2]);
        return 1;
      }
      std::vector<float> va(static_cast<std::size_t>(ea.numel()));
      std::vector<float> vb(va.size());
      a.read_into(ea, std::span<float>(va));
      b.read_into(*eb, std::span<float>(vb));
      if (key_abs >= 0 && ea.name.ends_with("attn.c_attn.bias")) {
        const std::size_t C = va.size() / 3;
        for (std::size_t i = C; i < 2 * C; ++i) {
          if (std::abs(double(va[i]) - vb[i]) > key_abs) {
            std::fprintf(stderr, "%s[%zu]: %g vs %g beyond %g\n", ea.name.c_str(), i, va[i], vb[i],
                         key_abs);
            return 1;
          }
        }
        va.erase(va.begin() + static_cast<std::ptrdiff_t>(C),
                 va.begin() + static_cast<std::ptrdiff_t>(2 * C));
        vb.erase(vb.begin() + static_cast<std::ptrdiff_t>(C),
                 vb.begin() + static_cast<std::ptrdiff_t>(2 * C));
      }
      double num = 0, den = 0;
      for (std::size_t i = 0; i < va.size(); ++i) {
        const double d = double(va[i]) - vb[i];
        num += d * d;
        den += double(vb[i]) * vb[i];
      }
      const double rel = tol == 0 ? num : std::sqrt(num / std::max(den, 1e-30));
      if (rel > worst || worst_name.empty()) {
        worst = rel;
        worst_name = ea.name;
      }
    }
    std::printf("%zu tensors; worst %s: %.3g%s\n", a.entries().size(), worst_name.c_str(), worst,
                tol == 0 ? " (squared difference)" : " relative");
    return worst <= tol ? 0 : 1;
  } catch (const fw::Error& e) {
    std::fprintf(stderr, "compare_weights: %s\n", e.what());
    return 1;
  }
}
