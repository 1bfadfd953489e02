// Tensor<char, Host>: char has no dtype_of, so no collective or file format could describe it.
#include "fourway/backend/host/backend.hpp"
#include "fourway/core/tensor.hpp"

#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
using Element = std::uint8_t;
#else
using Element = char;
#endif

int main() {
  fourway::Tensor<Element, fourway::Host> t;
  return static_cast<int>(t.numel());
}
