#include "service/flags.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
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

// Every option's default as documented (docs/service.md), written here by hand, not taken
// from the option table: a default changed in the table, or an option added without a default
// here, fails the test below.
const std::map<std::string, std::string>& DocumentedDefaults() {
  static const auto* const defaults = new std::map<std::string, std::string>{
      {"listen", "127.0.0.1:50051"},
      {"metrics_listen", "127.0.0.1:9464"},
      {"pool_capacity_bytes", "1073741824"},
      {"backend", "host"},
      {"host_devices", "1"},
      {"rank_wait_ms", "2000"},
      {"frame_layout", "group"},
      {"policy", "page_entrokv"},
      {"selection_scope", "auto"},
      {"scorer", "auto"},
      {"tau", "0.5"},
      {"alpha", "2"},
      {"sink_tokens", "4"},
      {"neighbourhood_kernel", "1"},
      {"neighbourhood_pooling", "max"},
      {"protect_tail_page", "true"},
      {"max_message_bytes", "67108864"},
      {"max_inflight_decisions", "64"},
      {"max_models", "256"},
      {"max_pool_frames", "16777216"},
      {"max_sequences_per_model", "65536"},
      {"max_sequence_bookkeeping_bytes", "268435456"},
      {"max_model_bookkeeping_bytes", "2147483648"},
      {"max_bookkeeping_bytes", "536870912"},
      {"worker_threads", "0"},
      {"keepalive_ms", "30000"},
      {"max_connection_age_ms", "0"},
      {"drain_timeout_ms", "10000"},
      {"reflection", "false"},
      {"tls_cert", ""},
      {"tls_key", ""},
      {"tls_ca", ""},
      {"allowed_shm_uids", ""},
      {"token_file", ""},
      {"state_dir", ""},
      {"state_sync_ms", "100"},
      {"state_accept_loss", "false"},
      {"log_level", "info"},
      {"target_occupancy", "0.9"},
      {"tenant_share", ""},
      {"admission_hold_ms", "5000"},
      {"max_swap_bytes", "1073741824"},
  };
  return *defaults;
}

// The same default three ways (the --flag's, the struct's, and OptionsFromFlags' with nothing
// on the command line), each compared with the documented one, in the flags' own spelling.
TEST(OptionsFromFlagsTest, EveryOptionIsAFlagWithItsDocumentedDefault) {
  absl::FlagSaver saver;
  const ServerOptions defaults;
  const ServerOptions from_flags = OptionsFromFlags();
  std::set<std::string> options;
#define ENTROKV_EXPECT_DEFAULT(type, name, default_value, help)                                \
  options.insert(#name);                                                                       \
  if (const auto documented = DocumentedDefaults().find(#name);                                \
      documented == DocumentedDefaults().end()) {                                              \
    ADD_FAILURE() << "--" #name " has no documented default in this test";                     \
  } else {                                                                                     \
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(#name);                      \
    ASSERT_NE(flag, nullptr) << #name;                                                         \
    EXPECT_EQ(flag->DefaultValue(), documented->second) << "--" #name;                         \
    EXPECT_EQ(absl::UnparseFlag(defaults.name), documented->second) << "ServerOptions." #name; \
    EXPECT_EQ(absl::UnparseFlag(from_flags.name), documented->second) << "from flags: " #name; \
    EXPECT_FALSE(flag->Help().empty()) << #name;                                               \
  }
  ENTROKV_SERVER_OPTIONS(ENTROKV_EXPECT_DEFAULT)
#undef ENTROKV_EXPECT_DEFAULT
  // And no documented option has gone from the table.
  for (const auto& [name, value] : DocumentedDefaults()) {
    EXPECT_TRUE(options.contains(name)) << "--" << name << " is no longer an option";
  }
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

TEST(OptionsFromFlagsTest, TenantSharesParseAsNameEqualsShare) {
  absl::FlagSaver saver;
  std::string error;
  ASSERT_TRUE(absl::FindCommandLineFlag("tenant_share")->ParseFrom("gold=0.5, silver=0.25", &error))
      << error;
  const ServerOptions options = OptionsFromFlags();
  ASSERT_EQ(options.tenant_share.size(), 2u);
  EXPECT_EQ(options.tenant_share[0].name, "gold");
  EXPECT_DOUBLE_EQ(options.tenant_share[0].share, 0.5);
  EXPECT_EQ(options.tenant_share[1].name, "silver");
  EXPECT_EQ(AbslUnparseFlag(options.tenant_share), "gold=0.5,silver=0.25");
  EXPECT_FALSE(absl::FindCommandLineFlag("tenant_share")->ParseFrom("gold", &error));
  EXPECT_THAT(error, HasSubstr("'gold' is not name=share"));
  EXPECT_FALSE(absl::FindCommandLineFlag("tenant_share")->ParseFrom("gold=lots", &error));
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
TEST(OptionsFromFlagsTest, ScorerIsAutoUnlessNamed) {
  absl::FlagSaver saver;
  EXPECT_EQ(OptionsFromFlags().scorer, ScorerSetting::kAuto);
  for (const auto& [text, setting] :
       {std::pair{"cpu", ScorerSetting::kCpu}, std::pair{"cuda", ScorerSetting::kCuda},
        std::pair{"auto", ScorerSetting::kAuto}}) {
    ASSERT_TRUE(absl::FindCommandLineFlag("scorer")->ParseFrom(text, nullptr)) << text;
    EXPECT_EQ(OptionsFromFlags().scorer, setting) << text;
    EXPECT_EQ(AbslUnparseFlag(setting), text);
  }
  std::string error;
  EXPECT_FALSE(absl::FindCommandLineFlag("scorer")->ParseFrom("tpu", &error));
  EXPECT_THAT(error, HasSubstr("tpu"));
}

}  // namespace entrokv::service
