// Statistics and decisions for the tests that compare one scoring path with another (the fused
// CPU path with the reference, the CUDA scorer with the fused CPU path): seeded random layers
// with the shapes that break naive code, and a field-by-field comparison of decisions.
#ifndef ENTROKV_CORE_TESTING_DECISIONS_H_
#define ENTROKV_CORE_TESTING_DECISIONS_H_

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/scoring/decision.h"
#include "core/scoring/entropy.h"
#include "core/scoring/pages.h"
#include "core/scoring/policy.h"
#include "core/util/dtype.h"
#include "gtest/gtest.h"

namespace entrokv::testing {

// A statistic in any dtype, kept alive beside its view.
struct Statistic {
  DType dtype = DType::kFloat32;
  int heads = 0;
  int64_t tokens = 0;
  std::vector<float> f32;
  std::vector<uint16_t> half;

  Statistic(DType type, int query_heads, int64_t length, const std::vector<float>& values)
      : dtype(type), heads(query_heads), tokens(length), f32(values) {
    if (dtype == DType::kFloat32) return;
    for (const float value : values) {
      half.push_back(dtype == DType::kBFloat16 ? FloatToBFloat16(value) : FloatToFloat16(value));
    }
  }
  const void* data() const {
    return dtype == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                    : static_cast<const void*>(half.data());
  }
  size_t bytes() const {
    return static_cast<size_t>(heads) * static_cast<size_t>(tokens) *
           static_cast<size_t>(DTypeBytes(dtype));
  }
  StatisticView View() const { return *StatisticView::Create(data(), dtype, heads, tokens); }
};

// Rows with the shapes that break naive code: plain random, coarse values (many ties), all-zero,
// all mass on the sinks, one spike, uniform.
inline std::vector<float> RandomValues(std::mt19937_64& rng, int heads, int64_t tokens, int sinks) {
  std::vector<float> values(static_cast<size_t>(heads * tokens), 0.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> shape(0, 6);
  for (int h = 0; h < heads; ++h) {
    float* row = values.data() + h * tokens;
    const int kind = shape(rng);
    for (int64_t t = 0; t < tokens; ++t) {
      switch (kind) {
        case 0:
          row[t] = unit(rng);
          break;
        case 1:
          row[t] = std::floor(unit(rng) * 3.0f) * 0.25f;
          break;  // ties
        case 2:
          row[t] = 0.0f;
          break;
        case 3:
          row[t] = t < sinks ? unit(rng) + 1.0f : 0.0f;
          break;  // all-sink head
        case 4:
          row[t] = t == tokens / 2 ? 1.0f : 1e-6f * unit(rng);
          break;
        case 5:
          row[t] = 1.0f / static_cast<float>(tokens);
          break;  // uniform: all ties
        default:
          row[t] = unit(rng) * unit(rng) * 1e3f;
          break;
      }
    }
  }
  return values;
}

// The seed of the randomized tests: fixed, so that a failure replays; ENTROKV_TEST_SEED runs
// another one (the trace names it).
inline uint64_t TestSeed() {
  const char* text = std::getenv("ENTROKV_TEST_SEED");
  return text != nullptr ? std::strtoull(text, nullptr, 10) : uint64_t{20261130};
}

inline void ExpectSameDecision(const LayerDecision& expected, const LayerDecision& actual) {
  EXPECT_EQ(expected.page_count, actual.page_count);
  EXPECT_EQ(expected.quota_pages, actual.quota_pages);
  EXPECT_EQ(expected.scope, actual.scope);
  EXPECT_EQ(expected.union_pages, actual.union_pages);
  EXPECT_EQ(expected.group_scope_union_pages, actual.group_scope_union_pages);
  EXPECT_EQ(expected.combine_weights, actual.combine_weights);
  ASSERT_EQ(expected.groups.size(), actual.groups.size());
  for (size_t g = 0; g < expected.groups.size(); ++g) {
    const GroupDecision& want = expected.groups[g];
    const GroupDecision& got = actual.groups[g];
    EXPECT_EQ(want.kept_pages, got.kept_pages) << "group " << g;
    EXPECT_EQ(want.weights, got.weights) << "group " << g;
    EXPECT_EQ(want.entropies, got.entropies) << "group " << g;
    EXPECT_EQ(want.shadow_uor, got.shadow_uor) << "group " << g;
    EXPECT_EQ(want.disagreement, got.disagreement) << "group " << g;
    EXPECT_EQ(want.retained_mass, got.retained_mass) << "group " << g;
    EXPECT_EQ(want.page_scores, got.page_scores) << "group " << g;
  }
}

// One random case: options, a fused policy and `layers` layers of one shape (what one decision
// of a sequence holds), each with its own values, quota, cached weights and live pages, in
// either selection scope. The requests point into the case: keep it alive (it does not move).
struct RandomCase {
  PolicyOptions options;
  const Policy* policy = nullptr;
  int heads = 0;
  int groups = 0;
  int64_t tokens = 0;
  DType dtype = DType::kFloat32;
  std::vector<std::unique_ptr<Statistic>> statistics;
  std::vector<std::vector<double>> cached;
  std::vector<std::vector<uint8_t>> live;
  std::vector<LayerRequest> requests;

  std::string Describe() const {
    return absl::StrCat(
        "policy ", policy->name(), " B ", options.page_size, " s ", options.sink_tokens, " alpha ",
        options.alpha, " neighbourhood ", options.neighbourhood_kernel,
        options.neighbourhood == NeighbourhoodKind::kMax ? " max" : " mean", " group_floor ",
        options.group_floor, " G ", groups, " r ", heads / groups, " T ", tokens, " dtype ",
        DTypeName(dtype), " layers ", requests.size(), " scope ",
        requests.empty() || requests[0].scope == SelectionScope::kGroup ? "group" : "layer");
  }
};

// `names` are the policies to draw from (by trial, round robin); `alphas` the orders.
inline std::unique_ptr<RandomCase> MakeRandomCase(std::mt19937_64& rng, int trial,
                                                  std::span<const absl::string_view> names,
                                                  std::span<const double> alphas, int layers) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto c = std::make_unique<RandomCase>();
  PolicyOptions& options = c->options;
  options.page_size = std::vector<int>{1, 3, 4, 8, 16, 17, 32}[static_cast<size_t>(pick(0, 6))];
  options.sink_tokens = pick(0, 6);
  options.alpha = alphas[static_cast<size_t>(pick(0, static_cast<int>(alphas.size()) - 1))];
  options.tau = std::vector<double>{0.5, 0.05, 4.0}[static_cast<size_t>(pick(0, 2))];
  options.protections.tail_page = pick(0, 1) == 1;
  options.protections.sink_pages = pick(0, 1) == 1;
  options.protections.recent_pages = pick(0, 2) == 0 ? pick(1, 5) : 0;
  if (pick(0, 2) == 0) {  // neighbourhood pooling, up to the widest kernel
    options.neighbourhood_kernel =
        std::vector<int>{3, 5, 7, kMaxNeighbourhoodKernel}[static_cast<size_t>(pick(0, 3))];
    options.neighbourhood = pick(0, 1) == 0 ? NeighbourhoodKind::kMax : NeighbourhoodKind::kMean;
  }
  c->groups = pick(1, 3);
  const int r = pick(0, 3) == 0 ? pick(7, 13) : pick(1, 6);  // quads, a pair, an odd row
  c->heads = c->groups * r;
  c->tokens = pick(0, 3) == 0 ? pick(1, 20) : pick(1, 5000);
  c->dtype = std::vector<DType>{DType::kFloat32, DType::kFloat16,
                                DType::kBFloat16}[static_cast<size_t>(pick(0, 2))];
  c->policy = *FindPolicy(names[static_cast<size_t>(trial) % names.size()]);
  const int64_t pages = PageCount(c->tokens, options.page_size);
  const bool measure = pick(0, 1) == 1;
  const bool page_scores = pick(0, 1) == 1;
  const SelectionScope scope = pick(0, 3) == 0 ? SelectionScope::kLayer : SelectionScope::kGroup;
  c->statistics.resize(static_cast<size_t>(layers));
  c->cached.resize(static_cast<size_t>(layers));
  c->live.resize(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    const auto at = static_cast<size_t>(l);
    c->statistics[at] = std::make_unique<Statistic>(
        c->dtype, c->heads, c->tokens, RandomValues(rng, c->heads, c->tokens, options.sink_tokens));
    if (pick(0, 4) == 0) {
      for (int h = 0; h < c->heads; ++h) c->cached[at].push_back(pick(0, 3) * 0.25);
    }
    if (pick(0, 3) == 0) {  // a decode-time decision after evictions: n or G * n entries
      const int64_t entries = pick(0, 1) == 0 ? pages : pages * c->groups;
      const int dead_percent = pick(0, 100);
      for (int64_t i = 0; i < entries; ++i) {
        c->live[at].push_back(pick(0, 99) >= dead_percent ? 1 : 0);
      }
    }
  }
  for (int l = 0; l < layers; ++l) {
    const auto at = static_cast<size_t>(l);
    LayerRequest request;
    request.statistic = c->statistics[at]->View();
    request.query_heads = c->heads;
    request.kv_groups = c->groups;
    request.tokens = c->tokens;
    request.quota_pages = pick(0, 4) == 0 ? pages + pick(0, 3) : pick(1, static_cast<int>(pages));
    request.cached_weights = c->cached[at];
    request.live_pages = c->live[at];
    request.measure = measure;
    request.page_scores = page_scores;
    request.scope = scope;
    c->requests.push_back(request);
  }
  // Drawn last, so that the draws above are those of the cases before group quotas moved.
  if (scope == SelectionScope::kGroup && c->policy->ranks_pages() && pick(0, 2) == 0) {
    options.group_floor = std::vector<double>{0.0, 0.25, 0.6}[static_cast<size_t>(pick(0, 2))];
  }
  return c;
}

}  // namespace entrokv::testing

#endif  // ENTROKV_CORE_TESTING_DECISIONS_H_
