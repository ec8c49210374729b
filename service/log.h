// The daemon's tiny logger (Debian's Abseil has no absl/log): one line to stderr per call.
#ifndef ENTROKV_SERVICE_LOG_H_
#define ENTROKV_SERVICE_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"

namespace entrokv::service {

inline void LogLine(absl::string_view level, absl::string_view message) {
  std::fprintf(stderr, "entrokvd %.*s: %.*s\n", static_cast<int>(level.size()), level.data(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_LOG_H_
