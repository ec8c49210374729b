// The one hand-written HTTP client of the tests and benchmarks: a GET on loopback, enough for
// /metrics, the health page and Prometheus's query API. Linux sockets, no TLS, no redirects.
#ifndef ENTROKV_TESTS_SUPPORT_HTTP_GET_H_
#define ENTROKV_TESTS_SUPPORT_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv::testing {

// GET http://127.0.0.1:<port><path> over HTTP/1.0: the body of a 200 answer. UNAVAILABLE when
// nothing accepts the connection or the exchange fails or times out (`timeout_ms` per socket
// operation); FAILED_PRECONDITION naming the status line for any other answer.
[[nodiscard]] absl::StatusOr<std::string> HttpGet(int port, absl::string_view path,
                                                  int timeout_ms = 2000);

}  // namespace entrokv::testing

#endif  // ENTROKV_TESTS_SUPPORT_HTTP_GET_H_
