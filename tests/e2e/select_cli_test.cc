// `entrokv select` as a user runs it: a real binary on real .npy files.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/io/npy.h"
#include "core/scoring/cover_mix.h"
#include "core/scoring/decision.h"
#include "core/scoring/key_scores.h"
#include "core/scoring/statistic.h"
#include "core/testing/random_rows.h"
#include "core/util/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cli_runner.h"

namespace entrokv {
namespace {

using ::entrokv::testing::CliRun;
using ::entrokv::testing::RunCli;
using ::testing::HasSubstr;

class SelectCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("entrokv_select_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, NpyType type, std::vector<int64_t> shape,
                    const void* data, size_t bytes) {
    NpyArray array;
    array.type = type;
    array.shape = std::move(shape);
    array.bytes.assign(static_cast<const uint8_t*>(data),
                       static_cast<const uint8_t*>(data) + bytes);
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(WriteNpy(path, array).ok());
    return path;
  }

  std::filesystem::path dir_;
};

// The JSON the CLI must print for `decisions`, built from the library's own results.
std::string ExpectedKeptPages(const std::vector<LayerDecision>& decisions) {
  std::vector<std::string> parts;
  for (const LayerDecision& layer : decisions) {
    for (const GroupDecision& group : layer.groups) {
      parts.push_back(absl::StrCat("\"kept_pages\":[", absl::StrJoin(group.kept_pages, ","), "]"));
    }
  }
  return absl::StrJoin(parts, "|");
}

// A keys mix as entrokv select makes one: MixRows on each layer of `rows` ([layers][heads][T]
// key scores, overwritten) with the same layer of `sent`.
void MixEachLayer(const std::vector<float>& sent, int heads, int tokens, double weight,
                  MixRule rule, std::vector<float>& rows) {
  const size_t layer = static_cast<size_t>(heads) * static_cast<size_t>(tokens);
  for (size_t at = 0; at < rows.size(); at += layer) {
    const StatisticView view =
        *StatisticView::Create(sent.data() + at, DType::kFloat32, heads, tokens);
    ASSERT_TRUE(MixRows(view, weight, rule, std::span<float>(rows.data() + at, layer)).ok());
  }
}

std::string ActualKeptPages(const std::string& json) {
  std::vector<std::string> parts;
  for (size_t at = json.find("\"kept_pages\""); at != std::string::npos;
       at = json.find("\"kept_pages\"", at + 1)) {
    parts.push_back(json.substr(at, json.find(']', at) - at + 1));
  }
  return absl::StrJoin(parts, "|");
}

// Runs both `entrokv` commands, each of which must succeed, and expects the same kept pages.
void ExpectSameKeptPages(const std::string& one, const std::string& other) {
  const CliRun first = RunCli(one);
  const CliRun second = RunCli(other);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  ASSERT_EQ(second.exit_code, 0) << second.out;
  EXPECT_EQ(ActualKeptPages(first.out), ActualKeptPages(second.out));
}

TEST_F(SelectCliTest, JsonMatchesTheLibraryForEveryLayerAndGroup) {
  const int layers = 3, heads = 8, groups = 2;
  const int64_t tokens = 1000;
  std::mt19937_64 rng(11);
  std::vector<float> data;
  for (int l = 0; l < layers; ++l) {
    const std::vector<float> layer = testing::MixedRows(heads, tokens, rng);
    data.insert(data.end(), layer.begin(), layer.end());
  }
  const std::string path = Write("stats.npy", NpyType::kFloat32, {layers, heads, tokens},
                                 data.data(), data.size() * sizeof(float));
  const CliRun run =
      RunCli(absl::StrCat("select --stats ", path, " --kv-heads 2 --page-size 16 --pages 5"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("{\"layers\":[{\"layer\":0,\"groups\":[{\"group\":0,"));
  EXPECT_THAT(run.out, HasSubstr("\"weights\":["));
  EXPECT_THAT(run.out, HasSubstr("\"entropies\":["));
  EXPECT_THAT(run.out, HasSubstr("\"uor\":"));

  std::vector<LayerDecision> expected;
  for (int l = 0; l < layers; ++l) {
    const LayerRequest request = LayerRequestFor(
        *StatisticView::Create(data.data() + l * heads * tokens, DType::kFloat32, heads, tokens),
        heads, groups, tokens, 5);
    expected.push_back(*DecideLayer(**FindPolicy("page_entrokv"), {}, request));
  }
  EXPECT_EQ(ActualKeptPages(run.out), ExpectedKeptPages(expected));

  // The document parses, and the weights and entropies read back bit-exact (they were printed
  // with 9 significant digits before).
  const absl::StatusOr<Json> parsed = ParseJson(run.out, "select output");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Json& out_layers = (*parsed)["layers"];
  ASSERT_EQ(out_layers.size(), expected.size());
  for (size_t l = 0; l < expected.size(); ++l) {
    ASSERT_EQ(out_layers[l]["groups"].size(), expected[l].groups.size());
    for (size_t g = 0; g < expected[l].groups.size(); ++g) {
      const Json& group = out_layers[l]["groups"][g];
      EXPECT_EQ(group["weights"].get<std::vector<double>>(), expected[l].groups[g].weights);
      EXPECT_EQ(group["entropies"].get<std::vector<double>>(), expected[l].groups[g].entropies);
    }
  }
}

// --scope layer: one page set per layer, shared by every group, as the library decides it.
TEST_F(SelectCliTest, LayerScopeKeepsOneSetPerLayer) {
  const int heads = 8, groups = 4;
  const int64_t tokens = 700;
  std::mt19937_64 rng(12);
  const std::vector<float> data = testing::MixedRows(heads, tokens, rng);
  const std::string path = Write("stats.npy", NpyType::kFloat32, {heads, tokens}, data.data(),
                                 data.size() * sizeof(float));
  const CliRun run = RunCli(absl::StrCat("select --stats ", path,
                                         " --kv-heads 4 --page-size 16 --pages 6 --scope layer"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"scope\":\"layer\",\"union_pages\":6,"));
  LayerRequest request =
      LayerRequestFor(*StatisticView::Create(data.data(), DType::kFloat32, heads, tokens), heads,
                      groups, tokens, 6);
  request.scope = SelectionScope::kLayer;
  const LayerDecision expected = *DecideLayer(**FindPolicy("page_entrokv"), {}, request);
  EXPECT_EQ(ActualKeptPages(run.out), ExpectedKeptPages({expected}));
  const CliRun bad =
      RunCli(absl::StrCat("select --stats ", path, " --kv-heads 4 --pages 6", " --scope head"));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--scope"));
}

TEST_F(SelectCliTest, BudgetIsPlannedOverTheLayers) {
  std::vector<float> data(2 * 4 * 160, 1.0f);
  const std::string path =
      Write("flat.npy", NpyType::kFloat32, {2, 4, 160}, data.data(), data.size() * 4);
  // F = 0.25 of 160 tokens x 2 layers / 16 = 5 layer-pages: 3 for layer 0, 2 for layer 1.
  const CliRun run =
      RunCli(absl::StrCat("select --stats ", path, " --kv-heads 2 --page-size 16 --budget 0.25"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(ActualKeptPages(run.out),
            "\"kept_pages\":[0,1,2]|\"kept_pages\":[0,1,2]|\"kept_pages\":[0,1]|"
            "\"kept_pages\":[0,1]");
}

// The two columns hold the same six values in a different head order, a tie that goes to page 0
// (docs/architecture.md §3.7) under mean pooling, whatever the rounding.
TEST_F(SelectCliTest, MeanPoolingTieKeepsTheLowerPage) {
  const std::vector<float> values = {0.1f, 0.7f, 0.3f, 0.9f, 0.05f, 0.45f};
  std::vector<float> data;  // [6, 2]
  for (size_t h = 0; h < values.size(); ++h) {
    data.push_back(values[h]);
    data.push_back(values[values.size() - 1 - h]);
  }
  const std::string path =
      Write("tie.npy", NpyType::kFloat32, {6, 2}, data.data(), data.size() * sizeof(float));
  for (const char* policy : {"mean", "h2o"}) {
    const CliRun run = RunCli(absl::StrCat("select --stats ", path, " --policy ", policy,
                                           " --kv-heads 1 --page-size 1 --pages 1"));
    ASSERT_EQ(run.exit_code, 0) << run.out;
    EXPECT_EQ(ActualKeptPages(run.out), "\"kept_pages\":[0]") << policy;
  }
}

// The table's headline counts the pages kept, not the pages a layer has.
TEST_F(SelectCliTest, TableHeadlineCountsThePagesKept) {
  std::vector<float> data(2 * 4 * 160, 1.0f);
  const std::string path =
      Write("flat.npy", NpyType::kFloat32, {2, 4, 160}, data.data(), data.size() * 4);
  // 5 layer-pages: 3 per group in layer 0, 2 in layer 1, 2 groups; 10 pages per (layer, group).
  const CliRun run = RunCli(absl::StrCat(
      "select --stats ", path, " --kv-heads 2 --page-size 16 --budget 0.25 --format table"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("10 of 40 pages kept"));
}

TEST_F(SelectCliTest, HalfPrecisionFilesDecideLikeFloat32) {
  std::mt19937_64 rng(5);
  const std::vector<float> data = testing::MixedRows(4, 300, rng);
  std::vector<uint16_t> brain(data.size()), half(data.size());
  std::vector<float> widened_bf16(data.size()), widened_f16(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    brain[i] = FloatToBFloat16(data[i]);
    half[i] = FloatToFloat16(data[i]);
    widened_bf16[i] = BFloat16ToFloat(brain[i]);
    widened_f16[i] = Float16ToFloat(half[i]);
  }
  const std::string args = " --kv-heads 2 --page-size 8 --pages 4";
  const CliRun bf16 =
      RunCli("select --dtype bf16 --stats " +
             Write("b.npy", NpyType::kUInt16, {4, 300}, brain.data(), brain.size() * 2) + args);
  const CliRun bf16_wide = RunCli(
      "select --stats " +
      Write("bw.npy", NpyType::kFloat32, {4, 300}, widened_bf16.data(), widened_bf16.size() * 4) +
      args);
  const CliRun f16 =
      RunCli("select --stats " +
             Write("h.npy", NpyType::kFloat16, {4, 300}, half.data(), half.size() * 2) + args);
  const CliRun f16_wide = RunCli(
      "select --stats " +
      Write("hw.npy", NpyType::kFloat32, {4, 300}, widened_f16.data(), widened_f16.size() * 4) +
      args);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.out;
  ASSERT_EQ(f16.exit_code, 0) << f16.out;
  EXPECT_EQ(bf16.out, bf16_wide.out);
  EXPECT_EQ(f16.out, f16_wide.out);
}

TEST_F(SelectCliTest, BadInputIsOneLineAndExitCodeTwo) {
  std::ofstream(dir_ / "junk.npy") << "this is not numpy";
  std::vector<float> data(12 * 64, 0.5f);
  const std::string good =
      Write("good.npy", NpyType::kFloat32, {12, 64}, data.data(), data.size() * 4);
  std::vector<uint16_t> u16(12 * 64, 0);
  const std::string raw_u16 =
      Write("u16.npy", NpyType::kUInt16, {12, 64}, u16.data(), u16.size() * 2);
  data[70] = -1.0f;
  const std::string negative =
      Write("neg.npy", NpyType::kFloat32, {12, 64}, data.data(), data.size() * 4);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"select --stats " + (dir_ / "junk.npy").string() + " --kv-heads 2 --pages 1", "magic"},
      {"select --stats " + (dir_ / "missing.npy").string() + " --kv-heads 2 --pages 1",
       "cannot open"},
      {"select --stats " + raw_u16 + " --kv-heads 2 --pages 1", "--dtype bf16"},
      {"select --stats " + good + " --kv-heads 5 --pages 1", "--kv-heads"},
      {"select --stats " + good + " --kv-heads 2 --pages 0", "--pages"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --page-size 0", "page_size"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --tau 0", "tau"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --alpha -2", "alpha"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --neighbourhood-kernel 4",
       "--neighbourhood-kernel"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --neighbourhood median",
       "--neighbourhood"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --group-floor 2", "--group-floor"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --group-floor 0.5 --scope layer",
       "--group-floor"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --group-floor 0.5 --policy streaming",
       "--group-floor"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --policy lru", "policy"},
      {"select --stats " + good + " --kv-heads 2", "exactly one of --pages and --budget"},
      {"select --stats " + good + " --kv-heads 2 --budget 0.001", "one page per layer"},
      {"select --stats " + good + " --kv-heads 2 --budget 0.5 --allocator zigzag",
       "--allocator: 'zigzag' is not one of uniform, pyramid, mass"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --allocator mass",
       "--allocator: only with --budget"},
      {"select --stats " + good + " --kv-heads 2 --budget 0.5 --layer-floor 0.5",
       "--layer-floor: only with --allocator mass"},
      {"select --stats " + good + " --kv-heads 2 --budget 0.5 --allocator mass --layer-floor 2",
       "--layer-floor: must be in [0, 1]"},
      {"select --stats " + good + " --kv-heads 2 --budget 0.5 --allocator mass --policy streaming",
       "--allocator: mass"},
      {"select --stats " + negative + " --kv-heads 2 --pages 1", "head 1, token 6"},
      {"select --stats " + good + " --kv-heads 2 --pages 1 --bogus", "unknown option"},
  };
  for (const auto& [arguments, message] : cases) {
    const CliRun run = RunCli(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.out;
    EXPECT_THAT(run.out, HasSubstr(message)) << arguments;
    EXPECT_EQ(std::count(run.out.begin(), run.out.end(), '\n'), 1) << run.out;
  }
}

// --keys scores a keys file as the daemon scores a keys statistic: the decision is the one the
// same scores given as a statistic get.
TEST_F(SelectCliTest, KeysDecideAsTheirScoresDo) {
  constexpr int kLayers = 2, kGroups = 2, kTokens = 64, kDim = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> keys(kLayers * kGroups * kTokens * kDim);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = normal(rng) + (i % kDim == 0 ? 2.0F : 0.0F);
  for (const std::string score : {"keydiff", "norm"}) {
    std::vector<float> scores(kLayers * kGroups * kTokens);
    const std::vector<uint8_t> present(kTokens, 1);
    for (int row = 0; row < kLayers * kGroups; ++row) {
      ScoreKeys(*ParseKeyScore(score),
                std::span<const float>(keys.data() + row * kTokens * kDim, kTokens * kDim), kDim,
                present, std::span<float>(scores.data() + row * kTokens, kTokens));
    }
    const std::string keys_path =
        Write("keys.npy", NpyType::kFloat32, {kLayers, kGroups, kTokens, kDim}, keys.data(),
              keys.size() * 4);
    const std::string stats_path =
        Write("scores.npy", NpyType::kFloat32, {kLayers, kGroups, kTokens}, scores.data(),
              scores.size() * 4);
    const std::string rest = " --kv-heads 2 --page-size 16 --pages 2 --policy mean";
    const CliRun from_keys =
        RunCli(absl::StrCat("select --keys ", keys_path, " --key-score ", score, rest));
    const CliRun from_scores = RunCli(absl::StrCat("select --stats ", stats_path, rest));
    ASSERT_EQ(from_keys.exit_code, 0) << from_keys.out;
    ASSERT_EQ(from_scores.exit_code, 0) << from_scores.out;
    EXPECT_EQ(ActualKeptPages(from_keys.out), ActualKeptPages(from_scores.out)) << score;
    EXPECT_THAT(from_keys.out, HasSubstr("\"kept_pages\""));
    // Mixed with a statistic of 4 query heads: each group's scores go to its 2 heads.
    std::vector<float> sent(kLayers * 4 * kTokens);
    for (float& value : sent) value = std::abs(normal(rng));
    std::vector<float> mixed(sent.size());
    for (int head = 0; head < kLayers * 4; ++head) {  // (layer, group) of head: head / 2
      std::copy_n(scores.begin() + head / 2 * kTokens, kTokens, mixed.begin() + head * kTokens);
    }
    ASSERT_NO_FATAL_FAILURE(MixEachLayer(sent, 4, kTokens, 0.5, MixRule::kAverage, mixed));
    const CliRun from_mix = RunCli(absl::StrCat(
        "select --stats ",
        Write("sent.npy", NpyType::kFloat32, {kLayers, 4, kTokens}, sent.data(), sent.size() * 4),
        " --keys ", keys_path, " --key-score ", score, rest));
    const CliRun from_mixed =
        RunCli(absl::StrCat("select --stats ",
                            Write("mixed.npy", NpyType::kFloat32, {kLayers, 4, kTokens},
                                  mixed.data(), mixed.size() * 4),
                            rest));
    ASSERT_EQ(from_mix.exit_code, 0) << from_mix.out;
    EXPECT_EQ(ActualKeptPages(from_mix.out), ActualKeptPages(from_mixed.out)) << score;
  }
  const std::string keys_path = (dir_ / "keys.npy").string();
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"select --kv-heads 2 --pages 1", "give --stats, --keys, or both"},
           {"select --keys " + keys_path + " --keys-weight 0.3 --kv-heads 2 --pages 1",
            "--keys-weight: only with both"},
           {"select --keys " + keys_path + " --key-score cosine --kv-heads 2 --pages 1",
            "\"cosine\""},
           {"select --keys " + keys_path + " --kv-heads 1 --pages 1", "2 KV groups"}}) {
    const CliRun run = RunCli(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.out;
    EXPECT_THAT(run.out, HasSubstr(message)) << arguments;
  }
}

// Expected attention: one row per query head of --query-mean (and --query-covariance), the
// decision the same rows given as a statistic get; bad query files are refused by flag.
TEST_F(SelectCliTest, ExpectedAttentionDecidesAsItsRowsDo) {
  constexpr int kLayers = 2, kGroups = 2, kHeads = 4, kTokens = 64, kDim = 8;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> keys(kLayers * kGroups * kTokens * kDim);
  for (float& value : keys) value = normal(rng);
  std::vector<float> mean(kLayers * kHeads * kDim);
  for (float& value : mean) value = 2.0F * normal(rng);
  std::vector<float> covariance(kLayers * kHeads * kDim * kDim, 0.0F);
  for (int h = 0; h < kLayers * kHeads; ++h) {
    for (int i = 0; i < kDim; ++i) covariance[(h * kDim + i) * kDim + i] = 1.0F + h % 3;
  }
  const std::string keys_path =
      Write("keys.npy", NpyType::kFloat32, {kLayers, kGroups, kTokens, kDim}, keys.data(),
            keys.size() * 4);
  const std::string mean_path =
      Write("mean.npy", NpyType::kFloat32, {kLayers, kHeads, kDim}, mean.data(), mean.size() * 4);
  const std::string covariance_path =
      Write("covariance.npy", NpyType::kFloat32, {kLayers, kHeads, kDim, kDim}, covariance.data(),
            covariance.size() * 4);
  const std::vector<uint8_t> present(kTokens, 1);
  for (const bool with_covariance : {false, true}) {
    std::vector<float> rows(kLayers * kHeads * kTokens);
    for (int h = 0; h < kLayers * kHeads; ++h) {
      const int key_row = h / (kHeads / kGroups);  // (layer, group) of head h
      ScoreExpectedAttention(
          std::span<const float>(keys.data() + key_row * kTokens * kDim, kTokens * kDim), kDim,
          present, std::span<const float>(mean.data() + h * kDim, kDim),
          with_covariance ? std::span<const float>(covariance.data() + h * kDim * kDim, kDim * kDim)
                          : std::span<const float>(),
          std::span<float>(rows.data() + h * kTokens, kTokens));
    }
    const std::string stats_path = Write("rows.npy", NpyType::kFloat32, {kLayers, kHeads, kTokens},
                                         rows.data(), rows.size() * 4);
    SCOPED_TRACE(with_covariance ? "with the covariance" : "the mean alone");
    const std::string rest = " --page-size 16 --pages 2 --policy mean";
    // The keys and how they are scored, for each command below that scores them.
    const std::string scored = absl::StrCat(
        " --keys ", keys_path, " --key-score expected_attention --query-mean ", mean_path,
        with_covariance ? " --query-covariance " + covariance_path : std::string(), rest);
    ASSERT_NO_FATAL_FAILURE(
        ExpectSameKeptPages(absl::StrCat("select", scored),
                            absl::StrCat("select --stats ", stats_path, " --kv-heads 2", rest)));
    // A keys mix: a statistic's rows with these, each scaled to its share and combined
    // (MixRows: averaged, then by the max rule), decide as the mix given as a statistic.
    std::vector<float> sent(rows.size());
    for (float& value : sent) value = std::abs(normal(rng));
    // Each row's largest value on the sink page, past the sinks: ranked with the sinks, page 0
    // leads the cover order and is kept, which it is not otherwise.
    for (size_t row = 0; row < sent.size(); row += kTokens) sent[row + 8] = 50.0F;
    const std::string sent_path = Write("sent.npy", NpyType::kFloat32, {kLayers, kHeads, kTokens},
                                        sent.data(), sent.size() * 4);
    // The cover rule, with the tail page protected: each layer's keys' rows ordered by page
    // with the sent rows (CoverThenFill, its defaults; with the covariance, the question pooled
    // forward and the sink pages ranked), given as a statistic, decide alike.
    const bool forward = with_covariance;
    std::vector<float> covered = rows;
    PolicyOptions tail;
    tail.protections.tail_page = true;
    for (size_t at = 0; at < covered.size(); at += kHeads * kTokens) {
      const StatisticView view =
          *StatisticView::Create(sent.data() + at, DType::kFloat32, kHeads, kTokens);
      ASSERT_TRUE(CoverThenFill(view, CoverMix{.question_forward = forward, .rank_sinks = forward},
                                kHeads / kGroups, 16, CoverSpanOf(tail, kTokens),
                                std::span<float>(covered.data() + at, kHeads * kTokens))
                      .ok());
    }
    const std::string covered_path =
        Write("covered.npy", NpyType::kFloat32, {kLayers, kHeads, kTokens}, covered.data(),
              covered.size() * 4);
    ASSERT_NO_FATAL_FAILURE(ExpectSameKeptPages(
        absl::StrCat("select --stats ", sent_path, " --keys-mix-rule cover --protect-tail",
                     forward ? " --cover-question-forward --cover-rank-sinks" : "", scored),
        absl::StrCat("select --stats ", covered_path, " --kv-heads 2 --protect-tail", rest)));
    const MixRule rule = with_covariance ? MixRule::kMax : MixRule::kAverage;
    ASSERT_NO_FATAL_FAILURE(MixEachLayer(sent, kHeads, kTokens, 0.25, rule, rows));
    const std::string mixed_path = Write("mixed.npy", NpyType::kFloat32, {kLayers, kHeads, kTokens},
                                         rows.data(), rows.size() * 4);
    ASSERT_NO_FATAL_FAILURE(ExpectSameKeptPages(
        absl::StrCat("select --stats ", sent_path, " --keys-weight 0.25 --keys-mix-rule ",
                     rule == MixRule::kMax ? "max" : "average", scored),
        absl::StrCat("select --stats ", mixed_path, " --kv-heads 2", rest)));
  }
  // The covariance as a factor: S = diag(1 + h % 3) is F'F for F = sqrt(S); the same rows.
  std::vector<float> factor(covariance.size());
  for (size_t i = 0; i < factor.size(); ++i) factor[i] = std::sqrt(covariance[i]);
  const std::string factor_path =
      Write("factor.npy", NpyType::kFloat32, {kLayers, kHeads, kDim, kDim}, factor.data(),
            factor.size() * 4);
  const std::string rest = " --page-size 16 --pages 2 --policy mean";
  const std::string with_mean =
      "select --keys " + keys_path + " --key-score expected_attention --query-mean " + mean_path;
  const CliRun from_covariance =
      RunCli(absl::StrCat(with_mean, " --query-covariance ", covariance_path, rest));
  const CliRun from_factor =
      RunCli(absl::StrCat(with_mean, " --query-covariance-factor ", factor_path, rest));
  ASSERT_EQ(from_factor.exit_code, 0) << from_factor.out;
  EXPECT_EQ(ActualKeptPages(from_factor.out), ActualKeptPages(from_covariance.out));
  // A rank-2 factor: two rows per head.
  const std::string short_factor_path =
      Write("short_factor.npy", NpyType::kFloat32, {kLayers, kHeads, 2, kDim}, factor.data(),
            kLayers * kHeads * 2 * kDim * 4);
  const CliRun from_rank2 =
      RunCli(absl::StrCat(with_mean, " --query-covariance-factor ", short_factor_path, rest));
  EXPECT_EQ(from_rank2.exit_code, 0) << from_rank2.out;
  const std::string base = "select --keys " + keys_path + " --pages 1 --key-score ";
  const std::string group_mean_path =
      Write("group_mean.npy", NpyType::kFloat32, {kLayers, kGroups, kDim}, mean.data(),
            kLayers * kGroups * kDim * 4);
  const std::vector<float> short_rows(kLayers * kHeads * 32, 1.0F);
  const std::string short_path = Write("short.npy", NpyType::kFloat32, {kLayers, kHeads, 32},
                                       short_rows.data(), short_rows.size() * 4);
  const std::string mix = "select --stats " + (dir_ / "sent.npy").string() + " --keys " +
                          keys_path + " --pages 1 --key-score expected_attention --query-mean " +
                          mean_path;
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {base + "expected_attention", "--query-mean"},
           {base + "keydiff --query-mean " + mean_path, "--query-mean: only with"},
           {base + "expected_attention --query-mean " + covariance_path, "--query-mean"},
           {base + "expected_attention --query-mean " + mean_path + " --query-covariance " +
                mean_path,
            "--query-covariance"},
           {mix + " --keys-weight 1", "--keys-weight: must be in (0, 1), got 1"},
           {mix + " --keys-mix-rule union",
            "--keys-mix-rule: must be average, max or cover, got \"union\""},
           {mix + " --keys-mix-rule cover --keys-weight 0.3", "--keys-weight: not with"},
           {mix + " --cover-mass 0.5", "--cover-mass: only with --keys-mix-rule cover"},
           {mix + " --cover-question-forward",
            "--cover-question-forward: only with --keys-mix-rule cover"},
           {mix + " --cover-rank-sinks", "--cover-rank-sinks: only with --keys-mix-rule cover"},
           {mix + " --keys-mix-rule cover --cover-mass 0", "--cover-mass: must be in (0, 1]"},
           {mix + " --keys-mix-rule cover --cover-keys-kernel 2", "--cover-keys-kernel: must be"},
           {mix + " --keys-mix-rule cover --neighbourhood-kernel 3",
            "--keys-mix-rule: the cover rule orders the pages itself"},
           {base + "keydiff --cover-mass 0.5", "--cover-mass: only with both"},
           {base + "keydiff --keys-mix-rule max", "--keys-mix-rule: only with both"},
           {base + "expected_attention --query-mean " + mean_path + " --query-covariance " +
                covariance_path + " --query-covariance-factor " + factor_path,
            "--query-covariance-factor: not with --query-covariance"},
           {base + "expected_attention --query-mean " + mean_path + " --query-covariance-factor " +
                keys_path,  // p = 64 > D
            "[H_Q, p, D] (p in [1, D])"},
           {"select --stats " + short_path + " --keys " + keys_path +
                " --pages 1 --key-score keydiff",
            "--keys: scores 2 layers x 4 query heads x 64 tokens, --stats has 2 x 4 x 32"},
           // Expected attention scores one row per head of its mean: 2 heads (one per group)
           // are not the statistic's 4, and no group's row is copied to heads.
           {"select --stats " + (dir_ / "sent.npy").string() + " --keys " + keys_path +
                " --pages 1 --key-score expected_attention --query-mean " + group_mean_path,
            "--keys: scores 2 layers x 2 query heads x 64 tokens, --stats has 2 x 4 x 64"}}) {
    const CliRun run = RunCli(arguments);
    EXPECT_EQ(run.exit_code, 2) << arguments << "\n" << run.out;
    EXPECT_THAT(run.out, HasSubstr(message)) << arguments;
  }
}

TEST_F(SelectCliTest, HelpListsTheOptions) {
  const CliRun run = RunCli("select --help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.out, HasSubstr("--kv-heads"));
  EXPECT_THAT(run.out, HasSubstr("--protect-tail"));
}

}  // namespace
}  // namespace entrokv
