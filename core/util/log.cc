#include "core/util/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace entrokv {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kFatal:
      return "FATAL";
  }
  return "?";
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_level: '", name, "' is not info, warning or error"));
}

void SetMinLogLevel(LogLevel level) { min_level.store(static_cast<int>(level)); }

std::string FormatLogLine(absl::Time time, LogLevel level, absl::string_view message) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()),
                      " entrokvd ", LevelName(level), ": ", message, "\n");
}

void Log(LogLevel level, absl::string_view message) {
  if (static_cast<int>(level) < min_level.load()) return;
  const std::string line = FormatLogLine(absl::Now(), level, message);
  // One write(2) per line: concurrent lines never interleave.
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

void LogFatal(absl::string_view message) {
  Log(LogLevel::kFatal, message);
  std::abort();
}

}  // namespace entrokv
