// Options every command that talks to entrokvd shares: --server, --timeout-ms, --token-file.
#ifndef ENTROKV_CLIENT_CLI_SERVER_ARGS_H_
#define ENTROKV_CLIENT_CLI_SERVER_ARGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/args.h"
#include "client/cpp/client.h"

namespace entrokv::cli {

void AddServerOptions(ArgParser* args);
[[nodiscard]] absl::StatusOr<ClientOptions> ServerOptions(const ArgParser& args);

// Prints "entrokv <command>: <CODE>: <message>" to stderr and returns kExitServerError.
int ServerError(const std::string& command, const absl::Status& status);

}  // namespace entrokv::cli

#endif  // ENTROKV_CLIENT_CLI_SERVER_ARGS_H_
