#include "fourway/core/memory.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/tensor.hpp"

namespace fw = fourway;

namespace {

constexpr std::array kTags = {fw::MemTag::weights,        fw::MemTag::grads,
                              fw::MemTag::master_weights, fw::MemTag::optimizer_state,
                              fw::MemTag::activations,    fw::MemTag::comm_buffers,
                              fw::MemTag::workspace};
static_assert(kTags.size() == fw::mem_tag_count);

/// A strict little JSON reader for what the accountant writes: objects, strings without escapes,
/// non-negative integers. Anything else (trailing commas, missing quotes, junk) throws.
struct Json {
  bool is_object = false;
  std::uint64_t number = 0;
  std::map<std::string, Json> members;
};

class JsonReader {
 public:
  explicit JsonReader(std::string text) : s_(std::move(text)) {}
  Json document() {
    Json v = value();
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("bad JSON at offset " + std::to_string(i_) + ": " + why);
  }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string() {
    expect('"');
    const auto end = s_.find('"', i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(i_, end - i_);
    if (out.find('\\') != std::string::npos) fail("escape in key");
    i_ = end + 1;
    return out;
  }
  Json value() {
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    if (s_[i_] == '{') {
      v.is_object = true;
      ++i_;
      skip_ws();
      if (s_[i_] == '}') {
        ++i_;
        return v;
      }
      while (true) {
        std::string key = string();
        expect(':');
        if (v.members.count(key)) fail("duplicate key " + key);
        v.members[key] = value();
        skip_ws();
        if (s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (!std::isdigit(static_cast<unsigned char>(s_[i_]))) fail("expected a value");
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v.number = v.number * 10 + static_cast<std::uint64_t>(s_[i_] - '0');
      ++i_;
    }
    return v;
  }
  std::string s_;
  std::size_t i_ = 0;
};

}  // namespace

TEST(MemoryAccountant, CountsAllocationsAndFreesExactly) {
  fw::MemoryAccountant m(2);
  EXPECT_EQ(m.rank(), 2);
  m.on_alloc(fw::MemTag::weights, 1000);
  m.on_alloc(fw::MemTag::grads, 300);
  m.on_alloc(fw::MemTag::weights, 24);
  EXPECT_EQ(m.current(fw::MemTag::weights), 1024u);
  EXPECT_EQ(m.current(fw::MemTag::grads), 300u);
  EXPECT_EQ(m.current(fw::MemTag::workspace), 0u);
  EXPECT_EQ(m.total_current(), 1324u);
  EXPECT_EQ(m.allocations(), 3u);
  m.on_free(fw::MemTag::weights, 1000);
  EXPECT_EQ(m.current(fw::MemTag::weights), 24u);
  EXPECT_EQ(m.peak(fw::MemTag::weights), 1024u);
  EXPECT_EQ(m.total_current(), 324u);
  EXPECT_EQ(m.total_peak(), 1324u);
}

TEST(MemoryAccountant, TotalPeakIsHighWaterOfTheSumNotSumOfPeaks) {
  fw::MemoryAccountant m;
  m.on_alloc(fw::MemTag::activations, 500);  // phase 1: activations only
  m.on_free(fw::MemTag::activations, 500);
  m.on_alloc(fw::MemTag::workspace, 300);  // phase 2: workspace only
  m.on_free(fw::MemTag::workspace, 300);
  EXPECT_EQ(m.peak(fw::MemTag::activations), 500u);
  EXPECT_EQ(m.peak(fw::MemTag::workspace), 300u);
  EXPECT_EQ(m.total_peak(), 500u);  // never 800: they were not alive together
  EXPECT_EQ(m.total_current(), 0u);
}

TEST(MemoryAccountant, ResetPeakStartsFromTheCurrentState) {
  fw::MemoryAccountant m;
  m.on_alloc(fw::MemTag::optimizer_state, 800);
  m.on_alloc(fw::MemTag::comm_buffers, 200);
  m.on_free(fw::MemTag::comm_buffers, 200);
  m.reset_peak();
  EXPECT_EQ(m.peak(fw::MemTag::comm_buffers), 0u);
  EXPECT_EQ(m.peak(fw::MemTag::optimizer_state), 800u);
  EXPECT_EQ(m.total_peak(), 800u);
  m.on_alloc(fw::MemTag::comm_buffers, 50);
  EXPECT_EQ(m.total_peak(), 850u);
}

TEST(MemoryAccountant, FreeingMoreThanAllocatedIsAnErrorNamingTheNumbers) {
  fw::MemoryAccountant m(5);
  m.on_alloc(fw::MemTag::grads, 10);
  try {
    m.on_free(fw::MemTag::grads, 11);
    FAIL() << "expected fw::Error";
  } catch (const fw::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 5"), std::string::npos) << what;
    EXPECT_NE(what.find("11 B"), std::string::npos) << what;
    EXPECT_NE(what.find("grads"), std::string::npos) << what;
    EXPECT_NE(what.find("10 B"), std::string::npos) << what;
  }
  EXPECT_EQ(m.current(fw::MemTag::grads), 10u);  // a refused free changes nothing
}

TEST(MemoryAccountant, TensorsMovesAndViewsAreCountedExactly) {
  fw::MemoryAccountant m;
  using F = fw::Tensor<float, fw::Host>;
  using H = fw::Tensor<fw::bf16, fw::Host>;
  F w({3, 7}, fw::MemTag::weights, m);          // 84 B
  H g({3, 7}, fw::MemTag::grads, m);            // 42 B
  F mw({3, 7}, fw::MemTag::master_weights, m);  // 84 B
  EXPECT_EQ(m.total_current(), 210u);
  EXPECT_EQ(m.allocations(), 3u);
  {
    const F v = w.view({21});
    const F s = w.slice(5, {2, 3});
    const F v2 = s.view({6});
    EXPECT_EQ(m.total_current(), 210u);
    EXPECT_EQ(m.allocations(), 3u);
  }
  EXPECT_EQ(m.total_current(), 210u);  // destroying views gives nothing back
  F moved = std::move(w);
  EXPECT_EQ(m.current(fw::MemTag::weights), 84u);
  EXPECT_EQ(m.allocations(), 3u);
  F target({5}, fw::MemTag::weights, m);  // 20 B, freed when overwritten by a move
  EXPECT_EQ(m.current(fw::MemTag::weights), 104u);
  target = std::move(moved);
  EXPECT_EQ(m.current(fw::MemTag::weights), 84u);
  EXPECT_EQ(m.peak(fw::MemTag::weights), 104u);
  mw.reset();
  EXPECT_EQ(m.current(fw::MemTag::master_weights), 0u);
  EXPECT_EQ(m.peak(fw::MemTag::master_weights), 84u);
  EXPECT_EQ(m.total_current(), 126u);
  EXPECT_EQ(m.total_peak(), 230u);
}

TEST(MemoryAccountant, TableListsEveryTagWithCurrentAndPeak) {
  fw::MemoryAccountant m(3);
  std::size_t bytes = 1;
  for (fw::MemTag t : kTags) {
    bytes *= 7;
    m.on_alloc(t, bytes * 2);
    m.on_free(t, bytes);
  }
  const std::string table = m.table();
  EXPECT_NE(table.find("rank 3"), std::string::npos) << table;
  std::istringstream in(table);
  std::string line;
  std::map<std::string, std::pair<std::size_t, std::size_t>> rows;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    std::size_t cur = 0;
    std::size_t peak = 0;
    double mib = 0;
    if (ls >> name >> cur >> peak >> mib) {
      EXPECT_NEAR(mib, static_cast<double>(peak) / (1 << 20), 0.005) << line;  // 2 decimals
      rows[name] = {cur, peak};
    }
  }
  ASSERT_EQ(rows.size(), kTags.size() + 1) << table;
  for (fw::MemTag t : kTags) {
    const std::string name(fw::mem_tag_name(t));
    ASSERT_TRUE(rows.count(name)) << name << "\n" << table;
    EXPECT_EQ(rows[name].first, m.current(t)) << name;
    EXPECT_EQ(rows[name].second, m.peak(t)) << name;
  }
  EXPECT_EQ(rows["total"].first, m.total_current());
  EXPECT_EQ(rows["total"].second, m.total_peak());
}

TEST(MemoryAccountant, JsonIsWellFormedAndAgreesWithTheCounters) {
  fw::MemoryAccountant m(7);
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::size_t> size(1, 1 << 20);
  for (fw::MemTag t : kTags) {
    const std::size_t a = size(rng);
    const std::size_t b = size(rng);
    m.on_alloc(t, a);
    m.on_alloc(t, b);
    m.on_free(t, a);
  }
  const std::string text = m.json();
  Json doc;
  ASSERT_NO_THROW(doc = JsonReader(text).document()) << text;
  ASSERT_TRUE(doc.is_object);
  ASSERT_EQ(doc.members.size(), 5u) << text;
  EXPECT_EQ(doc.members.at("rank").number, 7u);
  EXPECT_EQ(doc.members.at("total_current").number, m.total_current());
  EXPECT_EQ(doc.members.at("total_peak").number, m.total_peak());
  for (const char* section : {"current", "peak"}) {
    const Json& s = doc.members.at(section);
    ASSERT_TRUE(s.is_object) << section;
    ASSERT_EQ(s.members.size(), kTags.size()) << section;
    for (fw::MemTag t : kTags) {
      const std::string name(fw::mem_tag_name(t));
      const std::size_t want = std::string(section) == "current" ? m.current(t) : m.peak(t);
      EXPECT_EQ(s.members.at(name).number, want) << section << "." << name;
    }
  }
}

TEST(MemoryAccountant, JsonReaderRejectsMalformedText) {
  // The reader above must be able to fail, or the JSON test proves nothing.
  for (const char* bad :
       {"{\"a\":1,}", "{\"a\":1", "{a:1}", "{\"a\":1} x", "{\"a\":-1}", "{\"a\":1,\"a\":2}"}) {
    EXPECT_THROW(JsonReader(bad).document(), std::runtime_error) << bad;
  }
}

TEST(MemoryAccountant, RanksAsThreadsCountIndependently) {
  // Each thread is one rank with its own accountant; allocation sizes depend on the rank, so a
  // shared (process-global) counter would show up as wrong totals on every rank.
  constexpr int kRanks = 8;
  constexpr int kRounds = 200;
  std::vector<std::unique_ptr<fw::MemoryAccountant>> acct;
  for (int r = 0; r < kRanks; ++r) acct.push_back(std::make_unique<fw::MemoryAccountant>(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      fw::MemoryAccountant& m = *acct[static_cast<std::size_t>(r)];
      fw::Tensor<float, fw::Host> keep({r + 1, 3}, fw::MemTag::weights, m);
      for (int i = 0; i < kRounds; ++i) {
        fw::Tensor<fw::fp16, fw::Host> act({r + 2, i % 5 + 1}, fw::MemTag::activations, m);
        const auto v = keep.view();
        (void)v;
      }
      m.on_alloc(fw::MemTag::optimizer_state, static_cast<std::size_t>(1000 * (r + 1)));
      // keep is released when the thread ends.
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    const fw::MemoryAccountant& m = *acct[static_cast<std::size_t>(r)];
    const auto rr = static_cast<std::size_t>(r);
    EXPECT_EQ(m.rank(), r);
    EXPECT_EQ(m.current(fw::MemTag::weights), 0u) << "rank " << r;
    EXPECT_EQ(m.peak(fw::MemTag::weights), (rr + 1) * 3 * 4) << "rank " << r;
    EXPECT_EQ(m.current(fw::MemTag::activations), 0u) << "rank " << r;
    EXPECT_EQ(m.peak(fw::MemTag::activations), (rr + 2) * 5 * 2) << "rank " << r;
    EXPECT_EQ(m.current(fw::MemTag::optimizer_state), 1000 * (rr + 1)) << "rank " << r;
    EXPECT_EQ(m.allocations(), static_cast<std::size_t>(kRounds + 2)) << "rank " << r;
    EXPECT_EQ(m.total_peak(), (rr + 1) * 12 + 1000 * (rr + 1)) << "rank " << r;
  }
}

TEST(MemoryAccountant, OneAccountantSharedByThreadsStaysExact) {
  // A rank may allocate from several threads (e.g. a prefetch thread); counts must not tear.
  fw::MemoryAccountant m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 5000; ++i) {
        m.on_alloc(kTags[static_cast<std::size_t>((t + i) % 7)], 3);
        if (i % 2 == 1) m.on_free(kTags[static_cast<std::size_t>((t + i - 1) % 7)], 3);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(m.allocations(), 20000u);
  EXPECT_EQ(m.total_current(), 4u * 2500u * 3u);
}

TEST(MemoryAccountant, ACapRefusesTheAllocationThatCrossesItNamingEveryNumber) {
  fw::MemoryAccountant m(6);
  m.set_limit(1000);
  ASSERT_EQ(m.limit(), std::optional<std::size_t>(1000));
  m.on_alloc(fw::MemTag::weights, 600);
  m.on_alloc(fw::MemTag::grads, 300);
  try {
    m.on_alloc(fw::MemTag::optimizer_state, 101);
    FAIL() << "expected fw::OutOfMemory";
  } catch (const fw::OutOfMemory& e) {
    const std::string what = e.what();
    for (const char* part : {"rank 6", "101 B of optimizer_state", "1001 B", "cap of 1000 B",
                             "900 B in use", "weights 600", "grads 300", "--memory-cap-gb"}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << " missing from: " << what;
    }
  }
  EXPECT_EQ(m.total_current(), 900u);  // a refused allocation counts nothing
  EXPECT_EQ(m.current(fw::MemTag::optimizer_state), 0u);
  m.on_alloc(fw::MemTag::optimizer_state, 100);  // exactly the cap fits
  EXPECT_EQ(m.total_peak(), 1000u);
  m.set_limit(0);
  EXPECT_FALSE(m.limit().has_value());
  m.on_alloc(fw::MemTag::workspace, 5000);
  EXPECT_EQ(m.total_current(), 6000u);
}

TEST(MemoryAccountant, ATensorPastTheCapIsNeverAllocated) {
  fw::MemoryAccountant m(2);
  m.set_limit(100);
  using F = fw::Tensor<float, fw::Host>;
  F a({20}, fw::MemTag::weights, m);  // 80 B
  EXPECT_THROW(F({6}, fw::MemTag::activations, m), fw::OutOfMemory);
  EXPECT_EQ(m.total_current(), 80u);
  EXPECT_EQ(m.allocations(), 1u);
  a.reset();
  F b({25}, fw::MemTag::activations, m);  // 100 B fits once a is gone
  EXPECT_EQ(m.total_peak(), 100u);
}

TEST(MemoryAccountant, SnapshotsTravelAsWordsAndPrintLikeTheAccountant) {
  fw::MemoryAccountant m(3);
  m.set_limit(1 << 20);
  m.on_alloc(fw::MemTag::grads, 77);
  m.on_alloc(fw::MemTag::comm_buffers, 5);
  m.on_free(fw::MemTag::comm_buffers, 5);
  const fw::MemorySnapshot s = m.snapshot();
  const auto words = s.to_words();
  const fw::MemorySnapshot back = fw::MemorySnapshot::from_words(words.data());
  EXPECT_EQ(back.json(), m.json());
  EXPECT_EQ(back.table(), m.table());
  EXPECT_NE(m.json().find("\"limit\":1048576"), std::string::npos) << m.json();
  EXPECT_NE(m.json().find("\"comm_buffers\":5"), std::string::npos) << m.json();
}
