// One program, two compilation modes (config.hpp, "one definition per program"): this g++ half
// and odr_cuda.cu both use LocalWorld and the communicators through the umbrella header. Each half
// must see its own mode's LocalComm and pass its checks; main fails if either does not.
#include <cstdio>

#include "odr_checks.hpp"

HalfReport run_host_half() {
  return {odr::comm_namespace(), odr::host_collectives(), "host memory, 3 ranks"};
}

int main() {
  const HalfReport halves[] = {run_host_half(), run_cuda_half()};
  const char* expected[] = {"host_unit", "cuda_unit"};
  int rc = 0;
  for (int i = 0; i < 2; ++i) {
    const HalfReport& h = halves[i];
    const bool ok = h.mode == expected[i] && h.failures == 0;
    std::printf("%s half: LocalComm in %s (want %s), %d failed checks; %s\n",
                i == 0 ? "g++ " : "nvcc", h.mode.c_str(), expected[i], h.failures, h.notes.c_str());
    if (!ok) rc = 1;
  }
  return rc;
}
