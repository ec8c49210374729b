// entrokvd's command line: one Abseil flag per row of option_table.h, read into ServerOptions.
#ifndef ENTROKV_SERVICE_FLAGS_H_
#define ENTROKV_SERVICE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "service/options.h"

namespace entrokv {

// Abseil flag parsing of the core's enums ("host" / "cuda", "group" / "layer"). In namespace
// entrokv so that argument-dependent lookup finds them.
bool AbslParseFlag(absl::string_view text, Backend* backend, std::string* error);
std::string AbslUnparseFlag(Backend backend);
bool AbslParseFlag(absl::string_view text, FrameLayout* layout, std::string* error);
std::string AbslUnparseFlag(FrameLayout layout);

}  // namespace entrokv

namespace entrokv::service {

// Every flag, copied into the options (ValidateServerOptions checks them).
[[nodiscard]] ServerOptions OptionsFromFlags();

// The files `--config=FILE` (or `--config FILE`) names in `argv`, in order; nothing after "--".
[[nodiscard]] std::vector<std::string> ConfigFiles(const std::vector<std::string>& argv);

// `argv` with `--config=FILE` (or `--config FILE`) turned into `--flagfile=FILE` placed right
// after the program name, so the file is read first and every flag on the command line wins,
// wherever it stands. The file is an Abseil flagfile: one `--name=value` per line, `#` lines
// are comments.
[[nodiscard]] std::vector<std::string> ExpandConfigFlag(const std::vector<std::string>& argv);

// Makes --help and --helpshort list the daemon's flags (Abseil shows by default only flags
// defined in the file holding main()). Call before absl::ParseCommandLine.
void ConfigureFlagsUsage();

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_FLAGS_H_
