#include "sim/trace.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/io/npy.h"
#include "core/util/dtype.h"
#include "core/util/json.h"
#include "core/util/status_macros.h"

namespace entrokv::sim {
namespace {

std::string JoinPath(const std::string& dir, absl::string_view file) {
  return (std::filesystem::path(dir) / std::string(file)).string();
}

int64_t ElementCount(const TraceMeta& meta) {
  return int64_t{meta.model.layers} * meta.model.query_heads * meta.tokens;
}

std::string MetaJson(const TraceMeta& meta, bool has_accumulated) {
  Json needles = Json::array();
  for (const NeedleSpan& needle : meta.needles) {
    needles.push_back({{"begin", needle.begin}, {"end", needle.end}, {"depth", needle.depth}});
  }
  const Json document = {{"format", "entrokv-trace"},
                         {"version", 1},
                         {"model",
                          {{"name", meta.model.name},
                           {"layers", meta.model.layers},
                           {"query_heads", meta.model.query_heads},
                           {"kv_groups", meta.model.kv_groups},
                           {"head_dim", meta.model.head_dim}}},
                         {"tokens", meta.tokens},
                         {"statistic", std::string(StatisticKindName(meta.kind))},
                         {"accumulated", has_accumulated},
                         {"sink_tokens", meta.sink_tokens},
                         {"needles", std::move(needles)},
                         {"source", meta.source}};
  return DumpJson(document, 2) + "\n";
}

absl::StatusOr<double> NumberField(const Json& object, absl::string_view key,
                                   absl::string_view where) {
  const auto value = object.find(std::string(key));
  if (value == object.end() || !value->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace.json: ", where, key, " is missing or not a number"));
  }
  return value->get<double>();
}

// The member `key` of `object`, or nullptr. REQUIRES: object.is_object().
const Json* Member(const Json& object, absl::string_view key) {
  const auto value = object.find(std::string(key));
  return value == object.end() ? nullptr : &*value;
}

absl::StatusOr<TraceMeta> ParseMeta(const Json& root) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError("trace.json: the document is not an object");
  }
  TraceMeta meta;
  const Json* model = Member(root, "model");
  if (model == nullptr || !model->is_object()) {
    return absl::InvalidArgumentError("trace.json: model is missing or not an object");
  }
  if (const Json* name = Member(*model, "name"); name != nullptr && name->is_string()) {
    meta.model.name = name->get<std::string>();
  }
  ASSIGN_OR_RETURN(const double layers, NumberField(*model, "layers", "model."));
  ASSIGN_OR_RETURN(const double heads, NumberField(*model, "query_heads", "model."));
  ASSIGN_OR_RETURN(const double groups, NumberField(*model, "kv_groups", "model."));
  meta.model.layers = static_cast<int>(layers);
  meta.model.query_heads = static_cast<int>(heads);
  meta.model.kv_groups = static_cast<int>(groups);
  if (Member(*model, "head_dim") != nullptr) {
    ASSIGN_OR_RETURN(const double head_dim, NumberField(*model, "head_dim", "model."));
    meta.model.head_dim = static_cast<int>(head_dim);
  }
  RETURN_IF_ERROR(ValidatePreset(meta.model));
  ASSIGN_OR_RETURN(const double tokens, NumberField(root, "tokens", ""));
  meta.tokens = static_cast<int64_t>(tokens);
  if (meta.tokens <= 0) {
    return absl::InvalidArgumentError("trace.json: tokens must be positive");
  }
  if (const Json* kind = Member(root, "statistic"); kind != nullptr) {
    if (!kind->is_string()) {
      return absl::InvalidArgumentError("trace.json: statistic is not a string");
    }
    ASSIGN_OR_RETURN(meta.kind, ParseStatisticKind(kind->get<std::string>()));
  }
  if (Member(root, "sink_tokens") != nullptr) {
    ASSIGN_OR_RETURN(const double sinks, NumberField(root, "sink_tokens", ""));
    meta.sink_tokens = static_cast<int>(sinks);
  }
  if (const Json* needles = Member(root, "needles"); needles != nullptr) {
    if (!needles->is_array()) {
      return absl::InvalidArgumentError("trace.json: needles is not an array");
    }
    for (const Json& item : *needles) {
      if (!item.is_object()) {
        return absl::InvalidArgumentError("trace.json: needles[] is not an object");
      }
      NeedleSpan span;
      ASSIGN_OR_RETURN(const double begin, NumberField(item, "begin", "needles[]."));
      ASSIGN_OR_RETURN(const double end, NumberField(item, "end", "needles[]."));
      span.begin = static_cast<int64_t>(begin);
      span.end = static_cast<int64_t>(end);
      if (Member(item, "depth") != nullptr) {
        ASSIGN_OR_RETURN(span.depth, NumberField(item, "depth", "needles[]."));
      }
      if (span.begin < 0 || span.end <= span.begin || span.end > meta.tokens) {
        return absl::InvalidArgumentError(absl::StrCat("trace.json: needles[]: span [", span.begin,
                                                       ", ", span.end, ") is not inside [0, ",
                                                       meta.tokens, ")"));
      }
      meta.needles.push_back(span);
    }
  }
  if (const Json* source = Member(root, "source"); source != nullptr && source->is_string()) {
    meta.source = source->get<std::string>();
  }
  return meta;
}

