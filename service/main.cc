// entrokvd: parses flags (and --config), validates before binding anything, serves until
// SIGTERM/SIGINT, then drains: readiness NOT_SERVING, new calls UNAVAILABLE, in-flight calls
// get --drain_timeout_ms to finish, exit 0.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/util/log.h"
#include "service/flags.h"
#include "service/options.h"
#include "service/protobuf_log.h"
#include "service/server.h"

int main(int argc, char** argv) {
  using entrokv::LogError;
  using entrokv::LogInfo;
  absl::SetProgramUsageMessage("entrokvd: the entrokv KV-cache manager daemon");
  entrokv::service::ConfigureFlagsUsage();
  const std::vector<std::string> given(argv, argv + argc);
  // Abseil reads a flagfile it cannot read (a directory) as an empty one: the daemon would
  // start on its defaults. Each --config must be a readable regular file.
  for (const std::string& file : entrokv::service::ConfigFiles(given)) {
    if (file.empty()) continue;  // --config= alone reads nothing, as before
    if (const absl::Status readable = entrokv::service::ReadOptionFile("config", file).status();
        !readable.ok()) {
      LogError(readable.message());
      return 2;
    }
  }
  // --config FILE becomes a leading --flagfile=FILE: Abseil reads it, the command line wins.
  std::vector<std::string> args = entrokv::service::ExpandConfigFlag(given);
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  arg_pointers.push_back(nullptr);
  absl::ParseCommandLine(static_cast<int>(args.size()), arg_pointers.data());

  const entrokv::service::ServerOptions options = entrokv::service::OptionsFromFlags();
  if (const absl::Status valid = entrokv::service::ValidateServerOptions(options); !valid.ok()) {
    LogError(valid.message());
    return 2;
  }
  entrokv::SetMinLogLevel(*entrokv::ParseLogLevel(options.log_level));
  entrokv::service::RouteProtobufLogs();

  // Block the shutdown signals in every thread (gRPC's included) and take them in main.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<entrokv::service::Server>> server =
      entrokv::service::Server::Start(options);
  if (!server.ok()) {
    LogError(server.status().message());
    // Configuration the operator must fix, a damaged or foreign --state_dir included: 2.
    const absl::StatusCode code = server.status().code();
    return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss ||
                   code == absl::StatusCode::kFailedPrecondition
               ? 2
               : 1;
  }
  std::printf("%s\n", (*server)->ListeningLine().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  LogInfo(absl::StrCat("signal ", signal_number, ": draining for up to ", options.drain_timeout_ms,
                       " ms"));
  (*server)->Shutdown(absl::Milliseconds(options.drain_timeout_ms));
  LogInfo("stopped");
  return 0;
}
