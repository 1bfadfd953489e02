// compare_losses A.jsonl B.jsonl TOL: exit 0 when both fourway-train logs hold the same steps and
// every step's "loss" agrees within TOL relative; prints each pair.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

static std::vector<double> losses(const char* path) {
  std::ifstream in(path);
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("\"loss\":");
    if (at == std::string::npos) continue;
    out.push_back(std::strtod(line.c_str() + at + 7, nullptr));
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: compare_losses A.jsonl B.jsonl TOL\n");
    return 2;
  }
  const auto a = losses(argv[1]);
  const auto b = losses(argv[2]);
  const double tol = std::strtod(argv[3], nullptr);
  if (a.empty() || a.size() != b.size()) {
    std::fprintf(stderr, "step counts differ: %zu vs %zu\n", a.size(), b.size());
    return 1;
  }
  int bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double rel = std::abs(a[i] - b[i]) / std::abs(b[i]);
    std::printf("step %zu: %.9g vs %.9g (relative %.3g)\n", i + 1, a[i], b[i], rel);
    if (!(rel <= tol)) ++bad;
  }
  return bad == 0 ? 0 : 1;
}
