// A keys statistic through the real daemon over loopback: the worker writes keys into the
// pool's frames and sends no values; the daemon reads the keys from its own frames, scores them
// (core/scoring/key_scores.h) and decides. The decision must be the one the same scores sent as
// bytes get, in both frame layouts, at prefill and again once pages are gone.
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/pool/arena.h"
#include "core/scoring/cover_mix.h"
#include "core/scoring/key_scores.h"
#include "core/scoring/statistic.h"
#include "core/testing/status_matchers.h"
#include "core/util/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"

namespace entrokv::service::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kHeadDim = 8;                                         // RegisterRequest's geometry
constexpr int kPageSize = 16;                                       // RegisterRequest's geometry
constexpr int64_t kGroupFrameBytes = 2 * kPageSize * kHeadDim * 2;  // K and V, 2-byte elements

class KeyStatisticTest : public ServiceTest {
 protected:
  v1::PoolInfo RegisterLayout(const std::string& model, v1::FrameLayout layout) {
    grpc::ClientContext context;
    v1::RegisterModelRequest request = RegisterRequest(model, kLayers, kHeads, kGroups, 4 << 20);
    request.set_frame_layout(layout);
    v1::RegisterModelResponse response;
    const grpc::Status status = stub_->RegisterModel(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.pool();
  }

  grpc::Status Decide(const v1::DecideRequest& request, v1::DecideResponse* response) {
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }

  // Writes key[layer][group][token] (as float16) into every live page's frame of `sequence`, as a
  // worker does, for tokens [from, length).
  void WriteKeys(const v1::PoolInfo& pool, const std::string& sequence,
                 const std::vector<std::vector<std::vector<float>>>& keys, int64_t from) {
    absl::StatusOr<std::unique_ptr<HostArenaMapping>> arena =
        HostArenaMapping::OpenByName(pool.arena_name());
    ASSERT_TRUE(arena.ok()) << arena.status();
    char* base = static_cast<char*>((*arena)->data());
    const v1::SequenceInfo info = Sequence(pool.model_id(), sequence);
    for (const v1::BlockTable& table : info.block_tables()) {
      const std::vector<float>& rows =
          keys[static_cast<size_t>(table.layer())][static_cast<size_t>(table.group())];
      for (int page = 0; page < table.frames_size(); ++page) {
        if (table.frames(page) < 0) continue;
        char* frame = base + static_cast<int64_t>(table.frames(page)) * pool.frame_bytes();
        if (pool.frame_layout() == v1::FRAME_LAYOUT_LAYER)
          frame += table.group() * kGroupFrameBytes;
        for (int slot = 0; slot < kPageSize; ++slot) {
          const int64_t token = int64_t{page} * kPageSize + slot;
          if (token < from || token >= info.length_tokens()) continue;
          for (int d = 0; d < kHeadDim; ++d) {
            const uint16_t half = FloatToFloat16(rows[static_cast<size_t>(token * kHeadDim + d)]);
            std::memcpy(frame + (slot * kHeadDim + d) * 2, &half, 2);
          }
        }
      }
    }
  }

  // Fills one layer's rows [heads][tokens] of one group from the keys its frames hold
  // (`stored`, [tokens][head_dim], 0 where `present` is 0).
  using RowScorer = std::function<void(int group, const std::vector<float>& stored,
                                       const std::vector<uint8_t>& present, int64_t tokens,
                                       std::vector<float>& rows)>;

  // The keys statistic's rows as the test computes them, over the keys of the pages `sequence`
  // still holds, one [heads][tokens] per layer.
  std::vector<std::vector<float>> ExpectedRows(
      const std::string& model, const std::string& sequence,
      const std::vector<std::vector<std::vector<float>>>& keys, const RowScorer& score) {
    const v1::SequenceInfo info = Sequence(model, sequence);
    const int64_t tokens = info.length_tokens();
    std::vector<std::vector<float>> rows(kLayers,
                                         std::vector<float>(static_cast<size_t>(kHeads * tokens)));
    for (const v1::BlockTable& table : info.block_tables()) {
      std::vector<float> stored(static_cast<size_t>(tokens * kHeadDim), 0.0F);
      std::vector<uint8_t> present(static_cast<size_t>(tokens), 0);
      const std::vector<float>& key =
          keys[static_cast<size_t>(table.layer())][static_cast<size_t>(table.group())];
      for (int64_t token = 0; token < tokens; ++token) {
        if (table.frames(static_cast<int>(token / kPageSize)) < 0) continue;
        present[static_cast<size_t>(token)] = 1;
        for (int d = 0; d < kHeadDim; ++d) {
          const size_t at = static_cast<size_t>(token * kHeadDim + d);
          stored[at] = Float16ToFloat(FloatToFloat16(key[at]));  // as the frame holds it
        }
      }
      score(table.group(), stored, present, tokens, rows[static_cast<size_t>(table.layer())]);
    }
    return rows;
  }

  // The group's keydiff or norm scores on each of its heads.
  static RowScorer GroupScores(KeyScore score) {
    return [score](int group, const std::vector<float>& stored, const std::vector<uint8_t>& present,
                   int64_t tokens, std::vector<float>& rows) {
      std::vector<float> scores(static_cast<size_t>(tokens));
      ScoreKeys(score, stored, kHeadDim, present, scores);
      const int per_group = kHeads / kGroups;
      for (int head = group * per_group; head < (group + 1) * per_group; ++head) {
        std::copy(scores.begin(), scores.end(), rows.begin() + head * tokens);
      }
    };
  }

  // Each head's expected attention from `mean` [heads][head_dim] and `spread`: empty (the mean
  // alone), a covariance per head, or with `rank` > 0 a factor of that many rows per head.
  static RowScorer ExpectedAttentionScores(std::vector<float> mean, std::vector<float> spread,
                                           int rank = 0) {
    return [mean = std::move(mean), spread = std::move(spread), rank](
               int group, const std::vector<float>& stored, const std::vector<uint8_t>& present,
               int64_t tokens, std::vector<float>& rows) {
      const size_t matrix = static_cast<size_t>((rank > 0 ? rank : kHeadDim) * kHeadDim);
      const std::span<const float> all(spread);
      const int per_group = kHeads / kGroups;
      for (int head = group * per_group; head < (group + 1) * per_group; ++head) {
        ScoreExpectedAttention(
            stored, kHeadDim, present,
            std::span<const float>(mean).subspan(static_cast<size_t>(head * kHeadDim), kHeadDim),
            all.empty() ? all : all.subspan(static_cast<size_t>(head) * matrix, matrix),
            std::span<float>(rows).subspan(static_cast<size_t>(head * tokens),
                                           static_cast<size_t>(tokens)),
            rank);
      }
    };
  }

  static v1::DecideRequest Request(const std::string& model, int64_t pages) {
    v1::DecideRequest request;
    request.set_model_id(model);
    request.set_sequence_id("s");
    request.mutable_budget()->set_pages_per_group(pages);
    request.mutable_policy()->set_name("mean");
    request.mutable_policy()->set_scope(v1::SELECTION_SCOPE_GROUP);
    return request;
  }

  static v1::DecideRequest KeysRequest(const std::string& model, int64_t pages, int64_t tokens,
                                       v1::KeyScore score) {
    v1::DecideRequest request = Request(model, pages);
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = request.add_layers();
      in->set_layer(layer);
      v1::Statistic* stat = in->mutable_statistic();
      stat->set_dtype(v1::DTYPE_FLOAT16);
      stat->set_query_heads(kHeads);
      stat->set_tokens(tokens);
      stat->mutable_keys()->set_score(score);
    }
    return request;
  }

