//! `ParameterLayout<T, B>`: a model's parameters placed in the flat, sharded buffer of a
//! data-parallel strategy, and the rebinding of each `Parameter`'s weight and grad views.
//!
//! Built once from the model (`visit_parameters`, `units()`, `visit_unit_parameters`): a
//! parameter belongs to the segment of the *last* unit whose backward touches it (the tied `wte`
//! of the GPT: unit 0), so a segment's gradients are final after that unit's `post_backward`.
//! Segments are FSDP units under stage 3 (one per unit) and gradient buckets of `bucket_bytes`
//! otherwise, packed in backward order (last unit first, parameters in reverse visit order);
//! `per_unit` makes them units under stages 1-2 too (a pipeline's ZeRO-2, which reduces unit by
//! unit). In the per-unit layout a parameter the model marks `own_segment(i)` (optional member:
//! the pipeline's two copies of a tied embedding, whose reduced shards are summed element for
//! element) is a segment of its own, placed before the rest of its unit.
//! Stage 0 keeps one shard (everything on every rank); stages 1-3 split each segment over the
//! group. The layout holds pointers to the model's parameters, which must outlive it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/core/shape.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/mesh/policies.hpp"
#include "fourway/parallel/dp/flat_layout.hpp"

namespace fourway {

template <class T, class B>
class ParameterLayout {
 public:
  template <class Model>
  ParameterLayout(Model& model, int stage, int group_size, std::int64_t bucket_bytes,
                  bool per_unit = false)
      : layout_(build(model, stage, group_size, bucket_bytes, per_unit)) {}

  [[nodiscard]] const FlatLayout& flat() const { return layout_; }
  [[nodiscard]] int segment_count() const { return layout_.segment_count(); }
  [[nodiscard]] int units() const { return static_cast<int>(touch_.size()); }
  [[nodiscard]] std::size_t parameter_count() const { return params_.size(); }
  [[nodiscard]] Parameter<T, B>& parameter(int i) const {
    return *params_[static_cast<std::size_t>(i)];
  }
  [[nodiscard]] const Shape& shape(int i) const { return shapes_[static_cast<std::size_t>(i)]; }
  /// The segments unit `u` reads (stage 3) / adds gradients to (stages 2, 3), ascending.
  [[nodiscard]] const std::vector<int>& unit_segments(int u) const {
    return touch_.at(static_cast<std::size_t>(u));
  }
  /// The unit whose `post_backward` completes segment `s`'s gradients.
  [[nodiscard]] int ready_unit(int s) const { return ready_unit_[static_cast<std::size_t>(s)]; }
  /// The segment parameter `i` lies in.
  [[nodiscard]] int segment_of(int i) const { return segment_of_[static_cast<std::size_t>(i)]; }
  /// The index of parameter `p` (`visit_parameters` order), or -1 when it is not the model's.
  [[nodiscard]] int index_of(const Parameter<T, B>& p) const {
    const auto it = std::find(params_.begin(), params_.end(), &p);
    return it == params_.end() ? -1 : static_cast<int>(it - params_.begin());
  }

  /// Points the weights of segment `s`'s parameters into `segment_base` (the segment's first
  /// element), or at nothing when it is null.
  void bind_weights(int s, T* segment_base) const {
    bind(s, segment_base, &Parameter<T, B>::weight);
  }
  /// The same for the gradients.
  void bind_grads(int s, T* segment_base) const { bind(s, segment_base, &Parameter<T, B>::grad); }

 private:
  void bind(int s, T* base, Tensor<T, B> Parameter<T, B>::*member) const {
    const auto& seg = layout_.segment(s);
    for (const auto& slot : layout_.slots_of(s)) {
      auto& p = *params_[static_cast<std::size_t>(slot.param)];
      const Shape& shape = shapes_[static_cast<std::size_t>(slot.param)];
      p.*member = Tensor<T, B>::view_of(base ? base + (slot.offset - seg.offset) : nullptr, shape);
    }
  }

