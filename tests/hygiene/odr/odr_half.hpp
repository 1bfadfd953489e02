// The two halves of the mixed-mode program: one compiled by g++ (odr_host.cpp), one by nvcc
// (odr_cuda.cu). Nothing of fourway crosses between them; each half reports what it checked.
#pragma once

#include <string>

struct HalfReport {
  std::string mode;   // the inline namespace LocalComm lives in, as this half sees it
  int failures = 0;   // checks against the double reference that failed
  std::string notes;  // what ran, what did not
};

HalfReport run_host_half();
HalfReport run_cuda_half();
