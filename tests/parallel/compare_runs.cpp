// compare_runs RUN.jsonl REF.jsonl RUN.safetensors REF.safetensors TOL
//
// Compares a fourway-train run (MPI processes) with the reference run (LocalWorld threads) of the
// same flags, on everything the two must share, and exits 1 naming each part that differs:
//   losses      every step within TOL relative, and its validation loss (--val-data) where
//               either run evaluated;
//   comm        the modelled ring bytes and the payload of every step, exactly (same calls);
//   memory      the model-state bytes by tag (weights, grads, master_weights, optimizer_state)
//               of every rank the run's log holds, exactly, against the same rank of the reference;
//   parameters  every tensor of the saved weights: same names and shapes, a checksum (the sum of
//               the values) within TOL of the reference's relative to the sum of magnitudes, and
//               the largest element difference within TOL of the tensor's largest magnitude.
// The key third of each c_attn.bias is left out of the parameters: its true gradient is zero, so
// Adam turns rounding noise into steps of ~lr whose sign depends on summation order (the gradient
// is checked directly by Gpt.KeyBiasGradientIsZero in tests/layers/gpt_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fourway/checkpoint/safetensors.hpp"

namespace {

std::vector<std::string> lines_of(const char* path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"step\":") != std::string::npos) out.push_back(line);
  }
  return out;
}

/// The number after `"key":` at or after `from`, or NaN when the key is absent.
double field(const std::string& s, const std::string& key, std::size_t from = 0,
             std::size_t until = std::string::npos) {
  const auto at = s.find("\"" + key + "\":", from);
  if (at == std::string::npos || at >= until) return std::nan("");
  return std::strtod(s.c_str() + at + key.size() + 3, nullptr);
}

/// rank -> model-state bytes by tag, from a log line's "memory" array.
std::map<int, std::vector<double>> model_state(const std::string& line) {
  static const char* tags[] = {"weights", "grads", "master_weights", "optimizer_state"};
  std::map<int, std::vector<double>> out;
  for (auto at = line.find("{\"rank\":"); at != std::string::npos;
       at = line.find("{\"rank\":", at + 1)) {
    const int rank = static_cast<int>(field(line, "rank", at));
    const auto cur = line.find("\"current\":{", at);
    const auto end = line.find('}', cur);
    auto& v = out[rank];
    for (const char* t : tags) v.push_back(field(line, t, cur, end));
  }
  return out;
}

