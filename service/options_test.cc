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
