// fw::Decoder states each unit's contract with a static_assert beginning `fourway:` that names
// the missing member and the page: a Head without backward(ctx, stash, grad_scale) is the
// mistake here (the control build gives it one).
#include "../../examples/gptj/gptj.hpp"

namespace fw = fourway;

template <class T, class B, class Comm>
struct BadHead : gptj::Head<T, B, Comm> {
  using gptj::Head<T, B, Comm>::Head;
#ifndef FOURWAY_COMPILE_FAIL_CONTROL
  void backward() = delete;  // hides the head's backward(ctx, stash, grad_scale)
#endif
};

using M =
    fw::Decoder<gptj::Config, gptj::Embed, gptj::Block, BadHead, float, fw::Host, fw::LocalComm>;
static_assert(sizeof(M) > 0);
int main() { return 0; }
