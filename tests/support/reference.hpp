//! Test-only double-precision reference of GPT-2's pieces, written as plain loops independent of
//! the kernels and layers under test, plus finite differences over it.
//!
//! Layouts are the library's: row-major, Linear weights (in, out), qkv (B, T, 3C) with q|k|v.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fourway::test::ref {

using Vec = std::vector<double>;

inline Vec linear(const Vec& x, const Vec& w, const Vec* b, std::int64_t rows, std::int64_t in,
                  std::int64_t out) {
  Vec y(static_cast<std::size_t>(rows * out), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[i * out + o];
      y[r * out + o] = s;
    }
  }
  return y;
}

inline Vec layernorm(const Vec& x, const Vec& w, const Vec& b, std::int64_t rows, std::int64_t C,
                     double eps = 1e-5) {
  Vec y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0.0;
    for (std::int64_t c = 0; c < C; ++c) mean += x[r * C + c];
    mean /= static_cast<double>(C);
    double var = 0.0;
    for (std::int64_t c = 0; c < C; ++c) var += (x[r * C + c] - mean) * (x[r * C + c] - mean);
    var /= static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (std::int64_t c = 0; c < C; ++c) y[r * C + c] = (x[r * C + c] - mean) * rstd * w[c] + b[c];
  }
  return y;
}

inline Vec gelu(const Vec& x) {
  Vec y(x.size());
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  for (std::size_t i = 0; i < x.size(); ++i) {
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  }
  return y;
}

inline Vec add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

/// Causal multi-head attention on qkv (B, T, 3C) -> (B, T, C).
inline Vec attention(const Vec& qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                     std::int64_t NH) {
  const std::int64_t hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec out(static_cast<std::size_t>(B * T * C), 0.0);
  std::vector<double> p(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      for (std::int64_t t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
        double mx = -1e300;
        for (std::int64_t s = 0; s <= t; ++s) {
          const double* k = &qkv[(b * T + s) * 3 * C + C + h * hs];
          double d = 0.0;
          for (std::int64_t i = 0; i < hs; ++i) d += q[i] * k[i];
          p[s] = d * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0.0;
        for (std::int64_t s = 0; s <= t; ++s) sum += (p[s] = std::exp(p[s] - mx));
        for (std::int64_t s = 0; s <= t; ++s) {
          const double* v = &qkv[(b * T + s) * 3 * C + 2 * C + h * hs];
          for (std::int64_t i = 0; i < hs; ++i)
            out[(b * T + t) * C + h * hs + i] += p[s] / sum * v[i];
        }
      }
    }
  }
  return out;
}

inline Vec embedding(const std::vector<std::int32_t>& tokens, const Vec& wte, const Vec& wpe,
                     std::int64_t B, std::int64_t T, std::int64_t C) {
  Vec y(static_cast<std::size_t>(B * T * C));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t c = 0; c < C; ++c) {
        y[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
      }
    }
  }
  return y;
}

/// Mean over rows of -log softmax(logits[r])[targets[r]].
inline double cross_entropy(const Vec& logits, const std::vector<std::int32_t>& targets,
                            std::int64_t rows, std::int64_t V) {
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -1e300;
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[r * V + v]);
    double sum = 0.0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(logits[r * V + v] - mx);
    total += std::log(sum) + mx - logits[r * V + targets[r]];
  }
  return total / static_cast<double>(rows);
}

/// Parameters by Hugging Face name.
using Params = std::map<std::string, Vec>;

inline Vec mlp(const Params& p, const std::string& pre, const Vec& x, std::int64_t rows,
               std::int64_t C) {
  const Vec h =
      gelu(linear(x, p.at(pre + "c_fc.weight"), &p.at(pre + "c_fc.bias"), rows, C, 4 * C));
  return linear(h, p.at(pre + "c_proj.weight"), &p.at(pre + "c_proj.bias"), rows, 4 * C, C);
}

inline Vec self_attention(const Params& p, const std::string& pre, const Vec& x, std::int64_t B,
                          std::int64_t T, std::int64_t C, std::int64_t NH) {
  const Vec qkv =
      linear(x, p.at(pre + "c_attn.weight"), &p.at(pre + "c_attn.bias"), B * T, C, 3 * C);
  const Vec a = attention(qkv, B, T, C, NH);
  return linear(a, p.at(pre + "c_proj.weight"), &p.at(pre + "c_proj.bias"), B * T, C, C);
}

/// One pre-LayerNorm GPT-2 block "pre" (e.g. "h.0.").
inline Vec block(const Params& p, const std::string& pre, const Vec& x, std::int64_t B,
                 std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t rows = B * T;
  const Vec r = add(
      x, self_attention(p, pre + "attn.",
                        layernorm(x, p.at(pre + "ln_1.weight"), p.at(pre + "ln_1.bias"), rows, C),
                        B, T, C, NH));
  return add(
      r, mlp(p, pre + "mlp.",
             layernorm(r, p.at(pre + "ln_2.weight"), p.at(pre + "ln_2.bias"), rows, C), rows, C));
}

inline double gpt_loss(const Params& p, const std::vector<std::int32_t>& tokens,
                       const std::vector<std::int32_t>& targets, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH, std::int64_t V, int layers) {
  Vec x = embedding(tokens, p.at("wte.weight"), p.at("wpe.weight"), B, T, C);
  for (int i = 0; i < layers; ++i) x = block(p, "h." + std::to_string(i) + ".", x, B, T, C, NH);
  x = layernorm(x, p.at("ln_f.weight"), p.at("ln_f.bias"), B * T, C);
  const Vec& wte = p.at("wte.weight");
  Vec logits(static_cast<std::size_t>(B * T * V), 0.0);
  for (std::int64_t r = 0; r < B * T; ++r) {
    for (std::int64_t v = 0; v < V; ++v) {
      double s = 0.0;
      for (std::int64_t c = 0; c < C; ++c) s += x[r * C + c] * wte[v * C + c];
      logits[r * V + v] = s;
    }
  }
  return cross_entropy(logits, targets, B * T, V);
}

/// Central differences of f with respect to every element of `v` (restored afterwards).
inline Vec finite_difference(Vec& v, const std::function<double()>& f, double h = 1e-5) {
  Vec g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double fp = f();
    v[i] = keep - h;
    const double fm = f();
    v[i] = keep;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

/// Σ y·r, the scalar whose gradient with respect to y is r.
inline double dot(const Vec& y, const Vec& r) {
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

}  // namespace fourway::test::ref
