//! A small command-line parser for fourway's programs: `--name value`, `--name=value`, switches.
//! A tool for programs (`fourway::tools`), not part of the training library.
//!
//! Each flag is registered once with the variable it writes, so adding a flag is one line. An
//! unknown flag, a missing or malformed value, or a value outside a flag's choices throws
//! `ConfigError` naming the flag (and, for a typo, the closest known flag); nothing is ignored.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"

namespace fourway::tools {

class ArgParser {
 public:
  ArgParser(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  /// A flag that takes a value: integers, floating point or strings.
  template <class V>
  ArgParser& add(std::string name, V* target, std::string metavar, std::string help) {
    std::ostringstream def;
    def << *target;
    Flag f{std::move(name), std::move(metavar), std::move(help), def.str(), false, {}, {}, {}};
    const std::string flag_name = f.name;
    f.set = [target, flag_name](std::string_view v) { *target = parse_value<V>(flag_name, v); };
    flags_.push_back(std::move(f));
    return *this;
  }

  /// A string flag restricted to `choices`.
  ArgParser& add_choice(std::string name, std::string* target,
                        const std::vector<std::string>& choices, std::string help) {
    std::string meta;
    for (const auto& c : choices) meta += (meta.empty() ? "" : "|") + c;
    Flag f{std::move(name), meta, std::move(help), *target, false, {}, choices, {}};
    const std::string flag_name = f.name;
    f.set = [target, flag_name, choices](std::string_view v) {
      const bool ok = std::find(choices.begin(), choices.end(), v) != choices.end();
      std::string list;
      for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
      check<ConfigError>(ok, "fourway: --", flag_name, " must be one of ", list, ", got '", v, "'");
      *target = std::string(v);
    };
    flags_.push_back(std::move(f));
    return *this;
  }

  /// A string flag restricted to `choices` whose value may be left out: `--name` alone (followed
  /// by another flag or nothing) means `bare`; a value is taken only when it is one of `choices`.
  ArgParser& add_choice_or_bare(std::string name, std::string* target,
                                const std::vector<std::string>& choices, std::string bare,
                                std::string help) {
    add_choice(std::move(name), target, choices, std::move(help));
    flags_.back().metavar = "[" + flags_.back().metavar + "]";
    flags_.back().bare = std::move(bare);
    return *this;
  }

  /// A switch without a value: present means true.
  ArgParser& add_switch(std::string name, bool* target, std::string help) {
    Flag f{std::move(name), "", std::move(help), "", true, {}, {}, {}};
    f.set = [target](std::string_view) { *target = true; };
    flags_.push_back(std::move(f));
    return *this;
  }

  /// Parses `argv[1..argc)`. Returns false when `--help` was given (the caller prints `help()`).
  bool parse(int argc, const char* const* argv) {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") return false;
      check<ConfigError>(a.size() > 2 && a.substr(0, 2) == "--", "fourway: unexpected argument '",
                         a, "'; flags start with --, see ", program_, " --help");
      a.remove_prefix(2);
      std::string_view value;
      bool has_value = false;
      if (const auto eq = a.find('='); eq != std::string_view::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
      Flag* f = find(a);
      if (f == nullptr) {
        std::string msg = detail::cat("fourway: unknown flag --", a);
        if (const auto near = closest(a); !near.empty())
          msg += detail::cat("; did you mean --", near, "?");
        throw ConfigError(msg + detail::cat(" (see ", program_, " --help)"));
      }
      check<ConfigError>(!seen_.contains(f->name), "fourway: --", f->name, " given twice");
      if (f->is_switch) {
        check<ConfigError>(!has_value, "fourway: --", f->name, " takes no value");
      } else if (!has_value && !f->bare.empty()) {
        const bool next =
            i + 1 < argc && std::find(f->choices.begin(), f->choices.end(),
                                      std::string_view(argv[i + 1])) != f->choices.end();
        value = next ? std::string_view(argv[++i]) : std::string_view(f->bare);
      } else if (!has_value) {
        check<ConfigError>(i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--",
                           "fourway: --", f->name, " needs a value (", f->metavar, ")");
        value = argv[++i];
      }
      f->set(value);
      seen_.insert(f->name);
    }
    return true;
  }

  /// True when the flag was on the command line.
  [[nodiscard]] bool given(std::string_view name) const {
    return seen_.contains(std::string(name));
  }

  [[nodiscard]] std::string help() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
    for (const auto& f : flags_) {
      std::string left = "  --" + f.name + (f.is_switch ? "" : " " + f.metavar);
      os << left;
      if (left.size() < 34)
        os << std::string(34 - left.size(), ' ');
      else
        os << "\n" << std::string(34, ' ');
      os << f.help;
      if (!f.is_switch && !f.default_text.empty()) os << " [" << f.default_text << "]";
      os << "\n";
    }
    os << "  --help                          this text\n";
    return os.str();
  }

 private:
  struct Flag {
    std::string name, metavar, help, default_text;
    bool is_switch = false;
    std::function<void(std::string_view)> set;
    std::vector<std::string> choices;
    std::string bare;  // add_choice_or_bare: the value of the flag given alone
  };

  template <class V>
  static V parse_value(const std::string& flag, std::string_view v) {
    if constexpr (std::is_same_v<V, std::string>) {
      check<ConfigError>(!v.empty(), "fourway: --", flag, " needs a non-empty value");
      return std::string(v);
    } else {
      V out{};
      const char* end = v.data() + v.size();
      auto [p, ec] = std::from_chars(v.data(), end, out);
      check<ConfigError>(ec == std::errc() && p == end && !v.empty(), "fourway: --", flag,
                         " expects ", std::is_integral_v<V> ? "an integer" : "a number", ", got '",
                         v, "'");
      if constexpr (std::is_floating_point_v<V>) {
        check<ConfigError>(std::isfinite(out), "fourway: --", flag, " must be finite, got '", v,
                           "'");
      }
      return out;
    }
  }

  Flag* find(std::string_view name) {
    for (auto& f : flags_) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  std::string closest(std::string_view a) const {
    std::string best;
    std::size_t best_d = 3;  // suggest only near misses
    for (const auto& f : flags_) {
      const std::string_view b = f.name;
      std::vector<std::size_t> row(b.size() + 1);
      for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
      for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diag = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
          const std::size_t up = row[j];
          row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0u : 1u)});
          diag = up;
        }
      }
      if (row[b.size()] < best_d) {
        best_d = row[b.size()];
        best = f.name;
      }
    }
    if (best.empty()) {  // "--lr-max" -> "--lr": the longest flag the argument starts with
      for (const auto& f : flags_) {
        if (a.substr(0, f.name.size()) == f.name && f.name.size() > best.size()) best = f.name;
      }
    }
    return best;
  }

  std::string program_, summary_;
  std::vector<Flag> flags_;
  std::set<std::string> seen_;
};

}  // namespace fourway::tools
