// A small option parser shared by every subcommand: `--name value`, `--name=value`, boolean
// `--flag` / `--no-flag`, and `--help`. Declared options only; anything else is a usage error.
#ifndef ENTROKV_CLIENT_CLI_ARGS_H_
#define ENTROKV_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/scoring/policy.h"

namespace entrokv::cli {

// Not thread-safe; one per command invocation.
class ArgParser {
 public:
  ArgParser(std::string command, std::string synopsis)
      : command_(std::move(command)), synopsis_(std::move(synopsis)) {}

  // Declares a valued option; `default_value` empty means "not set" unless given.
  void Option(const std::string& name, const std::string& default_value, const std::string& help);
  // Declares a boolean; `--name` sets it, `--no-name` clears it.
  void Flag(const std::string& name, bool default_value, const std::string& help);

  // INVALID_ARGUMENT naming the option for unknown options or a missing value. Returns
  // false (OK) when --help was given and the help text was printed to stdout.
  [[nodiscard]] absl::StatusOr<bool> Parse(const std::vector<std::string>& args);

  [[nodiscard]] bool Has(const std::string& name) const;    // given or defaulted
  [[nodiscard]] bool Given(const std::string& name) const;  // given on the command line
  [[nodiscard]] std::string Get(const std::string& name) const;
  [[nodiscard]] bool GetFlag(const std::string& name) const;
  // INVALID_ARGUMENT "--name: 'x' is not an integer" and the like.
  [[nodiscard]] absl::StatusOr<int64_t> GetInt(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<double> GetDouble(const std::string& name) const;

  [[nodiscard]] std::string Help() const;

 private:
  struct Spec {
    bool is_flag = false;
    std::string default_value;
    std::string help;
  };
  std::string command_;
  std::string synopsis_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
};

// Prints "entrokv <command>: <message>" to stderr and returns kExitUsage.
int UsageError(const std::string& command, const absl::Status& status);

// --neighbourhood-kernel and --neighbourhood (declared by the command) into `options`,
// errors naming the option.
[[nodiscard]] absl::Status ParseNeighbourhood(const ArgParser& parser, PolicyOptions* options);

}  // namespace entrokv::cli

#endif  // ENTROKV_CLIENT_CLI_ARGS_H_
