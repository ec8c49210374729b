// Runs the `entrokv` binary as a user would and captures what it prints.
#ifndef ENTROKV_TESTS_E2E_CLI_RUNNER_H_
#define ENTROKV_TESTS_E2E_CLI_RUNNER_H_

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace entrokv::testing {

struct CliRun {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;     // stdout and stderr together
};

// Runs `ENTROKV_CLI_PATH arguments` through the shell.
inline CliRun RunCli(const std::string& arguments) {
  const std::string command = std::string(ENTROKV_CLI_PATH) + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  CliRun run;
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t read;
  while ((read = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, read);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The integer after "key": in the JSON text the CLI printed, searching from `from`; -1 when
// absent.
inline long long JsonInt(const std::string& json, const std::string& key,  // NOLINT(runtime/int)
                         size_t from = 0) {
  const size_t at = json.find("\"" + key + "\":", from);
  if (at == std::string::npos) return -1;
  return std::stoll(json.substr(at + key.size() + 3));
}

}  // namespace entrokv::testing

#endif  // ENTROKV_TESTS_E2E_CLI_RUNNER_H_