bool key_bias(const std::string& name, std::size_t i, std::size_t n) {
  return name.find("attn.c_attn.bias") != std::string::npos && i >= n / 3 && i < 2 * n / 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: compare_runs RUN.jsonl REF.jsonl RUN.safetensors "
                 "REF.safetensors TOL\n");
    return 2;
  }
  const auto run = lines_of(argv[1]);
  const auto ref = lines_of(argv[2]);
  const double tol = std::strtod(argv[5], nullptr);
  std::vector<std::string> differ;

  // ---- losses and communication, step by step
  if (run.empty() || run.size() != ref.size()) {
    std::printf("step counts differ: %zu vs %zu\n", run.size(), ref.size());
    differ.emplace_back("steps");
  }
  double worst_loss = 0.0;
  int comm_bad = 0;
  for (std::size_t i = 0; i < std::min(run.size(), ref.size()); ++i) {
    const double a = field(run[i], "loss"), b = field(ref[i], "loss");
    const double rel = std::abs(a - b) / std::abs(b);
    std::printf("step %zu: loss %.9g vs %.9g (relative %.3g)\n", i + 1, a, b, rel);
    worst_loss = std::max(worst_loss, std::isnan(rel) ? INFINITY : rel);
    const double va = field(run[i], "val_loss"), vb = field(ref[i], "val_loss");
    if (!std::isnan(va) || !std::isnan(vb)) {  // --val-data: evaluated at this step
      const double vrel = std::abs(va - vb) / std::abs(vb);
      std::printf("step %zu: val_loss %.9g vs %.9g (relative %.3g)\n", i + 1, va, vb, vrel);
      worst_loss = std::max(worst_loss, std::isnan(vrel) ? INFINITY : vrel);
    }
    for (const char* k : {"comm_modelled_bytes_per_rank", "comm_payload_bytes_per_rank"}) {
      const double x = field(run[i], k), y = field(ref[i], k);
      if (!(x == y)) {
        std::printf("step %zu: %s %.0f vs %.0f\n", i + 1, k, x, y);
        ++comm_bad;
      }
    }
  }
  if (!(worst_loss <= tol)) differ.emplace_back("losses");
  if (comm_bad > 0) differ.emplace_back("communication");

  // ---- memory of every rank the run's log holds, at the last step
  int ranks = 0, mem_bad = 0;
  if (!run.empty() && !ref.empty()) {
    const auto a = model_state(run.back());
    const auto b = model_state(ref.back());
    for (const auto& [rank, bytes] : a) {
      const auto it = b.find(rank);
      ++ranks;
      if (it == b.end() || it->second != bytes) {
        std::printf(
            "rank %d: model-state bytes (weights, grads, master, optimizer) %.0f %.0f %.0f "
            "%.0f vs %.0f %.0f %.0f %.0f\n",
            rank, bytes[0], bytes[1], bytes[2], bytes[3], it == b.end() ? -1.0 : it->second[0],
            it == b.end() ? -1.0 : it->second[1], it == b.end() ? -1.0 : it->second[2],
            it == b.end() ? -1.0 : it->second[3]);
        ++mem_bad;
      }
    }
  }
  std::printf("memory: %d rank(s) compared, %d differ\n", ranks, mem_bad);
  if (ranks == 0 || mem_bad > 0) differ.emplace_back("memory");

  // ---- parameters
  try {
    const auto fa = fourway::SafetensorsFile::read(argv[3]);
    const auto fb = fourway::SafetensorsFile::read(argv[4]);
    int tensors = 0, bitwise = 0, bad = 0;
    double worst = 0.0;
    std::string worst_name;
    if (fa.entries().size() != fb.entries().size()) ++bad;
    for (const auto& eb : fb.entries()) {
      const auto* ea = fa.find(eb.name);
      if (ea == nullptr || ea->shape != eb.shape) {
        std::printf("parameter %s: missing or of another shape\n", eb.name.c_str());
        ++bad;
        continue;
      }
      const auto a = fa.read<float>(*ea);
      const auto b = fb.read<float>(eb);
      ++tensors;
      if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) ++bitwise;
      double sum_a = 0, sum_b = 0, mag = 0, big = 0, diff = 0;
      for (std::size_t i = 0; i < b.size(); ++i) {
        if (key_bias(eb.name, i, b.size())) continue;
        sum_a += a[i];
        sum_b += b[i];
        mag += std::abs(b[i]);
        big = std::max(big, std::abs(double(b[i])));
        diff = std::max(diff, std::abs(double(a[i]) - b[i]));
      }
      const double rel = diff / std::max(big, 1e-30);
      const bool ok = std::abs(sum_a - sum_b) <= tol * mag && rel <= tol;
      if (!ok) {
        std::printf("parameter %s: checksum %.9g vs %.9g, largest difference %.3g relative\n",
                    eb.name.c_str(), sum_a, sum_b, rel);
        ++bad;
      }
      if (rel >= worst) {
        worst = rel;
        worst_name = eb.name;
      }
    }
    std::printf("parameters: %d tensors, %d bitwise equal, largest relative difference %.3g (%s)\n",
                tensors, bitwise, worst, worst_name.c_str());
    if (bad > 0 || tensors == 0) differ.emplace_back("parameters");
  } catch (const std::exception& e) {
    std::printf("parameters: %s\n", e.what());
    differ.emplace_back("parameters");
  }

  if (differ.empty()) {
    std::printf("runs agree: losses, communication, memory and parameters\n");
    return 0;
  }
  std::printf("runs differ in:");
  for (const auto& d : differ) std::printf(" %s", d.c_str());
  std::printf("\n");
  return 1;
}
