#include "service/protobuf_log.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/util/log.h"
#include "google/protobuf/stubs/logging.h"

namespace entrokv::service {
namespace {

// Protobuf's handler is a plain function pointer, so its throttle lives here.
LogThrottle* protobuf_throttle = nullptr;

void LogProtobufMessage(google::protobuf::LogLevel level, const char* file, int line,
                        const std::string& message) {
  // Throttled first: a dropped message (most of them, under a hostile client) costs no formatting.
  std::optional<int64_t> dropped = 0;
  if (level != google::protobuf::LOGLEVEL_FATAL) {
    dropped = protobuf_throttle->Admit(absl::Now());
    if (!dropped.has_value()) return;
  }
  const std::string suffix =
      *dropped > 0 ? absl::StrCat(" [", *dropped, " protobuf messages dropped before this one]")
                   : "";
  Log(level == google::protobuf::LOGLEVEL_INFO      ? LogLevel::kInfo
      : level == google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                    : LogLevel::kError,
      absl::StrCat("protobuf: ", message, " (", file, ":", line, ")", suffix));
}

}  // namespace

std::optional<int64_t> LogThrottle::Admit(absl::Time now) {
  absl::MutexLock lock(&mutex_);
  if (now < next_) {
    ++dropped_;
    return std::nullopt;
  }
  next_ = now + interval_;
  const int64_t dropped = dropped_;
  dropped_ = 0;
  return dropped;
}

void RouteProtobufLogs(absl::Duration interval) {
  // Replaced, never freed: protobuf may call the handler from any thread until exit.
  protobuf_throttle = new LogThrottle(interval);
  google::protobuf::SetLogHandler(&LogProtobufMessage);
}

}  // namespace entrokv::service
