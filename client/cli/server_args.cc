#include "client/cli/server_args.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"

namespace entrokv::cli {

void AddServerOptions(ArgParser* args) {
  args->Option("server", "127.0.0.1:50051", "entrokvd address host:port");
  args->Option("timeout-ms", "10000", "deadline of each call");
  args->Option("token-file", "", "file holding the bearer token, when the daemon wants one");
}

absl::StatusOr<ClientOptions> ServerOptions(const ArgParser& args) {
  ClientOptions options;
  options.target = args.Get("server");
  auto timeout = args.GetInt("timeout-ms");
  if (!timeout.ok()) return timeout.status();
  if (*timeout <= 0) return absl::InvalidArgumentError("--timeout-ms: must be positive");
  options.timeout = std::chrono::milliseconds(*timeout);
  if (args.Given("token-file")) {
    std::ifstream file(args.Get("token-file"));
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file: cannot read ", args.Get("token-file")));
    }
    std::stringstream token;
    token << file.rdbuf();
    options.bearer_token = std::string(absl::StripAsciiWhitespace(token.str()));
  }
  return options;
}

int ServerError(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "entrokv %s: %s: %s\n", command.c_str(),
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return kExitServerError;
}

}  // namespace entrokv::cli