  // Decides `keys` (on its model) and, on model `sent`, the same `rows` ([layer][heads x
  // tokens]) sent as bytes with K = `pages`: the same pages kept, the same frames held.
  void ExpectKeysDecideAsRows(const v1::DecideRequest& keys, const std::string& sent, int64_t pages,
                              int64_t tokens, const std::vector<std::vector<float>>& rows) {
    v1::DecideRequest bytes = Request(sent, pages);
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::LayerStatistic* in = bytes.add_layers();
      in->set_layer(layer);
      *in->mutable_statistic() =
          BytesStatistic(rows[static_cast<size_t>(layer)], kHeads, tokens, v1::DTYPE_FLOAT32);
    }
    v1::DecideResponse from_keys;
    v1::DecideResponse from_bytes;
    const grpc::Status status = Decide(keys, &from_keys);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_TRUE(Decide(bytes, &from_bytes).ok());
    ExpectSameDecision(from_keys, from_bytes);
    EXPECT_EQ(Stats(keys.model_id()).used_frames(), Stats(sent).used_frames());
  }

  static void ExpectSameDecision(const v1::DecideResponse& keys, const v1::DecideResponse& sent) {
    ASSERT_EQ(keys.layers_size(), sent.layers_size());
    for (int layer = 0; layer < keys.layers_size(); ++layer) {
      ASSERT_EQ(keys.layers(layer).groups_size(), sent.layers(layer).groups_size());
      for (int g = 0; g < keys.layers(layer).groups_size(); ++g) {
        EXPECT_THAT(keys.layers(layer).groups(g).kept_pages(),
                    ElementsAreArray(sent.layers(layer).groups(g).kept_pages()))
            << "layer " << layer << " group " << g;
      }
    }
  }
};

