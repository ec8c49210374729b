#include "service/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/option_table.h"

namespace entrokv::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ExpandConfigFlagTest, PutsTheFileFirstSoTheCommandLineWins) {
  EXPECT_THAT(ExpandConfigFlag({"entrokvd", "--tau=1", "--config=/etc/entrokvd.flags"}),
              ElementsAre("entrokvd", "--flagfile=/etc/entrokvd.flags", "--tau=1",
                          "--config=/etc/entrokvd.flags"));
  EXPECT_THAT(ExpandConfigFlag({"entrokvd", "-config", "a.flags", "--alpha=3"}),
              ElementsAre("entrokvd", "--flagfile=a.flags", "-config", "a.flags", "--alpha=3"));
  EXPECT_THAT(ExpandConfigFlag({"entrokvd", "--tau=1"}), ElementsAre("entrokvd", "--tau=1"));
  // After "--" nothing is a flag.
  EXPECT_THAT(ExpandConfigFlag({"entrokvd", "--", "--config=x"}),
              ElementsAre("entrokvd", "--", "--config=x"));
}

TEST(OptionsFromFlagsTest, EveryOptionIsAFlagWithTheStructsDefault) {
  absl::FlagSaver saver;
  const ServerOptions defaults;
  const ServerOptions from_flags = OptionsFromFlags();
#define ENTROKV_EXPECT_DEFAULT(type, name, default_value, help)  \
  EXPECT_EQ(from_flags.name, defaults.name) << #name;            \
  EXPECT_NE(absl::FindCommandLineFlag(#name), nullptr) << #name; \
  EXPECT_EQ(absl::FindCommandLineFlag(#name)->Help(), std::string(help)) << #name;
  ENTROKV_SERVER_OPTIONS(ENTROKV_EXPECT_DEFAULT)
#undef ENTROKV_EXPECT_DEFAULT
}

TEST(OptionsFromFlagsTest, CopiesEveryFlag) {
  absl::FlagSaver saver;
  std::string error;
  ASSERT_TRUE(absl::FindCommandLineFlag("tau")->ParseFrom("0.25", &error)) << error;
  ASSERT_TRUE(absl::FindCommandLineFlag("frame_layout")->ParseFrom("layer", &error)) << error;
  ASSERT_TRUE(absl::FindCommandLineFlag("backend")->ParseFrom("cuda", &error)) << error;
  ASSERT_TRUE(absl::FindCommandLineFlag("log_level")->ParseFrom("error", &error)) << error;
  const ServerOptions options = OptionsFromFlags();
  EXPECT_DOUBLE_EQ(options.tau, 0.25);
  EXPECT_EQ(options.frame_layout, FrameLayout::kLayer);
  EXPECT_EQ(options.backend, Backend::kCuda);
  EXPECT_EQ(options.log_level, "error");
}

TEST(OptionsFromFlagsTest, EnumFlagsRejectUnknownNames) {
  absl::FlagSaver saver;
  std::string error;
  EXPECT_FALSE(absl::FindCommandLineFlag("backend")->ParseFrom("tpu", &error));
  EXPECT_THAT(error, HasSubstr("tpu"));
  EXPECT_FALSE(absl::FindCommandLineFlag("frame_layout")->ParseFrom("diagonal", &error));
  EXPECT_THAT(error, HasSubstr("diagonal"));
  EXPECT_EQ(AbslUnparseFlag(Backend::kHost), "host");
  EXPECT_EQ(AbslUnparseFlag(FrameLayout::kLayer), "layer");
}

TEST(OptionsFromFlagsTest, SelectionScopeIsAutoUnlessNamed) {
  absl::FlagSaver saver;
  EXPECT_EQ(OptionsFromFlags().selection_scope, ScopeSetting::kAuto);
  ASSERT_TRUE(absl::FindCommandLineFlag("selection_scope")->ParseFrom("group", nullptr));
  EXPECT_EQ(OptionsFromFlags().selection_scope, ScopeSetting::kGroup);
  ASSERT_TRUE(absl::FindCommandLineFlag("selection_scope")->ParseFrom("layer", nullptr));
  EXPECT_EQ(OptionsFromFlags().selection_scope, ScopeSetting::kLayer);
  ASSERT_TRUE(absl::FindCommandLineFlag("selection_scope")->ParseFrom("auto", nullptr));
  EXPECT_EQ(OptionsFromFlags().selection_scope, ScopeSetting::kAuto);
  std::string error;
  EXPECT_FALSE(absl::FindCommandLineFlag("selection_scope")->ParseFrom("head", &error));
  EXPECT_THAT(error, HasSubstr("head"));
  EXPECT_EQ(AbslUnparseFlag(ScopeSetting::kLayer), "layer");
}

}  // namespace
}  // namespace entrokv::service
