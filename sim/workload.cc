// How a row is built. Every LAST_ROW row is the sum of three parts with exact masses: the sink
// part (sink_mass on the first s tokens, most of it on token 0), the focus part (focus_mass on
// the archetype's positions: the needle span, the heavy hitters, or a window decaying from the
// end) and the residual (the rest, spread over the non-sink tokens with log-normal jitter).
// WINDOW_MEAN averages W query rows, which shrinks the jitter by about sqrt(W) and blurs the
// local window. ACCUMULATED sums the causal rows of all T queries in closed form: a token at t
// is seen by T - t queries, so sinks and early heavy hitters pile up mass, the diffuse part
// grows like ln(T / t), and a needle collects mass only from the question queries.
#include "sim/workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "sim/random.h"

namespace entrokv::sim {
namespace {

// Archetype shares at relative depth d in [0, 1]: local heads thin out and sink heads grow with
// depth; retrieval heads live in the middle and upper layers.
HeadArchetype DrawArchetype(double depth, Rng& rng) {
  const bool retrieval_band = depth >= 0.2 && depth <= 0.9;
  const double shares[kArchetypeCount] = {
      0.10 + 0.30 * depth,           // sink
      0.40 - 0.25 * depth,           // local
      0.20,                          // diffuse
      0.15 + 0.05 * depth,           // heavy hitter
      retrieval_band ? 0.15 : 0.03,  // retrieval
  };
  double total = 0.0;
  for (const double share : shares) total += share;
  double u = rng.Uniform() * total;
  for (int i = 0; i < kArchetypeCount; ++i) {
    if (u < shares[i]) return static_cast<HeadArchetype>(i);
    u -= shares[i];
  }
  return HeadArchetype::kRetrieval;
}

// Token 0 takes 70% of the sink mass, the other sinks share the rest.
double SinkShare(int64_t t, int64_t sinks) {
  if (sinks == 1) return 1.0;
  return t == 0 ? 0.7 : 0.3 / static_cast<double>(sinks - 1);
}

}  // namespace

absl::string_view ArchetypeName(HeadArchetype archetype) {
  switch (archetype) {
    case HeadArchetype::kSink:
      return "sink";
    case HeadArchetype::kLocal:
      return "local";
    case HeadArchetype::kDiffuse:
      return "diffuse";
    case HeadArchetype::kHeavyHitter:
      return "heavy_hitter";
    case HeadArchetype::kRetrieval:
      return "retrieval";
  }
  return "unknown";
}

absl::Status ValidateWorkloadOptions(const WorkloadOptions& options) {
  if (options.sink_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sink_tokens: must be >= 1, got ", options.sink_tokens));
  }
  if (options.needle_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("needle_tokens: must be >= 1, got ", options.needle_tokens));
  }
  const int64_t minimum = options.sink_tokens + 2 * int64_t{options.needle_tokens};
  if (options.tokens < minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: must be at least sink_tokens + 2 * needle_tokens = ", minimum,
                     ", got ", options.tokens));
  }
  for (const double depth : options.needle_depths) {
    if (!(depth >= 0.0 && depth <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("needle_depths: ", depth, " is not in [0, 1]"));
    }
  }
  if (options.window < 1) {
    return absl::InvalidArgumentError(absl::StrCat("window: must be >= 1, got ", options.window));
  }
  if (options.question_tokens < 1 || options.question_tokens > options.tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("question_tokens: must be in [1, tokens], got ", options.question_tokens));
  }
  return absl::OkStatus();
}

WorkloadGenerator::WorkloadGenerator(const ModelPreset& preset, const WorkloadOptions& options)
    : preset_(preset), options_(options) {
  const int64_t sinks = options_.sink_tokens;
  // Needles sit between the sinks and the question at the end.
  const int64_t last_start =
      std::max<int64_t>(sinks, options_.tokens - options_.question_tokens - options_.needle_tokens);
  for (const double depth : options_.needle_depths) {
    NeedleSpan span;
    span.depth = depth;
    span.begin =
        sinks + static_cast<int64_t>(std::floor(depth * static_cast<double>(last_start - sinks)));
    span.end = std::min(options_.tokens, span.begin + options_.needle_tokens);
    needles_.push_back(span);
  }
  Rng rng(MixSeed({options_.seed, 0x5a11e47ULL}));
  const int64_t salient_count = std::max<int64_t>(8, options_.tokens / 256);
  for (int64_t i = 0; i < salient_count; ++i) {
    salient_.push_back(sinks + rng.UniformInt(options_.tokens - sinks));
  }
}

