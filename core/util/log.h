// The daemon's logger (Debian's Abseil has no absl/log), shared by every module that runs inside
// entrokvd (service/, store/): one line per call on stderr,
//   2026-11-30T12:00:00.123Z entrokvd INFO: message
// UTC timestamp with milliseconds, the level, the message. Lines below the minimum level are
// dropped; FATAL lines never are. Thread-safe: each line is one write, so lines from different
// threads never mix.
#ifndef ENTROKV_CORE_UTIL_LOG_H_
#define ENTROKV_CORE_UTIL_LOG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace entrokv {

enum class LogLevel : int { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// "info", "warning", "error"; INVALID_ARGUMENT naming --log_level otherwise (fatal lines cannot
// be turned off, so "fatal" is not a minimum level).
[[nodiscard]] absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
// Lines below `level` are dropped from now on (default: kInfo).
void SetMinLogLevel(LogLevel level);

// The line Log writes for `message` at `time`, newline included.
[[nodiscard]] std::string FormatLogLine(absl::Time time, LogLevel level, absl::string_view message);

void Log(LogLevel level, absl::string_view message);
inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }
// Writes a FATAL line and aborts: for a state the process must not go on from (a journal write
// that failed after memory already changed).
[[noreturn]] void LogFatal(absl::string_view message);

}  // namespace entrokv

#endif  // ENTROKV_CORE_UTIL_LOG_H_
