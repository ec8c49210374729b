// The start-up line as the daemon writes it (Server::ListeningLine, printed by service/main.cc)
// is what tests/support's parser reads, with metrics on and off.
#include <memory>
#include <optional>

#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/service/test_support.h"
#include "tests/support/daemon_line.h"

namespace entrokv::service {
namespace {

TEST(ListeningLineTest, TheParserReadsWhatTheServerWrites) {
  for (const bool metrics : {false, true}) {
    SCOPED_TRACE(metrics ? "metrics on" : "metrics off");
    ServerOptions options = testing::LoopbackOptions();
    if (metrics) options.metrics_listen = "127.0.0.1:0";
    ENTROKV_ASSERT_OK_AND_ASSIGN(const std::unique_ptr<Server> server, Server::Start(options));
    const std::string line = server->ListeningLine() + "\n";  // as main.cc prints it
    const std::optional<::entrokv::testing::ListeningAddresses> addresses =
        ::entrokv::testing::ParseListeningLine(line);
    ASSERT_TRUE(addresses.has_value()) << line;
    EXPECT_EQ(addresses->grpc, server->address());
    EXPECT_EQ(addresses->grpc_port, server->port());
    EXPECT_EQ(addresses->metrics_port, metrics ? server->metrics_port() : 0);
    EXPECT_EQ(addresses->metrics.empty(), !metrics);
  }
}

}  // namespace
}  // namespace entrokv::service
