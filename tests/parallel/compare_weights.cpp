// compare_weights A.safetensors B.safetensors TOL: exit 0 when both files hold the same tensors
// (names and shapes) and each agrees within TOL relative (L2 over the tensor); prints the worst.
// The attention key bias (the middle third of `attn.c_attn.bias`) has an exactly zero gradient,
// so its value is rounding noise that Adam scales to steps of about lr: it is held to an absolute
// 1e-2 (lr 3e-4 x a few steps) instead, the query and value thirds to TOL.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "fourway/train/safetensors.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: compare_weights A.safetensors B.safetensors TOL\n");
    return 2;
  }
  try {
    const auto a = fourway::SafetensorsFile::read(argv[1]);
    const auto b = fourway::SafetensorsFile::read(argv[2]);
    const double tol = std::strtod(argv[3], nullptr);
    if (a.entries().size() != b.entries().size()) {
      std::fprintf(stderr, "tensor counts differ: %zu vs %zu\n", a.entries().size(),
                   b.entries().size());
      return 1;
    }
    int bad = 0;
    double worst = 0.0;
    std::string worst_name;
    for (const auto& ea : a.entries()) {
      const auto* eb = b.find(ea.name);
      if (eb == nullptr || eb->shape != ea.shape) {
        std::fprintf(stderr, "%s: missing or shaped differently in %s\n", ea.name.c_str(), argv[2]);
        ++bad;
        continue;
      }
      auto va = a.read(ea);
      auto vb = b.read(*eb);
      if (ea.name.ends_with("attn.c_attn.bias")) {
        const std::size_t C = va.size() / 3;
        for (std::size_t i = C; i < 2 * C; ++i) {
          if (!(std::abs(va[i] - vb[i]) <= 1e-2)) {
            std::fprintf(stderr, "%s[%zu] (key bias): %g vs %g\n", ea.name.c_str(), i, va[i],
                         vb[i]);
            ++bad;
          }
        }
        va.erase(va.begin() + static_cast<std::ptrdiff_t>(C),
                 va.begin() + static_cast<std::ptrdiff_t>(2 * C));
        vb.erase(vb.begin() + static_cast<std::ptrdiff_t>(C),
                 vb.begin() + static_cast<std::ptrdiff_t>(2 * C));
      }
      double num = 0.0, den = 0.0;
      for (std::size_t i = 0; i < va.size(); ++i) {
        num += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
        den += double(vb[i]) * vb[i];
      }
      const double rel = std::sqrt(num / (den > 1e-30 ? den : 1e-30));
      if (rel > worst) {
        worst = rel;
        worst_name = ea.name;
      }
      if (!(rel <= tol)) {
        std::fprintf(stderr, "%s: relative difference %.3g > %.3g\n", ea.name.c_str(), rel, tol);
        ++bad;
      }
    }
    std::printf("%zu tensors, worst relative difference %.3g (%s)\n", a.entries().size(), worst,
                worst_name.c_str());
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_weights: %s\n", e.what());
    return 1;
  }
}
