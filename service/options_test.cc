#include "service/options.h"

#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ValidateServerOptionsTest, DefaultsAreValid) {
  EXPECT_THAT(ValidateServerOptions(ServerOptions{}), IsOk());
}

TEST(ValidateServerOptionsTest, NamesTheBadOption) {
  struct Case {
    void (*mutate)(ServerOptions&);
    const char* option;
  };
  const Case cases[] = {
      {[](ServerOptions& o) { o.listen = "nohost"; }, "--listen"},
      {[](ServerOptions& o) { o.listen = "127.0.0.1:70000"; }, "--listen"},
      {[](ServerOptions& o) { o.metrics_listen = "127.0.0.1:x"; }, "--metrics_listen"},
      {[](ServerOptions& o) { o.pool_capacity_bytes = 0; }, "--pool_capacity_bytes"},
      {[](ServerOptions& o) { o.policy = "nope"; }, "--policy"},
      {[](ServerOptions& o) { o.tau = 0; }, "--tau"},
      {[](ServerOptions& o) { o.alpha = -1; }, "--alpha"},
      {[](ServerOptions& o) { o.sink_tokens = -1; }, "--sink_tokens"},
      {[](ServerOptions& o) { o.max_message_bytes = 10; }, "--max_message_bytes"},
      {[](ServerOptions& o) { o.max_inflight_decisions = 0; }, "--max_inflight_decisions"},
      {[](ServerOptions& o) { o.keepalive_ms = 5; }, "--keepalive_ms"},
      {[](ServerOptions& o) { o.max_connection_age_ms = -1; }, "--max_connection_age_ms"},
      {[](ServerOptions& o) { o.tls_cert = "/nonexistent.pem"; }, "--tls_"},
      {[](ServerOptions& o) { o.tls_ca = "ca.pem"; }, "--tls_ca"},
      {[](ServerOptions& o) { o.token_file = "/nonexistent/token"; }, "--token_file"},
      {[](ServerOptions& o) { o.state_dir = "/nonexistent/dir"; }, "--state_dir"},
      {[](ServerOptions& o) { o.log_level = "loud"; }, "--log_level"},
      {[](ServerOptions& o) { o.state_sync_ms = -1; }, "--state_sync_ms"},
      {[](ServerOptions& o) { o.target_occupancy = 0; }, "--target_occupancy"},
      {[](ServerOptions& o) { o.target_occupancy = 1.01; }, "--target_occupancy"},
      {[](ServerOptions& o) {
         o.tenant_share = {{"a", 0.7}, {"b", 0.7}};
       },
       "--tenant_share"},
      {[](ServerOptions& o) {
         o.tenant_share = {{"default", 0.1}};
       },
       "--tenant_share"},
      {[](ServerOptions& o) { o.admission_hold_ms = -1; }, "--admission_hold_ms"},
      {[](ServerOptions& o) { o.max_swap_bytes = -1; }, "--max_swap_bytes"},
      {[](ServerOptions& o) { o.host_devices = 0; }, "--host_devices"},
      {[](ServerOptions& o) { o.host_devices = 65; }, "--host_devices"},
      {[](ServerOptions& o) { o.rank_wait_ms = 0; }, "--rank_wait_ms"},
  };
  for (const Case& c : cases) {
    ServerOptions options;
    c.mutate(options);
    EXPECT_THAT(ValidateServerOptions(options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.option)))
        << c.option;
  }
}

TEST(ValidateServerOptionsTest, PortZeroIsAllowed) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  EXPECT_THAT(ValidateServerOptions(options), IsOk());
}

// Every option a request falls back on reaches the wire library's defaults.
TEST(WireDefaultsTest, CarriesEveryDefaultARequestFallsBackOn) {
  ServerOptions options;
  options.policy = "snapkv";
  options.tau = 0.75;
  options.alpha = 3.0;
  options.sink_tokens = 9;
  options.protect_tail_page = false;
  options.frame_layout = FrameLayout::kLayer;
  options.backend = Backend::kCuda;
  options.pool_capacity_bytes = 12345;
  options.max_sequences_per_model = 17;
  options.max_sequence_bookkeeping_bytes = 1001;
  options.max_model_bookkeeping_bytes = 2002;
  options.selection_scope = ScopeSetting::kGroup;
  wire::Defaults defaults = WireDefaults(options);
  EXPECT_EQ(defaults.policy, "snapkv");
  EXPECT_DOUBLE_EQ(defaults.policy_options.tau, 0.75);
  EXPECT_DOUBLE_EQ(defaults.policy_options.alpha, 3.0);
  EXPECT_EQ(defaults.policy_options.sink_tokens, 9);
  EXPECT_FALSE(defaults.policy_options.protections.tail_page);
  EXPECT_EQ(defaults.frame_layout, FrameLayout::kLayer);
  EXPECT_EQ(defaults.backend, Backend::kCuda);
  EXPECT_EQ(defaults.pool_capacity_bytes, 12345);
  EXPECT_EQ(defaults.limits.max_sequences_per_model, 17);
  EXPECT_EQ(defaults.limits.max_sequence_bookkeeping_bytes, 1001);
  EXPECT_EQ(defaults.limits.max_model_bookkeeping_bytes, 2002);
  EXPECT_EQ(defaults.selection_scope, SelectionScope::kGroup);
  options.selection_scope = ScopeSetting::kLayer;
  EXPECT_EQ(WireDefaults(options).selection_scope, SelectionScope::kLayer);
  options.selection_scope = ScopeSetting::kAuto;  // the pool's layout decides
  EXPECT_EQ(WireDefaults(options).selection_scope, std::nullopt);
}

TEST(LoadBearerTokenTest, TrimsAndRejectsEmpty) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/token_good";
  const std::string empty = dir + "/token_empty";
  FILE* f = std::fopen(good.c_str(), "w");
  std::fputs("  s3cret\n", f);
  std::fclose(f);
  f = std::fopen(empty.c_str(), "w");
  std::fputs(" \n", f);
  std::fclose(f);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::string token, LoadBearerToken(good));
  EXPECT_EQ(token, "s3cret");
  EXPECT_THAT(LoadBearerToken(empty),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--token_file")));
}

}  // namespace
}  // namespace entrokv::service
