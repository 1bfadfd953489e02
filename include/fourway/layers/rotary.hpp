//! `Rotary<T, B>`: rotary position embedding (Su et al. 2021), "rotate half" convention as
//! GPT-NeoX / Hugging Face Llama, applied in place to the heads of rows of a tensor.
//!
//! Not a `layer`: it has no parameters and no stash. The rotation is linear and in place, so the
//! caller keeps the rotated tensor (the attention's q and k) and `backward` rotates the gradient
//! of that tensor back in place. Row r of x (viewed as (rows, row_stride)) is at position
//! r % seq and holds `heads` heads of `head_size` from its start; the rest of the row (v in a
//! packed q|k|v buffer: heads = 2·NH, row_stride = 3·C) is left alone. With a `SequenceShard`
//! that splits sequences (context parallelism), the `seq` rows of each sequence are this rank's
//! part of it and each turns by its position in the whole sequence (the shard's runs of
//! consecutive positions, layers/sequence_shard.hpp), so every rank rotates as the unsplit
//! sequence would.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/layers/layer.hpp"
#include "fourway/layers/sequence_shard.hpp"

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
               std::int64_t heads, const SequenceShard<T, B>* shard = nullptr) const {
    const std::int64_t rows = rows_of(x, seq, row_stride, heads, "forward");
    turn(x.data(), rows, seq, row_stride, shard,
         [&](T* p, std::int64_t n, std::int64_t s, std::int64_t first) {
           Ops<B>::rope_forward(ctx, p, n, s, row_stride, heads, head_size_, theta_, first);
         });
  }

  void backward(const Context<B>& ctx, Tensor<T, B>& dx, std::int64_t seq, std::int64_t row_stride,
                std::int64_t heads, const SequenceShard<T, B>* shard = nullptr) const {
    const std::int64_t rows = rows_of(dx, seq, row_stride, heads, "backward");
    turn(dx.data(), rows, seq, row_stride, shard,
         [&](T* p, std::int64_t n, std::int64_t s, std::int64_t first) {
           Ops<B>::rope_backward(ctx, p, n, s, row_stride, heads, head_size_, theta_, first);
         });
  }

  [[nodiscard]] std::int64_t head_size() const { return head_size_; }
  [[nodiscard]] float theta() const { return theta_; }

 private:
  /// Calls `kernel(rows_ptr, rows, seq, first_position)`: once over every row when the rows are
  /// whole sequences, else once per sequence and run of consecutive positions of the shard.
  template <class Kernel>
  static void turn(T* x, std::int64_t rows, std::int64_t seq, std::int64_t row_stride,
                   const SequenceShard<T, B>* shard, Kernel&& kernel) {
    if (!splits_sequences(shard)) {
      kernel(x, rows, seq, std::int64_t{0});
      return;
    }
    const std::vector<PositionRun> runs = position_runs(shard, seq);
    for (std::int64_t b = 0; b < rows / seq; ++b)
      for (const PositionRun& r : runs)
        kernel(x + (b * seq + r.row) * row_stride, r.rows, r.rows, r.position);
  }

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
