// A stand-in for a layer's parameters in the optimizer tests: named weight + grad tensors with a
// decay flag, visited in a fixed order (the `visit_parameters` contract of docs/contracts.md).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/tensor.hpp"

namespace toy {
namespace fw = fourway;

template <class T>
struct Param {
  std::string name;
  fw::Tensor<T, fw::Host> weight;
  fw::Tensor<T, fw::Host> grad;
  bool decay = false;
  [[nodiscard]] std::int64_t numel() const { return weight.numel(); }
};

/// Parameters of the given shapes (1-D tensors do not decay), weights ~ U(-1, 1), grads ~ N(0, 1).
template <class T>
struct Params {
  std::vector<Param<T>> params;

  Params(fw::MemoryAccountant& mem, const std::vector<fw::Shape>& shapes, unsigned seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    int i = 0;
    for (const auto& s : shapes) {
      std::string name = "p";
      name += std::to_string(i++);
      Param<T> p{name, fw::Tensor<T, fw::Host>(s, fw::MemTag::weights, mem),
                 fw::Tensor<T, fw::Host>(s, fw::MemTag::grads, mem), s.rank() == 2};
      for (std::int64_t k = 0; k < p.weight.numel(); ++k) p.weight[k] = fw::convert<T>(u(gen));
      params.push_back(std::move(p));
    }
    randomize_grads(seed + 1, 1.0f);
  }
  void randomize_grads(unsigned seed, float scale) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& p : params) {
      for (std::int64_t k = 0; k < p.grad.numel(); ++k) p.grad[k] = fw::convert<T>(scale * n(gen));
    }
  }
  template <class F>
  void visit_parameters(F&& f) {
    for (auto& p : params) f(p);
  }
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 0;
    for (const auto& p : params) n += p.weight.numel();
    return n;
  }
};

}  // namespace toy
