// Tensor<float, NotABackend>: the backend lacks allocate/deallocate/name/on_device.
#include "fourway/backend/host/backend.hpp"
#include "fourway/core/tensor.hpp"

struct NotABackend {};

#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
using B = fourway::Host;
#else
using B = NotABackend;
#endif

int main() {
  fourway::Tensor<float, B> t;
  return static_cast<int>(t.numel());
}
