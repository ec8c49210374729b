// Protobuf's own log lines, routed through the daemon's logger and throttled.
//
// Protobuf writes a line to stderr for every string field that is not UTF-8 in a message it
// parses, and a client decides how many of those it sends: left alone, one client fills the
// node's log (the load generator's 10 minutes left 600 such lines). RouteProtobufLogs sends them
// through Log instead, at most one per interval; the next line written says how many were
// dropped in between. The requests themselves are answered and counted as before.
#ifndef ENTROKV_SERVICE_PROTOBUF_LOG_H_
#define ENTROKV_SERVICE_PROTOBUF_LOG_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace entrokv::service {

// At most one message per `interval`. Thread-safe.
class LogThrottle {
 public:
  explicit LogThrottle(absl::Duration interval) : interval_(interval) {}

  // For a message at `now`: nullopt if it must be dropped, else how many were dropped since the
  // last one admitted (the line should say so).
  [[nodiscard]] std::optional<int64_t> Admit(absl::Time now) ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  const absl::Duration interval_;
  absl::Mutex mutex_;
  absl::Time next_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  int64_t dropped_ ABSL_GUARDED_BY(mutex_) = 0;
};

// From now on protobuf's messages go through Log (INFO, WARNING, ERROR as protobuf ranks them;
// FATAL as ERROR, never throttled), "protobuf: " before the text, at most one per `interval`.
void RouteProtobufLogs(absl::Duration interval = absl::Seconds(10));

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_PROTOBUF_LOG_H_