std::vector<std::vector<std::vector<float>>> RandomKeys(int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<std::vector<std::vector<float>>> keys(kLayers,
                                                    std::vector<std::vector<float>>(kGroups));
  for (auto& layer : keys) {
    for (auto& group : layer) {
      group.resize(static_cast<size_t>(tokens * kHeadDim));
      // A shared direction plus noise, as real keys have: KeyDiff then has something to rank.
      for (size_t i = 0; i < group.size(); ++i)
        group[i] = normal(rng) + (i % kHeadDim == 0 ? 3 : 0);
    }
  }
  return keys;
}

TEST_F(KeyStatisticTest, TheDaemonScoresItsOwnFramesAsTheSameScoresSentWouldBe) {
  int index = 0;
  for (const v1::FrameLayout layout : {v1::FRAME_LAYOUT_GROUP, v1::FRAME_LAYOUT_LAYER}) {
    for (const auto& [wire_score, score] : {std::pair{v1::KEY_SCORE_KEYDIFF, KeyScore::kKeyDiff},
                                            std::pair{v1::KEY_SCORE_NORM, KeyScore::kNorm}}) {
      SCOPED_TRACE(absl::StrCat(v1::FrameLayout_Name(layout), " ", KeyScoreName(score)));
      const std::string keyed = absl::StrCat("keys", index);
      const std::string sent = absl::StrCat("sent", index);
      ++index;
      const v1::PoolInfo pool = RegisterLayout(keyed, layout);
      RegisterLayout(sent, layout);
      constexpr int64_t kPrompt = 100;  // 7 pages, the last one partly written
      const auto keys = RandomKeys(kPrompt + 1, 11 + index);
      Open(keyed, "s", kPrompt);
      Open(sent, "s", kPrompt);
      WriteKeys(pool, "s", keys, 0);
      // Prefill, then one decode step after eviction: the keys of evicted pages are gone.
      for (const int64_t tokens : {kPrompt, kPrompt + 1}) {
        if (tokens > kPrompt) {
          for (const std::string& model : {keyed, sent}) {
            grpc::ClientContext context;
            v1::AppendTokensRequest append;
            append.set_model_id(model);
            append.set_sequence_id("s");
            append.set_tokens(1);
            v1::AppendTokensResponse appended;
            ASSERT_TRUE(stub_->AppendTokens(&context, append, &appended).ok());
          }
          WriteKeys(pool, "s", keys, kPrompt);
        }
        const int64_t pages = tokens == kPrompt ? 4 : 3;
        ExpectKeysDecideAsRows(KeysRequest(keyed, pages, tokens, wire_score), sent, pages, tokens,
                               ExpectedRows(keyed, "s", keys, GroupScores(score)));
      }
      ExpectInvariants(keyed);
    }
  }
  const auto counted = FindSeries(*server_, "entrokv_stats_bytes_total", {{"source", "pool_keys"}});
  ASSERT_TRUE(counted.has_value());
  EXPECT_GT(counted->counter.value, 0);
}