  template <class Model>
  FlatLayout build(Model& model, int stage, int size, std::int64_t bucket_bytes, bool per_unit) {
    check<ConfigError>(size >= 1, "fourway: data-parallel group of ", size, " ranks");
    std::unordered_map<const void*, int> index;
    model.visit_parameters([&](Parameter<T, B>& p) {
      index[&p] = static_cast<int>(params_.size());
      params_.push_back(&p);
      shapes_.push_back(p.weight.shape());
    });
    const int U = model.units();
    std::vector<int> last_unit(params_.size(), -1);
    std::vector<std::vector<int>> unit_params(static_cast<std::size_t>(U));
    for (int u = 0; u < U; ++u) {
      model.visit_unit_parameters(u, [&](Parameter<T, B>& p) {
        const int i = index.at(&p);
        unit_params[static_cast<std::size_t>(u)].push_back(i);
        auto& l = last_unit[static_cast<std::size_t>(i)];
        l = l < 0 ? u : std::min(l, u);
      });
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      check<ConfigError>(last_unit[i] >= 0, "fourway: parameter '", params_[i]->name,
                         "' belongs to no unit of the model; every parameter must be visited by "
                         "visit_unit_parameters");
    }
    const ZeroSharding sharding = zero_sharding(stage);
    std::vector<std::vector<std::pair<int, std::int64_t>>> segs;
    if (sharding.shards_params || per_unit) {
      for (int u = 0; u < U; ++u) {
        std::vector<std::pair<int, std::int64_t>> rest;
        bool alone_before = false;
        for (std::size_t i = 0; i < params_.size(); ++i) {
          if (last_unit[i] != u) continue;
          bool alone = false;
          if constexpr (requires { model.own_segment(0); })
            alone = model.own_segment(static_cast<int>(i));
          if (alone) {
            segs.push_back({{static_cast<int>(i), shapes_[i].numel()}});
            ready_unit_.push_back(u);
            alone_before = true;
          } else {
            rest.emplace_back(static_cast<int>(i), shapes_[i].numel());
          }
        }
        if (!rest.empty() || !alone_before) {
          segs.push_back(std::move(rest));
          ready_unit_.push_back(u);
        }
      }
    } else {
      std::vector<int> order;  // backward order: by last unit descending, then reverse visit
      for (int u = U - 1; u >= 0; --u) {
        for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
          if (last_unit[static_cast<std::size_t>(i)] == u) order.push_back(i);
        }
      }
      std::vector<std::int64_t> numels;
      numels.reserve(order.size());
      for (int i : order) numels.push_back(shapes_[static_cast<std::size_t>(i)].numel());
      for (const auto& bucket : plan_buckets(numels, bucket_bytes, sizeof(T))) {
        auto& seg = segs.emplace_back();
        int ready = U;
        for (int k : bucket) {
          const int i = order[static_cast<std::size_t>(k)];
          seg.emplace_back(i, numels[static_cast<std::size_t>(k)]);
          ready = std::min(ready, last_unit[static_cast<std::size_t>(i)]);
        }
        ready_unit_.push_back(ready);
      }
    }
    FlatLayout layout(segs, sharding.shards_optimizer_state ? size : 1);
    segment_of_.assign(params_.size(), 0);
    for (const auto& slot : layout.slots()) {
      segment_of_[static_cast<std::size_t>(slot.param)] = slot.segment;
    }
    touch_.assign(static_cast<std::size_t>(U), {});
    for (int u = 0; u < U; ++u) {
      auto& t = touch_[static_cast<std::size_t>(u)];
      for (int i : unit_params[static_cast<std::size_t>(u)]) {
        t.push_back(segment_of_[static_cast<std::size_t>(i)]);
      }
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
    }
    return layout;
  }

  std::vector<Parameter<T, B>*> params_;
  std::vector<Shape> shapes_;
  std::vector<int> ready_unit_;
  std::vector<int> segment_of_;
  std::vector<std::vector<int>> touch_;
  FlatLayout layout_;
};

}  // namespace fourway