absl::Status WriteArray(const std::string& path, const TraceMeta& meta,
                        std::span<const float> values) {
  NpyArray array;
  array.type = NpyType::kFloat32;
  array.shape = {meta.model.layers, meta.model.query_heads, meta.tokens};
  array.bytes.resize(values.size() * sizeof(float));
  std::memcpy(array.bytes.data(), values.data(), array.bytes.size());
  return WriteNpy(path, array);
}

absl::StatusOr<std::vector<float>> ReadArray(const std::string& path, const TraceMeta& meta) {
  ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  const std::vector<int64_t> expected = {meta.model.layers, meta.model.query_heads, meta.tokens};
  if (array.shape != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": shape does not match trace.json's [layers, query_heads, tokens] = [",
                     expected[0], ", ", expected[1], ", ", expected[2], "]"));
  }
  std::vector<float> values(static_cast<size_t>(array.element_count()));
  const DType dtype = array.type == NpyType::kFloat32   ? DType::kFloat32
                      : array.type == NpyType::kFloat16 ? DType::kFloat16
                                                        : DType::kBFloat16;
  WidenToFloat(array.bytes.data(), dtype, array.element_count(), values.data());
  return values;
}

}  // namespace

absl::string_view StatisticKindName(StatisticKind kind) {
  switch (kind) {
    case StatisticKind::kLastRow:
      return "last_row";
    case StatisticKind::kWindowMean:
      return "window_mean";
    case StatisticKind::kAccumulated:
      return "accumulated";
  }
  return "unknown";
}

absl::StatusOr<StatisticKind> ParseStatisticKind(absl::string_view name) {
  for (const StatisticKind kind :
       {StatisticKind::kLastRow, StatisticKind::kWindowMean, StatisticKind::kAccumulated}) {
    if (StatisticKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("statistic: '", name, "' is not one of last_row, window_mean, accumulated"));
}

std::span<const float> Trace::Layer(int layer) const {
  const auto size = static_cast<size_t>(int64_t{meta.model.query_heads} * meta.tokens);
  return std::span<const float>(stats).subspan(static_cast<size_t>(layer) * size, size);
}

std::span<const float> Trace::AccumulatedLayer(int layer) const {
  if (accumulated.empty()) return {};
  const auto size = static_cast<size_t>(int64_t{meta.model.query_heads} * meta.tokens);
  return std::span<const float>(accumulated).subspan(static_cast<size_t>(layer) * size, size);
}

absl::Status WriteTrace(const std::string& dir, const TraceMeta& meta, std::span<const float> stats,
                        std::span<const float> accumulated) {
  RETURN_IF_ERROR(ValidatePreset(meta.model));
  const int64_t count = ElementCount(meta);
  if (meta.tokens <= 0 || static_cast<int64_t>(stats.size()) != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stats: has ", stats.size(), " values, layers x query_heads x tokens is ", count));
  }
  if (!accumulated.empty() && static_cast<int64_t>(accumulated.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("accumulated: has ", accumulated.size(), " values, expected ", count));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat(dir, ": cannot create: ", error.message()));
  }
  RETURN_IF_ERROR(WriteArray(JoinPath(dir, kTraceStatsFile), meta, stats));
  if (!accumulated.empty()) {
    RETURN_IF_ERROR(WriteArray(JoinPath(dir, kTraceAccumulatedFile), meta, accumulated));
  }
  std::ofstream out(JoinPath(dir, kTraceMetaFile));
  out << MetaJson(meta, !accumulated.empty());
  out.close();
  if (!out) {
    return absl::InternalError(absl::StrCat(JoinPath(dir, kTraceMetaFile), ": write failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Trace> ReadTrace(const std::string& dir) {
  const std::string meta_path = JoinPath(dir, kTraceMetaFile);
  std::ifstream in(meta_path);
  if (!in) return absl::NotFoundError(absl::StrCat(meta_path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(const Json root, ParseJson(text.str(), meta_path));
  Trace trace;
  ASSIGN_OR_RETURN(trace.meta, ParseMeta(root));
  ASSIGN_OR_RETURN(trace.stats, ReadArray(JoinPath(dir, kTraceStatsFile), trace.meta));
  const std::string accumulated_path = JoinPath(dir, kTraceAccumulatedFile);
  if (std::filesystem::exists(accumulated_path)) {
    ASSIGN_OR_RETURN(trace.accumulated, ReadArray(accumulated_path, trace.meta));
  }
  return trace;
}

absl::Status WriteSyntheticTrace(const std::string& dir, const WorkloadGenerator& generator,
                                 bool with_accumulated) {
  TraceMeta meta;
  meta.model = generator.preset();
  meta.tokens = generator.options().tokens;
  meta.kind = generator.options().kind;
  meta.sink_tokens = generator.options().sink_tokens;
  meta.needles = generator.needles();
  meta.source = absl::StrCat("entrokv-sim seed=", generator.options().seed);
  const auto layer_size = static_cast<size_t>(int64_t{meta.model.query_heads} * meta.tokens);
  std::vector<float> stats(layer_size * static_cast<size_t>(meta.model.layers));
  std::vector<float> accumulated(with_accumulated ? stats.size() : 0);
  for (int layer = 0; layer < meta.model.layers; ++layer) {
    const size_t offset = static_cast<size_t>(layer) * layer_size;
    generator.GenerateLayer(layer, std::span<float>(stats).subspan(offset, layer_size));
    if (with_accumulated) {
      generator.GenerateLayer(layer, StatisticKind::kAccumulated,
                              std::span<float>(accumulated).subspan(offset, layer_size));
    }
  }
  return WriteTrace(dir, meta, stats, accumulated);
}

}  // namespace entrokv::sim
