// Repeat of a layer whose input is token ids (it cannot feed itself) must fail.
#include "fourway/layers/embedding.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/layers/sequential.hpp"

namespace fw = fourway;

#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using R = fw::Repeat<fw::Linear<float, fw::Host>>;
#else
using R = fw::Repeat<fw::Embedding<float, fw::Host>>;
#endif
int main() { return sizeof(R) > 0 ? 0 : 1; }
