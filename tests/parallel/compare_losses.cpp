// compare_losses A.jsonl B.jsonl TOL: exit 0 when both fourway-train logs hold the same steps,
// every step's "loss" agrees within TOL relative, and so does every "val_loss" (--val-data):
// a step that has one in either log must have it in both. Prints each pair.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

/// `"key":` values, one per line (NaN where the line has none).
static std::vector<double> values(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::vector<double> out;
  const std::string k = "\"" + key + "\":";
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"loss\":") == std::string::npos) continue;
    const auto at = line.find(k);
    out.push_back(at == std::string::npos ? NAN
                                          : std::strtod(line.c_str() + at + k.size(), nullptr));
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: compare_losses A.jsonl B.jsonl TOL\n");
    return 2;
  }
  const double tol = std::strtod(argv[3], nullptr);
  int bad = 0;
  for (const char* key : {"loss", "val_loss"}) {
    const auto a = values(argv[1], key);
    const auto b = values(argv[2], key);
    if (a.empty() || a.size() != b.size()) {
      std::fprintf(stderr, "step counts differ: %zu vs %zu\n", a.size(), b.size());
      return 1;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;  // neither evaluated at this step
      const double rel = std::abs(a[i] - b[i]) / std::abs(b[i]);
      std::printf("step %zu: %s %.9g vs %.9g (relative %.3g)\n", i + 1, key, a[i], b[i], rel);
      if (!(rel <= tol)) ++bad;
    }
  }
  return bad == 0 ? 0 : 1;
}