// Expected attention: each head's row from the query statistics sent with the request, over the
// keys in the frames, in both layouts, at prefill and after eviction; the same decision as those
// rows sent as bytes. With and without the covariance.
TEST_F(KeyStatisticTest, ExpectedAttentionScoresEachHeadAsTheSameRowsSentWouldBe) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> mean(static_cast<size_t>(kHeads * kHeadDim));
  for (float& value : mean) value = normal(rng);
  // S = A A' / head_dim per head: symmetric, positive semi-definite.
  std::vector<float> covariance(static_cast<size_t>(kHeads * kHeadDim * kHeadDim), 0.0F);
  for (int head = 0; head < kHeads; ++head) {
    std::vector<float> a(static_cast<size_t>(kHeadDim * kHeadDim));
    for (float& value : a) value = normal(rng);
    for (int i = 0; i < kHeadDim; ++i) {
      for (int j = 0; j < kHeadDim; ++j) {
        float sum = 0.0F;
        for (int k = 0; k < kHeadDim; ++k) sum += a[i * kHeadDim + k] * a[j * kHeadDim + k];
        covariance[static_cast<size_t>((head * kHeadDim + i) * kHeadDim + j)] = sum / kHeadDim;
      }
    }
  }
  // A rank-3 factor F [3][head_dim] per head (S = F'F): the low-rank covariance.
  constexpr int kRank = 3;
  std::vector<float> factor(static_cast<size_t>(kHeads * kRank * kHeadDim));
  for (float& value : factor) value = normal(rng) / 2;
  int index = 0;
  for (const v1::FrameLayout layout : {v1::FRAME_LAYOUT_GROUP, v1::FRAME_LAYOUT_LAYER}) {
    for (const int spread : {0, 1, 2}) {  // the mean alone, the covariance, a factor
      const bool with_covariance = spread == 1;
      const int rank = spread == 2 ? kRank : 0;
      SCOPED_TRACE(absl::StrCat(v1::FrameLayout_Name(layout), " spread ", spread));
      const std::string keyed = absl::StrCat("expected", index);
      const std::string sent = absl::StrCat("rows", index);
      ++index;
      const v1::PoolInfo pool = RegisterLayout(keyed, layout);
      RegisterLayout(sent, layout);
      constexpr int64_t kPrompt = 100;
      const auto keys = RandomKeys(kPrompt, 31 + index);
      Open(keyed, "s", kPrompt);
      Open(sent, "s", kPrompt);
      WriteKeys(pool, "s", keys, 0);
      const std::vector<float> used = with_covariance ? covariance
                                      : rank > 0      ? factor
                                                      : std::vector<float>();
      const RowScorer per_head = ExpectedAttentionScores(mean, used, rank);
      for (const int64_t pages : {4, 2}) {  // prefill, then again after eviction
        v1::DecideRequest request =
            KeysRequest(keyed, pages, kPrompt, v1::KEY_SCORE_EXPECTED_ATTENTION);
        for (v1::LayerStatistic& layer : *request.mutable_layers()) {
          v1::KeyStatistic* statistic = layer.mutable_statistic()->mutable_keys();
          statistic->mutable_query_mean()->Assign(mean.begin(), mean.end());
          (rank > 0 ? statistic->mutable_query_covariance_factor()
                    : statistic->mutable_query_covariance())
              ->Assign(used.begin(), used.end());
        }
        ExpectKeysDecideAsRows(request, sent, pages, kPrompt,
                               ExpectedRows(keyed, "s", keys, per_head));
      }
      ExpectInvariants(keyed);
    }
  }
}

