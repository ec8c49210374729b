// The `entrokv` CLI's subcommands. Each lives in its own file and is listed once in main.cc.
#ifndef ENTROKV_CLIENT_CLI_COMMAND_H_
#define ENTROKV_CLIENT_CLI_COMMAND_H_

#include <string>
#include <vector>

namespace entrokv::cli {

// Exit codes every subcommand uses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitServerError = 1;  // the daemon answered with an error
inline constexpr int kExitUsage = 2;        // bad arguments or a bad input file

// `args` excludes the program and subcommand names. Output goes to stdout, errors to stderr
// as one line.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
};

int RunSelect(const std::vector<std::string>& args);
int RunEval(const std::vector<std::string>& args);
int RunBench(const std::vector<std::string>& args);
int RunPolicies(const std::vector<std::string>& args);
#ifdef ENTROKV_WITH_SERVER
int RunReplay(const std::vector<std::string>& args);
int RunStatus(const std::vector<std::string>& args);
int RunModels(const std::vector<std::string>& args);
int RunSequences(const std::vector<std::string>& args);
int RunUnregister(const std::vector<std::string>& args);
#endif

}  // namespace entrokv::cli

#endif  // ENTROKV_CLIENT_CLI_COMMAND_H_
