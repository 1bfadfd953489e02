#include "fourway/layers/layer.hpp"

#include <gtest/gtest.h>

#include "fourway/layers/block.hpp"
#include "fourway/layers/checkpoint.hpp"
#include "fourway/layers/embedding.hpp"
#include "fourway/layers/sequential.hpp"

namespace fw = fourway;
using Host = fw::Host;

struct NotALayer {
  using value_type = float;
  using backend_type = Host;
};

TEST(LayerConcept, ModelsAndNonModels) {
  static_assert(fw::layer<fw::Linear<fw::fp16, Host>>);
  static_assert(fw::layer<fw::TransformerBlock<fw::bf16, Host>>);
  static_assert(fw::layer<fw::Checkpointed<fw::TransformerBlock<float, Host>>>);
  static_assert(fw::layer<fw::Embedding<float, Host>>);
  static_assert(!fw::activation_layer<fw::Embedding<float, Host>>);
  static_assert(fw::activation_layer<fw::Mlp<float, Host>>);
  static_assert(
      fw::layer<fw::Sequential<fw::Embedding<float, Host>, fw::TransformerBlock<float, Host>>>);
  static_assert(fw::layer<fw::Repeat<fw::TransformerBlock<float, Host>>>);
  static_assert(!fw::layer<int>);
  static_assert(!fw::layer<NotALayer>);
  SUCCEED();
}

TEST(LayerHelpers, ShapesAndRows) {
  EXPECT_EQ(fw::detail::with_last(fw::Shape{2, 3, 4}, 9), (fw::Shape{2, 3, 9}));
  EXPECT_EQ(fw::detail::rows_of(fw::Shape{2, 3, 4}, 4, "x"), 6);
  EXPECT_THROW((void)fw::detail::rows_of(fw::Shape{2, 3, 4}, 3, "x"), fw::ShapeError);
}