TEST_F(KeyStatisticTest, BadKeyStatisticsNameTheFieldAndApplyNothing) {
  RegisterLayout("m", v1::FRAME_LAYOUT_GROUP);
  Open("m", "s", 40);
  const v1::DecideRequest good = KeysRequest("m", 1, 40, v1::KEY_SCORE_KEYDIFF);
  std::vector<BadDecide> cases;
  v1::DecideRequest wide = good;
  wide.mutable_layers(0)->mutable_statistic()->set_dtype(v1::DTYPE_FLOAT32);  // 2-byte pool
  cases.push_back({wide, "layers[0].statistic: dtype"});
  v1::DecideRequest unset = good;
  unset.mutable_layers(1)->mutable_statistic()->mutable_keys()->clear_score();
  cases.push_back({unset, "layers[1].statistic.keys.score"});
  v1::DecideRequest chunk = good;
  chunk.mutable_layers(0)->set_accumulate(true);
  chunk.mutable_layers(0)->mutable_statistic()->set_kind(v1::STATISTIC_KIND_ACCUMULATED);
  cases.push_back({chunk, "layers[0].accumulate"});
  v1::DecideRequest heads = good;
  heads.mutable_layers(0)->mutable_statistic()->set_query_heads(kHeads / 2);
  cases.push_back({heads, "layers[0].statistic.query_heads"});
  v1::DecideRequest stray = good;  // query statistics with another score
  stray.mutable_layers(0)->mutable_statistic()->mutable_keys()->add_query_mean(1.0F);
  cases.push_back({stray, "layers[0].statistic.keys.query_mean"});
  v1::DecideRequest expected = KeysRequest("m", 1, 40, v1::KEY_SCORE_EXPECTED_ATTENTION);
  for (v1::LayerStatistic& layer : *expected.mutable_layers()) {
    for (int i = 0; i < kHeads * kHeadDim; ++i) {
      layer.mutable_statistic()->mutable_keys()->add_query_mean(0.5F);
    }
  }
  v1::DecideRequest short_mean = expected;
  short_mean.mutable_layers(1)
      ->mutable_statistic()
      ->mutable_keys()
      ->mutable_query_mean()
      ->RemoveLast();
  cases.push_back({short_mean, "layers[1].statistic.keys.query_mean: 31 values, expected 4 heads"});
  v1::DecideRequest bad_covariance = expected;
  bad_covariance.mutable_layers(0)->mutable_statistic()->mutable_keys()->add_query_covariance(1.0F);
  cases.push_back({bad_covariance, "layers[0].statistic.keys.query_covariance"});
  v1::DecideRequest both = expected;  // a covariance and a factor
  for (int i = 0; i < kHeads * kHeadDim * kHeadDim; ++i) {
    both.mutable_layers(0)->mutable_statistic()->mutable_keys()->add_query_covariance(0.0F);
  }
  for (int i = 0; i < kHeads * kHeadDim; ++i) {
    both.mutable_layers(0)->mutable_statistic()->mutable_keys()->add_query_covariance_factor(0.0F);
  }
  cases.push_back({both, "layers[0].statistic.keys.query_covariance_factor: not with"});
  v1::DecideRequest ragged = expected;  // not whole rows of head_dim per head
  for (int i = 0; i < kHeads * kHeadDim + 1; ++i) {
    ragged.mutable_layers(1)->mutable_statistic()->mutable_keys()->add_query_covariance_factor(
        1.0F);
  }
  cases.push_back({ragged, "layers[1].statistic.keys.query_covariance_factor: 33 values"});
  v1::DecideRequest tall = expected;  // rank head_dim + 1
  for (int i = 0; i < kHeads * (kHeadDim + 1) * kHeadDim; ++i) {
    tall.mutable_layers(1)->mutable_statistic()->mutable_keys()->add_query_covariance_factor(1.0F);
  }
  cases.push_back({tall, "rank in [1, 8]"});
  v1::DecideRequest keydiff_factor = good;
  keydiff_factor.mutable_layers(0)
      ->mutable_statistic()
      ->mutable_keys()
      ->add_query_covariance_factor(1.0F);
  cases.push_back({keydiff_factor, "layers[0].statistic.keys.query_covariance_factor: only for"});
  v1::DecideRequest infinite = expected;
  infinite.mutable_layers(2)->mutable_statistic()->mutable_keys()->set_query_mean(
      3, std::numeric_limits<float>::infinity());
  cases.push_back({infinite, "layers[2].statistic.keys.query_mean[3]: must be finite"});
  ExpectRefusedChangingNothing("m", cases);
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
}

