#include "sim/trace.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::sim {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("entrokv_trace_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(TraceTest, SyntheticTraceRoundTripsBitExact) {
  const ModelPreset tiny = *FindPreset("tiny");
  WorkloadOptions options;
  options.tokens = 256;
  options.seed = 9;
  options.needle_depths = {0.25, 0.75};
  options.needle_tokens = 8;
  const WorkloadGenerator generator(tiny, options);
  const std::string dir = TempDir("round_trip");
  ASSERT_THAT(WriteSyntheticTrace(dir, generator, /*with_accumulated=*/true), IsOk());

  ENTROKV_ASSERT_OK_AND_ASSIGN(const Trace trace, ReadTrace(dir));
  EXPECT_EQ(trace.meta.model.name, "tiny");
  EXPECT_EQ(trace.meta.model.layers, tiny.layers);
  EXPECT_EQ(trace.meta.model.query_heads, tiny.query_heads);
  EXPECT_EQ(trace.meta.model.kv_groups, tiny.kv_groups);
  EXPECT_EQ(trace.meta.tokens, 256);
  EXPECT_EQ(trace.meta.kind, StatisticKind::kLastRow);
  ASSERT_EQ(trace.meta.needles.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(trace.meta.needles[i].begin, generator.needles()[i].begin);
    EXPECT_EQ(trace.meta.needles[i].end, generator.needles()[i].end);
    EXPECT_EQ(trace.meta.needles[i].depth, generator.needles()[i].depth);
  }
  for (int layer = 0; layer < tiny.layers; ++layer) {
    std::vector<float> expected(static_cast<size_t>(tiny.query_heads * 256));
    generator.GenerateLayer(layer, expected);
    const auto got = trace.Layer(layer);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin(), expected.end()));
    generator.GenerateLayer(layer, StatisticKind::kAccumulated, expected);
    const auto got_accumulated = trace.AccumulatedLayer(layer);
    EXPECT_TRUE(std::equal(got_accumulated.begin(), got_accumulated.end(), expected.begin(),
                           expected.end()));
  }
}

TEST(TraceTest, ReadsMetadataWrittenByPythonsJsonDump) {
  const std::string dir = TempDir("python");
  TraceMeta meta;
  meta.model = {"m", 1, 2, 1, 8};
  meta.tokens = 4;
  std::vector<float> stats(8, 0.25f);
  ASSERT_THAT(WriteTrace(dir, meta, stats), IsOk());
  // Rewrite trace.json the way json.dump(indent=None) lays it out, with extra fields.
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile)
      << "{\"format\": \"entrokv-trace\", \"version\": 1, \"model\": {\"name\": \"qwen\", "
         "\"layers\": 1, \"query_heads\": 2, \"kv_groups\": 1}, \"tokens\": 4, "
         "\"statistic\": \"window_mean\", \"needles\": [{\"begin\": 1, \"end\": 3}], "
         "\"prompt\": \"ignored\"}";
  ENTROKV_ASSERT_OK_AND_ASSIGN(const Trace trace, ReadTrace(dir));
  EXPECT_EQ(trace.meta.model.name, "qwen");
  EXPECT_EQ(trace.meta.kind, StatisticKind::kWindowMean);
  ASSERT_EQ(trace.meta.needles.size(), 1u);
  EXPECT_EQ(trace.meta.needles[0].end, 3);
  EXPECT_TRUE(trace.accumulated.empty());
  EXPECT_TRUE(trace.AccumulatedLayer(0).empty());
}

TEST(TraceTest, ErrorsNameTheProblem) {
  EXPECT_THAT(ReadTrace(TempDir("missing")), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  TraceMeta meta;
  meta.model = {"m", 2, 2, 1, 8};
  meta.tokens = 4;
  std::vector<float> wrong(5, 0.0f);
  EXPECT_THAT(WriteTrace(TempDir("bad"), meta, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stats")));

  const std::string dir = TempDir("mismatch");
  std::vector<float> stats(16, 0.25f);
  ASSERT_THAT(WriteTrace(dir, meta, stats), IsOk());
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile)
      << "{\"model\": {\"layers\": 2, \"query_heads\": 2, \"kv_groups\": 1}, \"tokens\": 8}";
  EXPECT_THAT(ReadTrace(dir), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")));
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile)
      << "{\"model\": {\"layers\": 2, \"query_heads\": 2}, \"tokens\": 4}";
  EXPECT_THAT(ReadTrace(dir), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_groups")));
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile)
      << "{\"model\": {\"layers\": 2, \"query_heads\": 2, \"kv_groups\": 1}, \"tokens\": 4, "
         "\"needles\": [{\"begin\": 3, \"end\": 9}]}";
  EXPECT_THAT(ReadTrace(dir), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needles")));
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile)
      << "{\"model\": {\"layers\": 2, \"query_heads\": 2, \"kv_groups\": 1}, \"tokens\": 4, "
         "\"needles\": [3]}";
  EXPECT_THAT(ReadTrace(dir), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needles")));
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile)
      << "{\"model\": {\"layers\": \"two\", \"query_heads\": 2, \"kv_groups\": 1}, \"tokens\": 4}";
  EXPECT_THAT(ReadTrace(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.layers")));
  std::ofstream(std::filesystem::path(dir) / kTraceMetaFile) << "{\"model\": {\"layers\": 2,";
  EXPECT_THAT(ReadTrace(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("well-formed JSON")));
}

TEST(TraceTest, StatisticKindNamesRoundTrip) {
  for (const StatisticKind kind :
       {StatisticKind::kLastRow, StatisticKind::kWindowMean, StatisticKind::kAccumulated}) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(const StatisticKind parsed,
                                 ParseStatisticKind(StatisticKindName(kind)));
    EXPECT_EQ(parsed, kind);
  }
  EXPECT_THAT(ParseStatisticKind("column"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

}  // namespace
}  // namespace entrokv::sim