HeadPlan WorkloadGenerator::Plan(int layer, int head) const {
  Rng rng(MixSeed(
      {options_.seed, 0x91a4ULL, static_cast<uint64_t>(layer), static_cast<uint64_t>(head)}));
  const double depth = preset_.layers > 1 ? static_cast<double>(layer) / (preset_.layers - 1) : 0.5;
  HeadPlan plan;
  plan.archetype = DrawArchetype(depth, rng);
  if (plan.archetype == HeadArchetype::kRetrieval && needles_.empty()) {
    plan.archetype = HeadArchetype::kHeavyHitter;
  }
  const int64_t sinks = options_.sink_tokens;
  switch (plan.archetype) {
    case HeadArchetype::kSink:
      plan.sink_mass = rng.Uniform(0.6, 0.95);
      plan.noise_sigma = 0.3;
      break;
    case HeadArchetype::kLocal:
      plan.sink_mass = rng.Uniform(0.05, 0.3);
      plan.focus_mass = rng.Uniform(0.4, 0.8);
      plan.decay_tokens = std::exp(rng.Uniform(std::log(16.0), std::log(512.0)));
      plan.noise_sigma = 0.5;
      break;
    case HeadArchetype::kDiffuse:
      plan.sink_mass = rng.Uniform(0.02, 0.2);
      plan.noise_sigma = 0.8;
      break;
    case HeadArchetype::kHeavyHitter: {
      plan.sink_mass = rng.Uniform(0.05, 0.3);
      plan.focus_mass = rng.Uniform(0.4, 0.8);
      const int64_t count = 4 + rng.UniformInt(13);
      double total = 0.0;
      for (int64_t i = 0; i < count; ++i) {
        // Heads of a layer share part of their hitters, as real heads share salient tokens.
        const bool shared = rng.Uniform() < 0.6;
        plan.hitters.push_back(shared ? salient_[static_cast<size_t>(
                                            rng.UniformInt(static_cast<int64_t>(salient_.size())))]
                                      : sinks + rng.UniformInt(options_.tokens - sinks));
        plan.hitter_weights.push_back(rng.Exponential());
        total += plan.hitter_weights.back();
      }
      for (double& weight : plan.hitter_weights) weight /= total;
      plan.noise_sigma = 0.6;
      break;
    }
    case HeadArchetype::kRetrieval:
      plan.sink_mass = rng.Uniform(0.0, 0.1);
      plan.focus_mass = rng.Uniform(0.6, 0.95);
      plan.needle = static_cast<int>(rng.UniformInt(static_cast<int64_t>(needles_.size())));
      plan.noise_sigma = 0.5;
      break;
  }
  // Leave at least 5% of the row to the residual, so every token gets some attention.
  plan.focus_mass = std::min(plan.focus_mass, 0.95 - plan.sink_mass);
  return plan;
}

HeadArchetype WorkloadGenerator::archetype(int layer, int head) const {
  return Plan(layer, head).archetype;
}

void WorkloadGenerator::GenerateLayer(int layer, std::span<float> out) const {
  GenerateLayer(layer, options_.kind, out);
}

void WorkloadGenerator::GenerateLayer(int layer, StatisticKind kind, std::span<float> out) const {
  const auto tokens = static_cast<size_t>(options_.tokens);
  for (int head = 0; head < preset_.query_heads; ++head) {
    const uint64_t noise_seed = MixSeed({options_.seed, 0x4015eULL, static_cast<uint64_t>(layer),
                                         static_cast<uint64_t>(head), static_cast<uint64_t>(kind)});
    FillRow(Plan(layer, head), kind, noise_seed,
            out.subspan(static_cast<size_t>(head) * tokens, tokens));
  }
}

