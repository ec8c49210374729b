// `entrokv bench core`: times the fused CPU scoring path on a seeded (or loaded) whole-model
// statistic against one summing pass over the same bytes, the memory-bandwidth floor
// (docs/architecture.md §7). Prints one JSON object with --json.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/args.h"
#include "client/cli/command.h"
#include "core/io/npy.h"
#include "core/scoring/budget.h"
#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/scoring/layer_quotas.h"
#include "core/scoring/policy.h"
#include "core/util/dtype.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

#if defined(ENTROKV_HAVE_CUDA)
#include "core/cuda/bench_support.h"
#include "core/cuda/device.h"
#include "core/cuda/scorer.h"
#endif

namespace entrokv::cli {
namespace {

constexpr char kCommand[] = "bench";

struct BenchSetup {
  int layers = 0;
  int query_heads = 0;
  int kv_groups = 0;
  int64_t tokens = 0;
  DType dtype = DType::kFloat32;
  std::vector<uint8_t> bytes;  // [layers, query_heads, tokens] of dtype
};

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Attention-like rows: heavy-tailed values whose sharpness differs per head (so the entropy
// weights differ), and large sink tokens. Deterministic in `seed`.
void FillStatistic(uint64_t seed, BenchSetup* setup) {
  const int64_t rows = static_cast<int64_t>(setup->layers) * setup->query_heads;
  const int64_t tokens = setup->tokens;
  setup->bytes.resize(static_cast<size_t>(rows * tokens * DTypeBytes(setup->dtype)));
  uint64_t state = seed;
  for (int64_t row = 0; row < rows; ++row) {
    const int sharpness = 1 + static_cast<int>(SplitMix(&state) % 12);
    for (int64_t t = 0; t < tokens; ++t) {
      const float u = static_cast<float>(SplitMix(&state) >> 40) * 0x1.0p-24f;
      float value = u;
      for (int k = 1; k < sharpness; ++k) value *= u;
      if (t < 4) value += 8.0f;
      const int64_t at = row * tokens + t;
      if (setup->dtype == DType::kFloat32) {
        reinterpret_cast<float*>(setup->bytes.data())[at] = value;
      } else {
        reinterpret_cast<uint16_t*>(setup->bytes.data())[at] =
            setup->dtype == DType::kBFloat16 ? FloatToBFloat16(value) : FloatToFloat16(value);
      }
    }
  }
}

// A [L, H, T] (or [H, T]) .npy; '<u2' is read as bfloat16.
absl::Status LoadStatistic(const std::string& path, BenchSetup* setup) {
  ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  if (array.shape.size() == 2) array.shape.insert(array.shape.begin(), 1);
  if (array.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input: expected shape [layers, query_heads, tokens], got ",
                     array.shape.size(), " dimensions"));
  }
  setup->layers = static_cast<int>(array.shape[0]);
  setup->query_heads = static_cast<int>(array.shape[1]);
  setup->tokens = array.shape[2];
  setup->dtype = array.type == NpyType::kFloat32   ? DType::kFloat32
                 : array.type == NpyType::kFloat16 ? DType::kFloat16
                                                   : DType::kBFloat16;
  setup->bytes = std::move(array.bytes);
  return absl::OkStatus();
}

// Sixteen independent float accumulators so the pass runs at memory speed, not add latency.
float SumOnce(const BenchSetup& setup) {
  float lanes[16] = {};
  const int64_t count = static_cast<int64_t>(setup.bytes.size()) / DTypeBytes(setup.dtype);
  int64_t i = 0;
  if (setup.dtype == DType::kFloat32) {
    const auto* data = reinterpret_cast<const float*>(setup.bytes.data());
    for (; i + 16 <= count; i += 16) {
      for (int j = 0; j < 16; ++j) lanes[j] += data[i + j];
    }
    for (; i < count; ++i) lanes[0] += data[i];
  } else {
    // Half precision: the floor is reading the bytes; the sum widens like bfloat16 (a shift).
    const auto* data = reinterpret_cast<const uint16_t*>(setup.bytes.data());
    for (; i + 16 <= count; i += 16) {
      for (int j = 0; j < 16; ++j) lanes[j] += BFloat16ToFloat(data[i + j]);
    }
    for (; i < count; ++i) lanes[0] += BFloat16ToFloat(data[i]);
  }
  float sum = 0.0f;
  for (const float lane : lanes) sum += lane;
  return sum;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

template <typename Fn>
double TimeMs(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status WriteKept(const std::string& path, const std::vector<LayerDecision>& decisions) {
  std::ofstream out(path);
  if (!out) return absl::NotFoundError(absl::StrCat("--kept-out: cannot open ", path));
  for (const LayerDecision& layer : decisions) {
    for (const GroupDecision& group : layer.groups) {
      out << absl::StrJoin(group.kept_pages, " ") << "\n";
    }
  }
  return out ? absl::OkStatus()
             : absl::DataLossError(absl::StrCat("--kept-out: write failed for ", path));
}

// What a run measured, the same for both scorers: the shape, the budget, the policy and the
// number of runs.
Json SetupJson(const ArgParser& parser, const BenchSetup& setup, const Policy& policy, int64_t runs,
               int64_t page_size, double budget) {
  return Json{{"bytes", setup.bytes.size()},
              {"runs", runs},
              {"layers", setup.layers},
              {"query_heads", setup.query_heads},
              {"kv_heads", setup.kv_groups},
              {"tokens", setup.tokens},
              {"page_size", page_size},
              {"budget", budget},
              {"dtype", std::string(DTypeName(setup.dtype))},
              {"policy", std::string(policy.name())},
              {"neighbourhood_kernel", parser.Get("neighbourhood-kernel")},
              {"neighbourhood", parser.Get("neighbourhood")},
              {"group_floor", parser.Get("group-floor")},
              {"layer_floor", parser.Get("layer-floor")},
              {"measure", parser.GetFlag("measure")}};
}

// --scorer cuda: the statistic uploaded once, the whole model decided from device memory to the
// kept pages on the host (wall clock: what a caller waits for), one layer the same way, and a
// device-to-device copy of the statistic's bytes (CUDA events) as the bandwidth floor.
absl::Status RunCuda(const ArgParser& parser, const BenchSetup& setup, const Policy& policy,
                     const PolicyOptions& options, std::vector<LayerRequest> requests, int64_t runs,
                     double budget, int64_t page_size) {
#if defined(ENTROKV_HAVE_CUDA)
  ASSIGN_OR_RETURN(const std::string gpu, cuda::DescribeDevice(0));
  ASSIGN_OR_RETURN(
      std::unique_ptr<cuda::DeviceCopy> copy,
      cuda::DeviceCopy::Upload(0, setup.bytes.data(), static_cast<int64_t>(setup.bytes.size())));
  const int64_t layer_bytes =
      static_cast<int64_t>(setup.query_heads) * setup.tokens * DTypeBytes(setup.dtype);
  for (size_t l = 0; l < requests.size(); ++l) {
    ASSIGN_OR_RETURN(requests[l].statistic,
                     StatisticView::Create(copy->data() + static_cast<int64_t>(l) * layer_bytes,
                                           setup.dtype, setup.query_heads, setup.tokens));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::Scorer> scorer, cuda::Scorer::Create(0));
  std::vector<LayerDecision> decisions;
  absl::Status status;
  auto whole = [&] {
    absl::StatusOr<std::vector<LayerDecision>> result =
        scorer->DecideModelOnDevice(policy, options, requests);
    if (result.ok()) {
      decisions = *std::move(result);
    } else {
      status = result.status();
    }
  };
  auto one_layer = [&] {
    absl::StatusOr<std::vector<LayerDecision>> result = scorer->DecideModelOnDevice(
        policy, options, std::span<const LayerRequest>(requests.data(), 1));
    if (!result.ok()) status = result.status();
  };
  whole();
  one_layer();
  RETURN_IF_ERROR(status);
  std::vector<double> model_ms, layer_ms;
  for (int64_t run = 0; run < runs; ++run) {
    model_ms.push_back(TimeMs(whole));
    layer_ms.push_back(TimeMs(one_layer));
  }
  RETURN_IF_ERROR(status);
  ASSIGN_OR_RETURN(const std::vector<double> copy_ms, copy->TimeCopiesMs(static_cast<int>(runs)));
  if (parser.Given("kept-out")) RETURN_IF_ERROR(WriteKept(parser.Get("kept-out"), decisions));
  Json json = SetupJson(parser, setup, policy, runs, page_size, budget);
  json["scorer"] = "cuda";
  json["gpu"] = gpu;
  json["median_ms"] = RoundTo(Median(model_ms), 4);
  json["min_ms"] = RoundTo(*std::min_element(model_ms.begin(), model_ms.end()), 4);
  json["layer_median_us"] = RoundTo(Median(layer_ms) * 1000.0, 2);
  json["read_once_ms"] = RoundTo(Median(copy_ms), 4);
  json["read_once_min_ms"] = RoundTo(*std::min_element(copy_ms.begin(), copy_ms.end()), 4);
  json["read_once_is"] = "device-to-device copy of the statistic (reads and writes its bytes once)";
  std::printf("%s\n", DumpJson(json).c_str());
  return absl::OkStatus();
#else
  return absl::UnavailableError("--scorer cuda: this entrokv was built without CUDA");
#endif
}

absl::Status Run(const ArgParser& parser) {
  BenchSetup setup;
  ASSIGN_OR_RETURN(const int64_t seed, parser.GetInt("seed"));
  if (parser.Given("input")) {
    RETURN_IF_ERROR(LoadStatistic(parser.Get("input"), &setup));
  } else {
    ASSIGN_OR_RETURN(const int64_t layers, parser.GetInt("layers"));
    ASSIGN_OR_RETURN(const int64_t heads, parser.GetInt("query-heads"));
    ASSIGN_OR_RETURN(setup.tokens, parser.GetInt("tokens"));
    ASSIGN_OR_RETURN(setup.dtype, ParseDType(parser.Get("dtype")));
    if (layers <= 0 || heads <= 0 || setup.tokens <= 0) {
      return absl::InvalidArgumentError("--layers, --query-heads, --tokens: must be positive");
    }
    setup.layers = static_cast<int>(layers);
    setup.query_heads = static_cast<int>(heads);
  }
  ASSIGN_OR_RETURN(const int64_t kv_groups, parser.GetInt("kv-heads"));
  ASSIGN_OR_RETURN(const int64_t page_size, parser.GetInt("page-size"));
  ASSIGN_OR_RETURN(const double budget, parser.GetDouble("budget"));
  ASSIGN_OR_RETURN(const int64_t threads, parser.GetInt("threads"));
  ASSIGN_OR_RETURN(const int64_t runs, parser.GetInt("runs"));
  ASSIGN_OR_RETURN(const double alpha, parser.GetDouble("alpha"));
  ASSIGN_OR_RETURN(const Policy* policy, FindPolicy(parser.Get("policy")));
  if (runs < 1) return absl::InvalidArgumentError("--runs: must be >= 1");
  if (threads < 1) return absl::InvalidArgumentError("--threads: must be >= 1");
  if (kv_groups < 1) return absl::InvalidArgumentError("--kv-heads: must be >= 1");
  setup.kv_groups = static_cast<int>(kv_groups);

  PolicyOptions options;
  options.page_size = static_cast<int>(page_size);
  options.alpha = alpha;
  options.protections.tail_page = parser.GetFlag("protect-tail");
  RETURN_IF_ERROR(ParseNeighbourhood(parser, &options));
  ASSIGN_OR_RETURN(options.group_floor, parser.GetDouble("group-floor"));
  RETURN_IF_ERROR(ValidateGroupFloor("--group-floor", options.group_floor));
  RETURN_IF_ERROR(ValidatePolicyOptions(options));
  // --layer-floor: the "mass" allocator (every page scored, then the layers' quotas moved).
  std::optional<double> layer_floor;
  if (parser.Given("layer-floor")) {
    ASSIGN_OR_RETURN(layer_floor, parser.GetDouble("layer-floor"));
    RETURN_IF_ERROR(ValidateLayerFloor("--layer-floor", *layer_floor));
  }
  ASSIGN_OR_RETURN(const BudgetPlan plan,
                   PlanBudget(FractionBudget(setup.layers, setup.kv_groups, options.page_size,
                                             setup.tokens, budget)));

  if (!parser.Given("input")) FillStatistic(static_cast<uint64_t>(seed), &setup);
  const int64_t layer_elements = static_cast<int64_t>(setup.query_heads) * setup.tokens;
  std::vector<LayerRequest> requests(static_cast<size_t>(setup.layers));
  for (int l = 0; l < setup.layers; ++l) {
    ASSIGN_OR_RETURN(
        const StatisticView view,
        StatisticView::Create(setup.bytes.data() + l * layer_elements * DTypeBytes(setup.dtype),
                              setup.dtype, setup.query_heads, setup.tokens));
    LayerRequest& request = requests[static_cast<size_t>(l)];
    request = LayerRequestFor(view, setup.query_heads, setup.kv_groups, setup.tokens,
                              plan.pages_per_layer[static_cast<size_t>(l)]);
    request.measure = parser.GetFlag("measure");
    if (layer_floor.has_value()) RankEveryPage(options.page_size, &request);
  }
  const std::string scorer = parser.Get("scorer");
  if (scorer == "cuda" && layer_floor.has_value()) {
    return absl::InvalidArgumentError("--layer-floor: on the CPU scorer only");
  }
  if (scorer == "cuda") {
    return RunCuda(parser, setup, *policy, options, std::move(requests), runs, budget, page_size);
  }
  if (scorer != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("--scorer: '", scorer, "' is not cpu or cuda"));
  }

  absl::Status status;
  std::vector<LayerDecision> decisions;
  auto fused = [&] {
    absl::StatusOr<std::vector<LayerDecision>> result =
        DecideModel(*policy, options, requests, static_cast<int>(threads));
    if (!result.ok()) {
      status = result.status();
      return;
    }
    decisions = *std::move(result);
    if (layer_floor.has_value()) {
      MoveLayerQuotas(options, requests, std::span<LayerDecision>(decisions), plan.layer_pages,
                      *layer_floor);
    }
  };
  volatile float sink = 0.0f;
  auto read_once = [&] { sink = sink + SumOnce(setup); };
  // Interleaved, so that both see the same machine (other load, frequency, cache state).
  fused();
  read_once();
  RETURN_IF_ERROR(status);
  std::vector<double> fused_ms, read_ms, ratios;
  for (int64_t run = 0; run < runs; ++run) {
    fused_ms.push_back(TimeMs(fused));
    read_ms.push_back(TimeMs(read_once));
    ratios.push_back(fused_ms.back() / read_ms.back());
  }
  RETURN_IF_ERROR(status);
  std::vector<double> reference_ms;
  if (parser.GetFlag("reference")) {
    for (int64_t run = 0; run < runs; ++run) {
      reference_ms.push_back(TimeMs([&] {
        for (const LayerRequest& request : requests) {
          absl::StatusOr<LayerDecision> result = DecideLayer(*policy, options, request);
          if (!result.ok()) status = result.status();
        }
      }));
    }
    RETURN_IF_ERROR(status);
  }
  if (parser.Given("kept-out")) RETURN_IF_ERROR(WriteKept(parser.Get("kept-out"), decisions));

  const double median_ms = Median(fused_ms);
  const double read_once_ms = Median(read_ms);
  if (parser.GetFlag("json")) {
    // Times to 0.1 us: more digits would be noise.
    Json json = SetupJson(parser, setup, *policy, runs, page_size, budget);
    json["median_ms"] = RoundTo(median_ms, 4);
    json["min_ms"] = RoundTo(*std::min_element(fused_ms.begin(), fused_ms.end()), 4);
    json["read_once_ms"] = RoundTo(read_once_ms, 4);
    json["read_once_min_ms"] = RoundTo(*std::min_element(read_ms.begin(), read_ms.end()), 4);
    json["ratio_median"] = RoundTo(Median(ratios), 5);
    json["threads"] = threads;
    if (!reference_ms.empty()) json["reference_ms"] = RoundTo(Median(reference_ms), 4);
    std::printf("%s\n", DumpJson(json).c_str());
  } else {
    std::printf("fused:     median %.3f ms, min %.3f ms over %lld runs, %d thread(s)\n", median_ms,
                *std::min_element(fused_ms.begin(), fused_ms.end()), static_cast<long long>(runs),
                static_cast<int>(threads));
    std::printf("read once: median %.3f ms over %zu bytes (paired ratio %.2fx)\n", read_once_ms,
                setup.bytes.size(), Median(ratios));
    if (!reference_ms.empty()) {
      std::printf("reference: median %.3f ms (DecideLayer per layer)\n", Median(reference_ms));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunBench(const std::vector<std::string>& args) {
  ArgParser parser(kCommand, "core [options]");
  parser.Option("layers", "28", "L, layers of the seeded statistic");
  parser.Option("query-heads", "12", "H_Q, query heads");
  parser.Option("kv-heads", "2", "G, KV heads (groups)");
  parser.Option("tokens", "131072", "T, sequence length");
  parser.Option("page-size", "16", "B, tokens per page");
  parser.Option("budget", "0.2", "F, the share of the sequence kept");
  parser.Option("threads", "1", "worker threads across layers");
  parser.Option("dtype", "f32", "f32, f16 or bf16");
  parser.Option("policy", "page_entrokv", "scoring policy");
  parser.Option("alpha", "2", "Renyi order");
  parser.Option("neighbourhood-kernel", "1", "neighbourhood pooling width (odd; 1: off)");
  parser.Option("neighbourhood", "max", "neighbourhood pooling: max or mean");
  parser.Option("group-floor", "1", "share of its quota each group keeps (1: fixed quotas)");
  parser.Option("layer-floor", "",
                "the \"mass\" layer allocator, each layer keeping at least this share of the "
                "mean (unset: the plan's quotas)");
  parser.Option("runs", "7", "timed runs after one warm-up");
  parser.Option("seed", "1", "seed of the generated statistic");
  parser.Option("input", "", "a [L, H_Q, T] .npy statistic instead of the seeded one");
  parser.Option("scorer", "cpu", "cpu, or cuda (the statistic in GPU memory, --json only)");
  parser.Option("kept-out", "", "write the kept pages, one line per (layer, group)");
  parser.Flag("measure", false, "also compute the shadow UOR, disagreement and retained mass");
  parser.Flag("protect-tail", false, "protect the tail page");
  parser.Flag("reference", false, "also time the straightforward DecideLayer");
  parser.Flag("json", false, "print one JSON object");
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(parser.Help().c_str(), args.empty() ? stderr : stdout);
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] != "core") {
    return UsageError(kCommand, absl::InvalidArgumentError(
                                    absl::StrCat("unknown target '", args[0], "'; try: core")));
  }
  const absl::StatusOr<bool> parsed =
      parser.Parse(std::vector<std::string>(args.begin() + 1, args.end()));
  if (!parsed.ok()) return UsageError(kCommand, parsed.status());
  if (!*parsed) return kExitOk;
  const absl::Status status = Run(parser);
  if (!status.ok()) return UsageError(kCommand, status);
  return kExitOk;
}

}  // namespace entrokv::cli
