// Transport security and connection lifetime (docs/reliability.md, "Connections" and "Transport
// security"): TLS refuses plaintext, mutual TLS refuses clients without a certificate the CA
// signed, and a short max connection age recycles connections without failing calls. Certificates
// are made here with openssl.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/service/test_support.h"

namespace entrokv::service::testing {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A CA, a server certificate for 127.0.0.1, a client certificate the CA signed and a rogue
// self-signed one, in a temp directory.
class Certificates {
 public:
  Certificates() {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("entrokv_tls_", ::getpid());
    std::filesystem::create_directories(dir_);
    const std::string d = dir_.string();
    const std::string script = absl::StrCat(
        "set -e; cd ", d, "\n",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 "
        "-subj /CN=entrokv-test-ca 2>/dev/null\n",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext\n",
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
        "-subj /CN=localhost 2>/dev/null\n",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out server.pem -days 1 -extfile server.ext 2>/dev/null\n",
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
        "-subj /CN=entrokv-worker 2>/dev/null\n",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out client.pem -days 1 2>/dev/null\n",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout rogue.key -out rogue.pem -days 1 "
        "-subj /CN=rogue-worker 2>/dev/null\n");
    std::ofstream(dir_ / "make.sh") << script;
    ok_ = std::system(absl::StrCat("bash ", (dir_ / "make.sh").string()).c_str()) == 0;
  }
  ~Certificates() { std::filesystem::remove_all(dir_); }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }
  [[nodiscard]] std::string pem(const std::string& name) const { return ReadAll(dir_ / name); }

 private:
  std::filesystem::path dir_;
  bool ok_ = false;
};

grpc::Status ListModels(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::CacheManager::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListModelsResponse response;
  return stub->ListModels(&context, v1::ListModelsRequest(), &response);
}

std::shared_ptr<grpc::Channel> SecureChannel(const std::string& address,
                                             grpc::SslCredentialsOptions ssl) {
  grpc::ChannelArguments arguments;
  arguments.SetSslTargetNameOverride("localhost");
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), arguments);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl missing";
    ASSERT_TRUE(certificates_.ok()) << "openssl could not make the test certificates";
  }
  std::unique_ptr<Server> Start(bool mutual) {
    ServerOptions options = LoopbackOptions();
    options.tls_cert = certificates_.path("server.pem");
    options.tls_key = certificates_.path("server.key");
    if (mutual) options.tls_ca = certificates_.path("ca.pem");
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }
  Certificates certificates_;
};

TEST_F(TlsTest, TlsServesVerifiedClientsAndRefusesPlaintext) {
  std::unique_ptr<Server> server = Start(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = certificates_.pem("ca.pem");
  EXPECT_TRUE(ListModels(SecureChannel(server->address(), ssl)).ok());
  EXPECT_EQ(ListModels(MakeChannel(server->address())).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client that does not trust the server's CA refuses the connection.
  grpc::SslCredentialsOptions untrusting;
  untrusting.pem_root_certs = certificates_.pem("client.pem");  // not a CA of the server
  EXPECT_FALSE(ListModels(SecureChannel(server->address(), untrusting)).ok());
  server->Shutdown(absl::Seconds(1));
}

TEST_F(TlsTest, MutualTlsRejectsClientsWithoutACertificateTheCaSigned) {
  std::unique_ptr<Server> server = Start(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  grpc::SslCredentialsOptions anonymous;
  anonymous.pem_root_certs = certificates_.pem("ca.pem");
  EXPECT_FALSE(ListModels(SecureChannel(server->address(), anonymous)).ok());
  grpc::SslCredentialsOptions rogue = anonymous;  // a self-signed cert the CA never signed
  rogue.pem_private_key = certificates_.pem("rogue.key");
  rogue.pem_cert_chain = certificates_.pem("rogue.pem");
  EXPECT_FALSE(ListModels(SecureChannel(server->address(), rogue)).ok());
  grpc::SslCredentialsOptions worker = anonymous;
  worker.pem_private_key = certificates_.pem("client.key");
  worker.pem_cert_chain = certificates_.pem("client.pem");
  EXPECT_TRUE(ListModels(SecureChannel(server->address(), worker)).ok());
  server->Shutdown(absl::Seconds(1));
}

// Event-driven, no sleeps: a watcher counts the channel's connections ending (the channel
// leaving READY, as the server's GOAWAY at --max_connection_age_ms makes it) while calls run
// back to back, until a call has succeeded after the third recycle; every call must succeed.
TEST(ConnectionAgeTest, ShortMaxConnectionAgeRecyclesConnectionsWithoutFailingCalls) {
  ServerOptions options = LoopbackOptions();
  options.max_connection_age_ms = 1000;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<grpc::Channel> channel = MakeChannel((*server)->address());
  auto stub = v1::CacheManager::NewStub(channel);
  constexpr int kRecycles = 3;
  std::atomic<int> recycled{0};
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/false);
    while (!stop.load()) {
      // True on any change from `state`; false at the deadline (to look at `stop` again).
      if (!channel->WaitForStateChange(
              state, std::chrono::system_clock::now() + std::chrono::milliseconds(100))) {
        continue;
      }
      if (state == GRPC_CHANNEL_READY) recycled.fetch_add(1);
      state = channel->GetState(/*try_to_connect=*/false);
    }
  });
  // The connections (numbered by the recycles before them) on which a call ran from start to
  // end and succeeded.
  std::set<int> connections;
  int calls = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!connections.contains(kRecycles) && std::chrono::steady_clock::now() < give_up) {
    const int connection = recycled.load();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    context.set_wait_for_ready(true);  // a call made during the GOAWAY waits for the new one
    v1::ListModelsResponse response;
    const grpc::Status status = stub->ListModels(&context, v1::ListModelsRequest(), &response);
    if (!status.ok()) {  // not ASSERT: the watcher must be stopped first
      ADD_FAILURE() << "call " << calls << " on connection " << connection << ": "
                    << status.error_message();
      break;
    }
    ++calls;
    if (recycled.load() == connection) connections.insert(connection);
  }
  stop.store(true);
  watcher.join();
  // The first connection and one after each recycle, each with a call; none failed.
  EXPECT_EQ(connections, (std::set<int>{0, 1, 2, 3}))
      << recycled.load() << " connections recycled within 60 s, " << calls << " calls";
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace entrokv::service::testing
