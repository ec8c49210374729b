// entrokvd's start-up line, read by every C++ program that starts a daemon (the tests, the load
// generator's test). The daemon prints it on stdout, then flushes, once it serves
// (service/server.h, Server::ListeningLine):
//   entrokvd listening on HOST:PORT metrics on HOST:PORT      or   ... metrics off
#ifndef ENTROKV_TESTS_SUPPORT_DAEMON_LINE_H_
#define ENTROKV_TESTS_SUPPORT_DAEMON_LINE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace entrokv::testing {

struct ListeningAddresses {
  std::string grpc;  // HOST:PORT
  int grpc_port = 0;
  std::string metrics;   // HOST:PORT; empty when metrics are off
  int metrics_port = 0;  // 0 when metrics are off
};

// The addresses of the first complete start-up line (newline included) in `output`, what the
// daemon printed so far; nullopt while there is none.
[[nodiscard]] std::optional<ListeningAddresses> ParseListeningLine(absl::string_view output);

}  // namespace entrokv::testing

#endif  // ENTROKV_TESTS_SUPPORT_DAEMON_LINE_H_