void WorkloadGenerator::FillRow(const HeadPlan& plan, StatisticKind kind, uint64_t noise_seed,
                                std::span<float> row) const {
  const int64_t tokens = options_.tokens;
  const int64_t sinks = std::min<int64_t>(options_.sink_tokens, tokens);
  const bool accumulated = kind == StatisticKind::kAccumulated;
  const double sigma = kind == StatisticKind::kWindowMean
                           ? plan.noise_sigma / std::sqrt(static_cast<double>(options_.window))
                           : (accumulated ? 0.5 * plan.noise_sigma : plan.noise_sigma);
  Rng rng(noise_seed);
  const double log_tokens = std::log(static_cast<double>(tokens) + 0.5);

  // Residual: jitter x (1 for a row; ln(T / t) for the causal column sums of a diffuse part).
  double residual_sum = 0.0;
  for (int64_t t = sinks; t < tokens; ++t) {
    double value = std::exp(sigma * rng.Normal());
    if (accumulated) value *= log_tokens - std::log(static_cast<double>(t) + 0.5) + 1e-3;
    row[static_cast<size_t>(t)] = static_cast<float>(value);
    residual_sum += value;
  }
  // Mass per query of each part; in ACCUMULATED every part is scaled by how many queries see it.
  const double residual_mass = 1.0 - plan.sink_mass - plan.focus_mass;
  const double queries = static_cast<double>(tokens);
  const double residual_scale =
      (accumulated
           ? queries * (residual_mass +
                        (plan.archetype == HeadArchetype::kRetrieval ? plan.focus_mass : 0.0))
           : residual_mass) /
      std::max(residual_sum, 1e-300);
  for (int64_t t = sinks; t < tokens; ++t) {
    row[static_cast<size_t>(t)] =
        static_cast<float>(static_cast<double>(row[static_cast<size_t>(t)]) * residual_scale);
  }
  for (int64_t t = 0; t < sinks; ++t) {
    const double seen = accumulated ? queries - static_cast<double>(t) : 1.0;
    row[static_cast<size_t>(t)] = static_cast<float>(plan.sink_mass * SinkShare(t, sinks) * seen);
  }

  switch (plan.archetype) {
    case HeadArchetype::kLocal: {
      // Weight exp(-distance / lambda) over the non-sink tokens; a window of W queries sees the
      // window from W/2 tokens back on average. Accumulated: 1 - exp(-(T - t) / lambda).
      const double shift = kind == StatisticKind::kWindowMean ? options_.window / 2.0 : 0.0;
      const double inverse_lambda = 1.0 / plan.decay_tokens;
      double total = 0.0;
      std::vector<double> weights(static_cast<size_t>(tokens - sinks));
      for (int64_t t = sinks; t < tokens; ++t) {
        const double distance = static_cast<double>(tokens - 1 - t);
        const double weight = accumulated
                                  ? 1.0 - std::exp(-(distance + 1.0) * inverse_lambda)
                                  : std::exp(-std::max(0.0, distance - shift) * inverse_lambda);
        weights[static_cast<size_t>(t - sinks)] = weight;
        total += weight;
      }
      const double scale = plan.focus_mass * (accumulated ? queries : 1.0) / total;
      for (int64_t t = sinks; t < tokens; ++t) {
        row[static_cast<size_t>(t)] +=
            static_cast<float>(weights[static_cast<size_t>(t - sinks)] * scale);
      }
      break;
    }
    case HeadArchetype::kHeavyHitter:
      for (size_t i = 0; i < plan.hitters.size(); ++i) {
        const int64_t t = plan.hitters[i];
        const double seen = accumulated ? queries - static_cast<double>(t) : 1.0;
        row[static_cast<size_t>(t)] +=
            static_cast<float>(plan.focus_mass * plan.hitter_weights[i] * seen);
      }
      break;
    case HeadArchetype::kRetrieval: {
      // The span's first token carries 4x the weight of the others; only the question queries
      // look at the needle.
      const NeedleSpan& span = needles_[static_cast<size_t>(plan.needle)];
      const double length = static_cast<double>(span.end - span.begin);
      const double seen = accumulated ? static_cast<double>(options_.question_tokens) : 1.0;
      for (int64_t t = span.begin; t < span.end; ++t) {
        const double share = (t == span.begin ? 4.0 : 1.0) / (length + 3.0);
        row[static_cast<size_t>(t)] += static_cast<float>(plan.focus_mass * share * seen);
      }
      break;
    }
    case HeadArchetype::kSink:
    case HeadArchetype::kDiffuse:
      break;
  }

  // Exact normalisation in double: rows sum to 1, accumulated rows to T.
  double total = 0.0;
  for (const float value : row) total += value;
  const double target = accumulated ? queries : 1.0;
  const auto scale = static_cast<float>(target / total);
  for (float& value : row) value *= scale;
}

}  // namespace entrokv::sim
