// Per-stage micro-benchmarks of the scoring core on one Qwen2.5-1.5B-shaped layer (12 query
// heads, 2 KV groups, T = 131072, B = 16, K = 20% of the pages): the reference stages one by
// one, then a whole layer through DecideLayer and through FusedScorer. Bytes processed are the
// statistic bytes each stage reads, so the reported rate compares with the read-once floor.
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/scoring/decision.h"
#include "core/scoring/entropy.h"
#include "core/scoring/fused_scorer.h"
#include "core/scoring/pages.h"
#include "core/scoring/selection.h"
#include "core/scoring/weights.h"
#include "core/util/dtype.h"

namespace entrokv {
namespace {

constexpr int kHeads = 12;
constexpr int kGroups = 2;
constexpr int64_t kTokens = 131072;
constexpr int kPageSize = 16;
constexpr int64_t kQuota = kTokens / kPageSize / 5;

const std::vector<float>& Layer() {
  static const std::vector<float>* const layer = [] {
    auto* values = new std::vector<float>(static_cast<size_t>(kHeads * kTokens));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    for (float& value : *values) {
      const float u = unit(rng);
      value = u * u * u * u;
    }
    return values;
  }();
  return *layer;
}

const std::vector<uint16_t>& LayerBf16() {
  static const std::vector<uint16_t>* const layer = [] {
    auto* values = new std::vector<uint16_t>();
    for (const float value : Layer()) values->push_back(FloatToBFloat16(value));
    return values;
  }();
  return *layer;
}

std::span<const float> Row(int head) {
  return {Layer().data() + static_cast<int64_t>(head) * kTokens, static_cast<size_t>(kTokens)};
}

void SetLayerBytes(benchmark::State& state, int64_t bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes_per_iteration);
}

void BM_ReadOnce(benchmark::State& state) {
  const std::vector<float>& layer = Layer();
  for (auto _ : state) {
    float lanes[16] = {};
    for (size_t i = 0; i + 16 <= layer.size(); i += 16) {
      for (int j = 0; j < 16; ++j) lanes[j] += layer[i + static_cast<size_t>(j)];
    }
    benchmark::DoNotOptimize(lanes);
  }
  SetLayerBytes(state, kHeads * kTokens * 4);
}
BENCHMARK(BM_ReadOnce)->Unit(benchmark::kMillisecond);

void BM_EntropySums(benchmark::State& state) {
  for (auto _ : state) {
    for (int h = 0; h < kHeads; ++h) {
      EntropySums sums = EntropySumsOf(Row(h).subspan(4), 2.0);
      benchmark::DoNotOptimize(sums);
    }
  }
  SetLayerBytes(state, kHeads * kTokens * 4);
}
BENCHMARK(BM_EntropySums)->Unit(benchmark::kMillisecond);

void BM_PoolRows(benchmark::State& state) {
  const int r = kHeads / kGroups;
  std::vector<std::span<const float>> rows;
  for (int h = 0; h < r; ++h) rows.push_back(Row(h));
  const std::vector<double> weights(static_cast<size_t>(r), 1.0 / r);
  std::vector<float> pooled(static_cast<size_t>(kTokens));
  for (auto _ : state) {
    for (int g = 0; g < kGroups; ++g) PoolRows(rows, weights, pooled);
    benchmark::DoNotOptimize(pooled.data());
  }
  SetLayerBytes(state, kHeads * kTokens * 4);
}
BENCHMARK(BM_PoolRows)->Unit(benchmark::kMillisecond);

void BM_PageMaxima(benchmark::State& state) {
  for (auto _ : state) {
    for (int g = 0; g < kGroups; ++g) benchmark::DoNotOptimize(PageMaxima(Row(g), kPageSize));
  }
  SetLayerBytes(state, kGroups * kTokens * 4);
}
BENCHMARK(BM_PageMaxima)->Unit(benchmark::kMillisecond);

void BM_SelectTopPages(benchmark::State& state) {
  const std::vector<float> scores = PageMaxima(Row(0), kPageSize);
  for (auto _ : state) {
    for (int g = 0; g < kGroups; ++g) benchmark::DoNotOptimize(SelectTopPages(scores, kQuota));
  }
}
BENCHMARK(BM_SelectTopPages)->Unit(benchmark::kMicrosecond);

void BM_SelectTopPagesBySort(benchmark::State& state) {
  const std::vector<float> scores = PageMaxima(Row(0), kPageSize);
  for (auto _ : state) {
    for (int g = 0; g < kGroups; ++g) {
      benchmark::DoNotOptimize(SelectTopPagesBySort(scores, kQuota));
    }
  }
}
BENCHMARK(BM_SelectTopPagesBySort)->Unit(benchmark::kMicrosecond);

LayerRequest Request(bool bf16, bool measure) {
  LayerRequest request = LayerRequestFor(
      bf16 ? *StatisticView::Create(LayerBf16().data(), DType::kBFloat16, kHeads, kTokens)
           : *StatisticView::Create(Layer().data(), DType::kFloat32, kHeads, kTokens),
      kHeads, kGroups, kTokens, kQuota);
  request.measure = measure;
  return request;
}

// Args: {bf16, measure}.
void BM_DecideLayerReference(benchmark::State& state) {
  const LayerRequest request = Request(state.range(0) != 0, state.range(1) != 0);
  const Policy& policy = **FindPolicy("page_entrokv");
  const PolicyOptions options;
  for (auto _ : state) benchmark::DoNotOptimize(DecideLayer(policy, options, request));
  SetLayerBytes(state, kHeads * kTokens * (state.range(0) != 0 ? 2 : 4));
}
BENCHMARK(BM_DecideLayerReference)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"bf16", "measure"})
    ->Unit(benchmark::kMillisecond);

void BM_FusedDecideLayer(benchmark::State& state) {
  const LayerRequest request = Request(state.range(0) != 0, state.range(1) != 0);
  const Policy& policy = **FindPolicy("page_entrokv");
  FusedScorer scorer{PolicyOptions()};
  for (auto _ : state) benchmark::DoNotOptimize(scorer.DecideLayer(policy, request));
  SetLayerBytes(state, kHeads * kTokens * (state.range(0) != 0 ? 2 : 4));
}
BENCHMARK(BM_FusedDecideLayer)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"bf16", "measure"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace entrokv
