#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/daemon_line.h"
#include "tests/support/http_get.h"

namespace entrokv::testing {
namespace {

using ::testing::HasSubstr;

TEST(ListeningLineTest, ReadsBothAddresses) {
  const auto addresses = ParseListeningLine(
      "some log\nentrokvd listening on 127.0.0.1:41231 metrics on 127.0.0.1:39017\nmore\n");
  ASSERT_TRUE(addresses.has_value());
  EXPECT_EQ(addresses->grpc, "127.0.0.1:41231");
  EXPECT_EQ(addresses->grpc_port, 41231);
  EXPECT_EQ(addresses->metrics, "127.0.0.1:39017");
  EXPECT_EQ(addresses->metrics_port, 39017);
}

TEST(ListeningLineTest, MetricsOffLeavesThemEmpty) {
  const auto addresses = ParseListeningLine("entrokvd listening on [::1]:5005 metrics off\n");
  ASSERT_TRUE(addresses.has_value());
  EXPECT_EQ(addresses->grpc, "[::1]:5005");
  EXPECT_EQ(addresses->grpc_port, 5005);
  EXPECT_EQ(addresses->metrics, "");
  EXPECT_EQ(addresses->metrics_port, 0);
}

TEST(ListeningLineTest, NothingUntilTheLineIsComplete) {
  // A read that ends inside the line must not yield a cut port.
  EXPECT_FALSE(ParseListeningLine("entrokvd listening on 127.0.0.1:41231 metrics on 127.0.0.1:39")
                   .has_value());
  EXPECT_FALSE(ParseListeningLine("").has_value());
  EXPECT_FALSE(ParseListeningLine("entrokvd stopped\n").has_value());
  EXPECT_FALSE(ParseListeningLine("entrokvd listening on nowhere metrics off\n").has_value());
  EXPECT_FALSE(ParseListeningLine("xentrokvd listening on 127.0.0.1:1 metrics off\n").has_value());
}

// A one-shot HTTP server on a kernel-chosen loopback port that answers `response` to the first
// request and closes.
class OneShotServer {
 public:
  explicit OneShotServer(std::string response) : response_(std::move(response)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(fd_, 1), 0);
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      const int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      char buffer[4096];
      std::string seen;
      while (seen.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(client, buffer, sizeof(buffer));
        if (n <= 0) break;
        seen.append(buffer, static_cast<size_t>(n));
      }
      request_ = seen;
      (void)::write(client, response_.data(), response_.size());
      ::close(client);
    });
  }
  ~OneShotServer() {
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  // Valid once the GET returned.
  const std::string& request() const { return request_; }

 private:
  std::string response_;
  int fd_ = -1;
  int port_ = 0;
  std::string request_;
  std::thread thread_;
};

TEST(HttpGetTest, ReturnsTheBodyOfA200) {
  OneShotServer server("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nentrokv_up 1\n");
  ENTROKV_ASSERT_OK_AND_ASSIGN(const std::string body, HttpGet(server.port(), "/metrics"));
  EXPECT_EQ(body, "entrokv_up 1\n");
  EXPECT_THAT(server.request(), HasSubstr("GET /metrics HTTP/1.0\r\n"));
}

TEST(HttpGetTest, AnotherStatusNamesItsLine) {
  OneShotServer server("HTTP/1.1 404 Not Found\r\n\r\nno such page");
  EXPECT_THAT(HttpGet(server.port(), "/nope"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("404 Not Found")));
}

TEST(HttpGetTest, NothingListeningIsUnavailable) {
  int port = 0;
  {
    OneShotServer taken("HTTP/1.0 200 OK\r\n\r\n");
    port = taken.port();
    EXPECT_TRUE(HttpGet(port, "/").ok());
  }  // closed: nothing listens there any more
  EXPECT_THAT(HttpGet(port, "/"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connect")));
}

}  // namespace
}  // namespace entrokv::testing
