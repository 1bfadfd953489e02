//! `Rotary<T, B>`: rotary position embedding (Su et al. 2021), "rotate half" convention as
//! GPT-NeoX / Hugging Face Llama, applied in place to the heads of rows of a tensor.
//!
//! Not a `layer`: it has no parameters and no stash. The rotation is linear and in place, so the
//! caller keeps the rotated tensor (the attention's q and k) and `backward` rotates the gradient
//! of that tensor back in place. Row r of x (viewed as (rows, row_stride)) is at position
//! r % seq and holds `heads` heads of `head_size` from its start; the rest of the row (v in a
//! packed q|k|v buffer: heads = 2·NH, row_stride = 3·C) is left alone.
#pragma once

#include <cstdint>

#include "fourway/layers/layer.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class Rotary {
 public:
  using value_type = T;
  using backend_type = B;

  explicit Rotary(std::int64_t head_size, float theta = 10000.0f)
      : head_size_(head_size), theta_(theta) {
    check<ShapeError>(head_size > 0 && head_size % 2 == 0,
                      "fourway: Rotary needs an even head_size > 0, got ", head_size);
  }

  void forward(const Context<B>& ctx, Tensor<T, B>& x, std::int64_t seq, std::int64_t row_stride,
               std::int64_t heads) const {
    const std::int64_t rows = rows_of(x, seq, row_stride, heads, "forward");
    Ops<B>::rope_forward(ctx, x.data(), rows, seq, row_stride, heads, head_size_, theta_);
  }

  void backward(const Context<B>& ctx, Tensor<T, B>& dx, std::int64_t seq, std::int64_t row_stride,
                std::int64_t heads) const {
    const std::int64_t rows = rows_of(dx, seq, row_stride, heads, "backward");
    Ops<B>::rope_backward(ctx, dx.data(), rows, seq, row_stride, heads, head_size_, theta_);
  }

  [[nodiscard]] std::int64_t head_size() const { return head_size_; }
  [[nodiscard]] float theta() const { return theta_; }

 private:
  std::int64_t rows_of(const Tensor<T, B>& x, std::int64_t seq, std::int64_t row_stride,
                       std::int64_t heads, const char* what) const {
    check<ShapeError>(row_stride > 0 && x.numel() % row_stride == 0 && seq > 0 && heads > 0 &&
                          heads * head_size_ <= row_stride,
                      "fourway: Rotary ", what, " of ", x.shape().str(), " needs numel a ",
                      "multiple of row_stride=", row_stride, ", seq > 0 (", seq,
                      ") and heads·head_size (", heads, "·", head_size_, ") ≤ row_stride");
    return x.numel() / row_stride;
  }

  std::int64_t head_size_;
  float theta_;
};

}  // namespace fourway
