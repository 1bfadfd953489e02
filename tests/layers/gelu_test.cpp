#include "fourway/layers/gelu.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(Gelu, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::Gelu<float, Host> g;
  fw::test::check_layer_gradients(
      g, {3, 11}, [](const ref::Params&, const ref::Vec& x) { return ref::gelu(x); });
}

TEST(Gelu, HasNoParameters) {
  fw::Gelu<float, Host> g;
  int n = 0;
  g.visit_parameters([&](auto&) { ++n; });
  EXPECT_EQ(n, 0);
}
