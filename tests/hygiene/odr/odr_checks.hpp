// What each half of the mixed-mode program runs: a LocalWorld of 3 ranks doing all_reduce and
// all_gather over host memory, checked against sums in double, through the umbrella header.
// Included by both halves, so both instantiate the same templates: if the linker kept one body
// for both, the half that lost would run the other's code (the device half would no longer see
// device memory), and the symbol check (odr_symbols.cmake) would find the shared names.
#pragma once

#include <cmath>
#include <string>
#include <typeinfo>
#include <vector>

#include "fourway/fourway.hpp"
#include "odr_half.hpp"

// Internal linkage: these helpers read the mode of the unit that includes them, so they must not
// be inline functions with external linkage (the linker would keep one for both halves, which is
// what this program is about).
namespace odr {
namespace {

namespace fw = fourway;

std::string comm_namespace() {
  const std::string name =
      typeid(fw::LocalComm).name();  // mangled: ...host_unit... or ...cuda_unit...
  if (name.find("host_unit") != std::string::npos) return "host_unit";
  if (name.find("cuda_unit") != std::string::npos) return "cuda_unit";
  return "none (" + name + ")";
}

int host_collectives() {
  int failures = 0;
  constexpr int n = 3;
  constexpr int count = 37;
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    const int r = w.comm().rank();
    std::vector<float> x(count), sum(count), all(count * n);
    for (int i = 0; i < count; ++i) x[static_cast<std::size_t>(i)] = 0.25f * (r + 1) + 0.5f * i;
    w.comm().all_reduce(x.data(), sum.data(), count, fw::ReduceOp::sum);
    w.comm().all_gather(x.data(), all.data(), count);
    int bad = 0;
    for (int i = 0; i < count; ++i) {
      double want = 0;
      for (int q = 0; q < n; ++q) {
        const double v = 0.25 * (q + 1) + 0.5 * i;
        want += v;
        if (all[static_cast<std::size_t>(q * count + i)] != static_cast<float>(v)) ++bad;
      }
      if (std::abs(sum[static_cast<std::size_t>(i)] - want) > 1e-5 * std::abs(want)) ++bad;
    }
    if (r == 0) failures = bad;
  });
  return failures;
}

}  // namespace
}  // namespace odr
