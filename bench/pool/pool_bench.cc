// Page pool micro-benchmarks: frame allocate/free, whole-sequence append/close, and
// ApplyDecision on a Llama-3-70B-shaped sequence (80 layers, 8 KV groups, 128K tokens, B = 16).
// Frames are 512 bytes here (head_dim 8): the bookkeeping measured does not depend on frame
// size and the arena is never touched, so the shape of a real 8 KiB-frame pool is kept without
// reserving 43 GB of shared memory.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/pool/cache_state.h"
#include "core/pool/page_pool.h"

namespace entrokv {
namespace {

constexpr int64_t kTokens = 131072;
constexpr ModelGeometry kShape{.layers = 80,
                               .query_heads = 64,
                               .kv_groups = 8,
                               .head_dim = 8,
                               .page_size = 16,
                               .element_bytes = 2};
constexpr int64_t kPages = kTokens / 16;
constexpr int64_t kKeptPages = kPages / 5;  // a 20% budget

FrameLayout LayoutArg(const benchmark::State& state) {
  return state.range(0) == 0 ? FrameLayout::kGroup : FrameLayout::kLayer;
}

std::unique_ptr<CacheState> MakeState(FrameLayout layout) {
  CacheOptions options;
  options.geometry = kShape;
  options.layout = layout;
  const int64_t units = layout == FrameLayout::kGroup ? kShape.kv_groups : 1;
  options.capacity_bytes = kPages * kShape.layers * units * FrameBytes(kShape, layout);
  options.name = "bench";
  return *CacheState::Create(options);
}

// Per group, kKeptPages distinct pages in ascending order; groups disagree, as real ones do.
std::vector<std::vector<int32_t>> RandomKept(std::mt19937& rng) {
  std::vector<std::vector<int32_t>> kept(kShape.kv_groups);
  std::vector<int32_t> pages(kPages);
  for (int32_t p = 0; p < kPages; ++p) pages[p] = p;
  for (auto& group : kept) {
    std::shuffle(pages.begin(), pages.end(), rng);
    group.assign(pages.begin(), pages.begin() + kKeptPages);
    std::sort(group.begin(), group.end());
  }
  return kept;
}

void BM_PoolAllocateRelease(benchmark::State& state) {
  PagePoolOptions options;
  options.geometry = kShape;
  options.capacity_frames = 1 << 20;
  auto pool = *PagePool::Create(options);
  for (auto _ : state) {
    const FrameId frame = *pool->Allocate(0, 1);
    benchmark::DoNotOptimize(*pool->Release(frame));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PoolAllocateRelease);

void BM_PoolAllocateReleaseBatch(benchmark::State& state) {
  PagePoolOptions options;
  options.geometry = kShape;
  options.capacity_frames = 1 << 20;
  auto pool = *PagePool::Create(options);
  std::vector<FrameId> frames(state.range(0));
  for (auto _ : state) {
    for (FrameId& frame : frames) frame = *pool->Allocate(1, 1);
    for (const FrameId frame : frames) benchmark::DoNotOptimize(*pool->Release(frame));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_PoolAllocateReleaseBatch)->Arg(4096)->Arg(1 << 20);

// Opening a 128K-token sequence allocates every frame of it (5.2M in GROUP, 655K in LAYER).
void BM_OpenClose128K(benchmark::State& state) {
  auto cache = MakeState(LayoutArg(state));
  for (auto _ : state) {
    if (!cache->OpenSequence("s", kTokens).ok()) state.SkipWithError("open failed");
    if (!cache->CloseSequence("s").ok()) state.SkipWithError("close failed");
  }
  state.SetLabel(LayoutArg(state) == FrameLayout::kGroup ? "group" : "layer");
  state.counters["frames"] = static_cast<double>(cache->Stats().capacity_frames);
}
BENCHMARK(BM_OpenClose128K)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// One layer's decision: 8 groups x 8192 pages, 80% evicted. A fresh sequence every 80 layers.
void BM_ApplyDecisionLayer128K(benchmark::State& state) {
  auto cache = MakeState(LayoutArg(state));
  std::mt19937 rng(7);
  const auto kept = RandomKept(rng);
  int32_t layer = kShape.layers;
  int64_t freed = 0;
  for (auto _ : state) {
    if (layer == kShape.layers) {
      state.PauseTiming();
      (void)cache->CloseSequence("s");
      if (!cache->OpenSequence("s", kTokens).ok()) state.SkipWithError("open failed");
      layer = 0;
      state.ResumeTiming();
    }
    auto result = cache->ApplyDecision("s", layer++, kTokens, kept);
    freed += result->frames_released;
  }
  state.SetLabel(LayoutArg(state) == FrameLayout::kGroup ? "group" : "layer");
  state.counters["frames_freed_per_layer"] =
      static_cast<double>(freed) / static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * kShape.kv_groups * kPages);
}
BENCHMARK(BM_ApplyDecisionLayer128K)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// The whole model: 80 layers' decisions for one 128K-token sequence.
void BM_ApplyDecisionModel128K(benchmark::State& state) {
  auto cache = MakeState(LayoutArg(state));
  std::mt19937 rng(7);
  const auto kept = RandomKept(rng);
  for (auto _ : state) {
    state.PauseTiming();
    (void)cache->CloseSequence("s");
    if (!cache->OpenSequence("s", kTokens).ok()) state.SkipWithError("open failed");
    state.ResumeTiming();
    for (int32_t layer = 0; layer < kShape.layers; ++layer) {
      benchmark::DoNotOptimize(cache->ApplyDecision("s", layer, kTokens, kept));
    }
  }
  state.SetLabel(LayoutArg(state) == FrameLayout::kGroup ? "group" : "layer");
  state.counters["used_frames_after"] = static_cast<double>(cache->Stats().used_frames);
}
BENCHMARK(BM_ApplyDecisionModel128K)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace entrokv