// A keys mix: the rows sent and each head's expected attention (or its group's keydiff scores),
// each scaled to sum 1 and averaged, decide as the test's own average of the same two sent as
// bytes, in both layouts, at prefill and after eviction, for the default weight and another.
TEST_F(KeyStatisticTest, AKeysMixDecidesAsTheSameMixSentWould) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> mean(static_cast<size_t>(kHeads * kHeadDim));
  for (float& value : mean) value = normal(rng);
  int index = 0;
  for (const v1::FrameLayout layout : {v1::FRAME_LAYOUT_GROUP, v1::FRAME_LAYOUT_LAYER}) {
    // Weight 0 and rule unset: half and half, averaged. The cover rule takes no weight; its
    // question pool centred, then forward, then forward with the sink pages ranked.
    for (const auto& [weight, rule, forward, sinks] :
         {std::tuple{0.0, v1::KEYS_MIX_RULE_UNSPECIFIED, false, false},
          std::tuple{0.25, v1::KEYS_MIX_RULE_AVERAGE, false, false},
          std::tuple{0.25, v1::KEYS_MIX_RULE_MAX, false, false},
          std::tuple{0.0, v1::KEYS_MIX_RULE_COVER, false, false},
          std::tuple{0.0, v1::KEYS_MIX_RULE_COVER, true, false},
          std::tuple{0.0, v1::KEYS_MIX_RULE_COVER, true, true}}) {
      for (const bool expected_attention : {true, false}) {
        SCOPED_TRACE(absl::StrCat(v1::FrameLayout_Name(layout), " weight ", weight, " ",
                                  v1::KeysMixRule_Name(rule), forward ? " forward" : "",
                                  sinks ? " sinks ranked" : "",
                                  expected_attention ? " expected attention" : " keydiff"));
        const std::string keyed = absl::StrCat("mixed", index);
        const std::string sent = absl::StrCat("averaged", index);
        ++index;
        const v1::PoolInfo pool = RegisterLayout(keyed, layout);
        RegisterLayout(sent, layout);
        constexpr int64_t kPrompt = 100;
        const auto keys = RandomKeys(kPrompt, 51 + index);
        Open(keyed, "s", kPrompt);
        Open(sent, "s", kPrompt);
        WriteKeys(pool, "s", keys, 0);
        const RowScorer score = expected_attention ? ExpectedAttentionScores(mean, {})
                                                   : GroupScores(KeyScore::kKeyDiff);
        for (const int64_t pages : {4, 2}) {  // prefill, then again after eviction
          std::vector<std::vector<float>> rows = ExpectedRows(keyed, "s", keys, score);
          v1::DecideRequest request = Request(keyed, pages);
          for (int layer = 0; layer < kLayers; ++layer) {
            const std::vector<float> values =
                RandomStatistic(kHeads, kPrompt, 70 + static_cast<uint32_t>(layer));
            v1::LayerStatistic* in = request.add_layers();
            in->set_layer(layer);
            *in->mutable_statistic() = BytesStatistic(values, kHeads, kPrompt, v1::DTYPE_FLOAT32);
            v1::KeysMix* mix = in->mutable_statistic()->mutable_keys_mix();
            mix->set_keys_dtype(v1::DTYPE_FLOAT16);
            mix->set_keys_weight(weight);
            mix->set_rule(rule);
            mix->set_cover_question_forward(forward);
            mix->set_cover_rank_sinks(sinks);
            if (expected_attention) {
              mix->mutable_keys()->set_score(v1::KEY_SCORE_EXPECTED_ATTENTION);
              mix->mutable_keys()->mutable_query_mean()->Assign(mean.begin(), mean.end());
            } else {
              mix->mutable_keys()->set_score(v1::KEY_SCORE_KEYDIFF);
            }
            ENTROKV_ASSERT_OK_AND_ASSIGN(
                StatisticView view,
                StatisticView::Create(values.data(), DType::kFloat32, kHeads, kPrompt));
            if (rule == v1::KEYS_MIX_RULE_COVER) {
              // Its defaults (half the mass, kernels 7 and 3) under the daemon's protections:
              // the tail page is outside the span, the sink page too unless it is ranked.
              PolicyOptions options;
              options.protections.tail_page = true;
              ASSERT_TRUE(CoverThenFill(view,
                                        CoverMix{.question_forward = forward, .rank_sinks = sinks},
                                        kHeads / kGroups, kPageSize, CoverSpanOf(options, kPrompt),
                                        rows[static_cast<size_t>(layer)])
                              .ok());
              continue;
            }
            ASSERT_TRUE(MixRows(view, weight == 0.0 ? 0.5 : weight,
                                rule == v1::KEYS_MIX_RULE_MAX ? MixRule::kMax : MixRule::kAverage,
                                rows[static_cast<size_t>(layer)])
                            .ok());
          }
          ExpectKeysDecideAsRows(request, sent, pages, kPrompt, rows);
        }
        ExpectInvariants(keyed);
      }
    }
  }
}

