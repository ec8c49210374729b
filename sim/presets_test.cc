#include "sim/presets.h"

#include "absl/status/status.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::sim {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(PresetsTest, KnowsTheIssueGeometries) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ModelPreset qwen, FindPreset("qwen2.5-1.5b"));
  EXPECT_EQ(qwen.layers, 28);
  EXPECT_EQ(qwen.query_heads, 12);
  EXPECT_EQ(qwen.kv_groups, 2);
  EXPECT_EQ(qwen.head_dim, 128);
  EXPECT_EQ(qwen.group_size(), 6);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ModelPreset llama, FindPreset("llama3.1-8b"));
  EXPECT_EQ(llama.layers, 32);
  EXPECT_EQ(llama.group_size(), 4);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ModelPreset big, FindPreset("llama3-70b"));
  EXPECT_EQ(big.layers, 80);
  EXPECT_EQ(big.query_heads, 64);
  EXPECT_EQ(big.kv_groups, 8);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ModelPreset mha, FindPreset("mha-7b"));
  EXPECT_EQ(mha.group_size(), 1);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ModelPreset mqa, FindPreset("mqa-7b"));
  EXPECT_EQ(mqa.kv_groups, 1);
}

TEST(PresetsTest, EveryListedPresetIsFoundAndValid) {
  for (const std::string& name : PresetNames()) {
    ENTROKV_ASSERT_OK_AND_ASSIGN(const ModelPreset preset, FindPreset(name));
    EXPECT_EQ(preset.name, name);
    EXPECT_THAT(ValidatePreset(preset), IsOk());
  }
}

TEST(PresetsTest, UnknownNameIsNotFoundAndListsTheNames) {
  EXPECT_THAT(FindPreset("gpt-9"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("qwen2.5-1.5b")));
}

TEST(PresetsTest, ValidateNamesTheBadField) {
  ModelPreset preset{"x", 2, 6, 4, 64};
  EXPECT_THAT(ValidatePreset(preset),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_groups")));
  preset = {"x", 0, 4, 2, 64};
  EXPECT_THAT(ValidatePreset(preset),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layers")));
}

}  // namespace
}  // namespace entrokv::sim
