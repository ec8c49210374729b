#include "service/flags.h"

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

TEST(ConfigFileTest, SetsFlagsTheCommandLineLeftAlone) {
  absl::FlagSaver saver;
  const std::string path = WriteConfig("good.conf",
                                       "# comment\n"
                                       "tau = 0.25\n"
                                       "policy = mean   # trailing comment\n"
                                       "frame_layout = layer\n"
                                       "alpha = 3\n");
  ASSERT_THAT(ApplyConfigFile(path, {"entrokvd", "--alpha=1.5"}), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ServerOptions options, OptionsFromFlags());
  EXPECT_DOUBLE_EQ(options.tau, 0.25);
  EXPECT_EQ(options.policy, "mean");
  EXPECT_EQ(options.frame_layout, FrameLayout::kLayer);
  // --alpha was on the command line: the file does not override it (its value stays the
  // flag's current one, the default here).
  EXPECT_DOUBLE_EQ(options.alpha, 2.0);
}

TEST(ConfigFileTest, RejectsUnknownNamesAndBadValues) {
  absl::FlagSaver saver;
  EXPECT_THAT(ApplyConfigFile(WriteConfig("unknown.conf", "colour = red\n"), {"entrokvd"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("colour")));
  EXPECT_THAT(ApplyConfigFile(WriteConfig("bad.conf", "\ntau = fast\n"), {"entrokvd"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(":2:")));
  EXPECT_THAT(ApplyConfigFile(WriteConfig("noeq.conf", "tau\n"), {"entrokvd"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--config")));
  EXPECT_THAT(ApplyConfigFile("/nonexistent.conf", {"entrokvd"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--config")));
}

TEST(OptionsFromFlagsTest, NamesBadEnumFlags) {
  absl::FlagSaver saver;
  absl::FindCommandLineFlag("backend")->ParseFrom("tpu", nullptr);
  EXPECT_THAT(OptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--backend")));
}

TEST(OptionsFromFlagsTest, SelectionScopeIsAutoUnlessNamed) {
  absl::FlagSaver saver;
  ENTROKV_ASSERT_OK_AND_ASSIGN(ServerOptions options, OptionsFromFlags());
  EXPECT_FALSE(options.selection_scope.has_value());
  absl::FindCommandLineFlag("selection_scope")->ParseFrom("group", nullptr);
  ENTROKV_ASSERT_OK_AND_ASSIGN(options, OptionsFromFlags());
  EXPECT_EQ(options.selection_scope, SelectionScope::kGroup);
  absl::FindCommandLineFlag("selection_scope")->ParseFrom("head", nullptr);
  EXPECT_THAT(OptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--selection_scope")));
}

}  // namespace
}  // namespace entrokv::service