TEST_F(KeyStatisticTest, BadKeysMixesNameTheFieldAndApplyNothing) {
  RegisterLayout("m", v1::FRAME_LAYOUT_GROUP);
  Open("m", "s", 40);
  v1::DecideRequest good = Request("m", 1);
  for (int layer = 0; layer < kLayers; ++layer) {
    v1::LayerStatistic* in = good.add_layers();
    in->set_layer(layer);
    *in->mutable_statistic() =
        BytesStatistic(RandomStatistic(kHeads, 40, 3), kHeads, 40, v1::DTYPE_FLOAT32);
    v1::KeysMix* mix = in->mutable_statistic()->mutable_keys_mix();
    mix->set_keys_dtype(v1::DTYPE_FLOAT16);
    mix->mutable_keys()->set_score(v1::KEY_SCORE_KEYDIFF);
  }
  std::vector<BadDecide> cases;
  for (const double weight : {1.0, -0.5, std::numeric_limits<double>::quiet_NaN()}) {
    v1::DecideRequest heavy = good;
    heavy.mutable_layers(1)->mutable_statistic()->mutable_keys_mix()->set_keys_weight(weight);
    cases.push_back({heavy, "layers[1].statistic.keys_mix.keys_weight: must be in (0, 1)"});
  }
  v1::DecideRequest unruled = good;
  unruled.mutable_layers(1)->mutable_statistic()->mutable_keys_mix()->set_rule(
      static_cast<v1::KeysMixRule>(7));
  cases.push_back({unruled, "layers[1].statistic.keys_mix.rule: must be KEYS_MIX_RULE_AVERAGE"});
  v1::DecideRequest weighed_cover = good;  // the cover rule orders pages: no weight
  weighed_cover.mutable_layers(1)->mutable_statistic()->mutable_keys_mix()->set_rule(
      v1::KEYS_MIX_RULE_COVER);
  weighed_cover.mutable_layers(1)->mutable_statistic()->mutable_keys_mix()->set_keys_weight(0.5);
  cases.push_back({weighed_cover, "layers[1].statistic.keys_mix.keys_weight: not with"});
  v1::DecideRequest stray_cover = good;  // a cover parameter with the average rule
  stray_cover.mutable_layers(0)->mutable_statistic()->mutable_keys_mix()->set_cover_mass(0.5);
  cases.push_back({stray_cover, "layers[0].statistic.keys_mix.cover_mass, cover_question_kernel"});
  v1::DecideRequest stray_forward = good;  // the forward pool is the cover rule's too
  stray_forward.mutable_layers(1)
      ->mutable_statistic()
      ->mutable_keys_mix()
      ->set_cover_question_forward(true);
  cases.push_back({stray_forward,
                   "layers[1].statistic.keys_mix.cover_mass, cover_question_kernel, "
                   "cover_keys_kernel, cover_question_forward, cover_rank_sinks: only with "
                   "KEYS_MIX_RULE_COVER"});
  v1::DecideRequest stray_sinks = good;  // and the sink pages' ranking
  stray_sinks.mutable_layers(0)->mutable_statistic()->mutable_keys_mix()->set_cover_rank_sinks(
      true);
  cases.push_back({stray_sinks, "layers[0].statistic.keys_mix.cover_mass, cover_question_kernel"});
  for (const auto& [mass, kernel, field] :
       {std::tuple{1.5, 0, "keys_mix.cover_mass"}, std::tuple{-0.5, 0, "keys_mix.cover_mass"},
        std::tuple{0.5, 4, "keys_mix.cover_question_kernel"}}) {
    v1::DecideRequest bad_cover = good;
    v1::KeysMix* mix = bad_cover.mutable_layers(2)->mutable_statistic()->mutable_keys_mix();
    mix->set_rule(v1::KEYS_MIX_RULE_COVER);
    mix->set_cover_mass(mass);
    mix->set_cover_question_kernel(kernel);
    cases.push_back({bad_cover, absl::StrCat("layers[2].statistic.", field)});
  }
  v1::DecideRequest pooled_cover = good;  // the policy would pool the mix's page order again
  pooled_cover.mutable_policy()->set_neighbourhood_kernel(3);
  for (v1::LayerStatistic& layer : *pooled_cover.mutable_layers()) {
    layer.mutable_statistic()->mutable_keys_mix()->set_rule(v1::KEYS_MIX_RULE_COVER);
  }
  cases.push_back({pooled_cover, "layers[0].statistic.keys_mix.rule: the cover rule orders"});
  v1::DecideRequest untyped = good;
  untyped.mutable_layers(0)->mutable_statistic()->mutable_keys_mix()->clear_keys_dtype();
  cases.push_back({untyped, "layers[0].statistic.keys_mix.keys_dtype"});
  v1::DecideRequest wide = good;  // a 2-byte pool's keys are not float32
  wide.mutable_layers(2)->mutable_statistic()->mutable_keys_mix()->set_keys_dtype(
      v1::DTYPE_FLOAT32);
  cases.push_back({wide, "layers[2].statistic: dtype"});
  v1::DecideRequest unscored = good;
  unscored.mutable_layers(0)
      ->mutable_statistic()
      ->mutable_keys_mix()
      ->mutable_keys()
      ->clear_score();
  cases.push_back({unscored, "layers[0].statistic.keys_mix.keys.score"});
  v1::DecideRequest keys_only = KeysRequest("m", 1, 40, v1::KEY_SCORE_KEYDIFF);
  *keys_only.mutable_layers(0)->mutable_statistic()->mutable_keys_mix() =
      good.layers(0).statistic().keys_mix();
  cases.push_back({keys_only, "layers[0].statistic.keys_mix: mixes the keys' scores with values"});
  v1::DecideRequest chunk = good;
  chunk.mutable_layers(0)->set_accumulate(true);
  chunk.mutable_layers(0)->mutable_statistic()->set_kind(v1::STATISTIC_KIND_ACCUMULATED);
  cases.push_back({chunk, "layers[0].statistic.keys_mix: not with accumulate"});
  v1::DecideRequest negative = good;  // a sent value is checked before it is mixed
  std::vector<float> values = RandomStatistic(kHeads, 40, 4);
  values[5] = -1.0F;
  *negative.mutable_layers(2)->mutable_statistic()->mutable_data() =
      BytesStatistic(values, kHeads, 40, v1::DTYPE_FLOAT32).data();
  cases.push_back({negative, "layers[2]: statistic: value at head 0, token 5"});
  ExpectRefusedChangingNothing("m", cases);
  EXPECT_EQ(Stats("m").pages_evicted_total(), 0);
}

}  // namespace
}  // namespace entrokv::service::testing
