// entrokvd's command-line flags and optional config file, turned into ServerOptions.
#ifndef ENTROKV_SERVICE_FLAGS_H_
#define ENTROKV_SERVICE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/options.h"

namespace entrokv::service {

// Applies a config file to the flags not given on the command line (`argv` as the process got
// it; the command line wins). Format: one `name = value` per line, names as the flags are
// spelled without dashes, `#` starts a comment. INVALID_ARGUMENT naming --config and the line for
// an unknown name, a malformed line or a value the flag rejects.
[[nodiscard]] absl::Status ApplyConfigFile(const std::string& path,
                                           const std::vector<std::string>& argv);

// Reads every flag into options. INVALID_ARGUMENT naming --backend / --frame_layout /
// --selection_scope for an unknown value; the rest is checked by ValidateServerOptions.
[[nodiscard]] absl::StatusOr<ServerOptions> OptionsFromFlags();

// The value of --config ("" when not given).
[[nodiscard]] std::string ConfigFlag();

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_FLAGS_H_
