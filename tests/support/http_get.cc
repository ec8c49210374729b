#include "tests/support/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace entrokv::testing {

absl::StatusOr<std::string> HttpGet(int port, absl::string_view path, int timeout_ms) {
  const std::string where = absl::StrCat("GET 127.0.0.1:", port, path);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(where, ": socket: ", strerror(errno)));
  const timeval timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  std::string failure;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    failure = absl::StrCat("connect: ", strerror(errno));
  } else {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      failure = absl::StrCat("send: ", strerror(errno));
    } else {
      char buffer[16384];
      ssize_t n;
      while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
      if (n < 0) failure = absl::StrCat("recv: ", strerror(errno));
    }
  }
  ::close(fd);
  if (!failure.empty()) return absl::UnavailableError(absl::StrCat(where, ": ", failure));
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos || !absl::StartsWith(response, "HTTP/1.")) {
    return absl::UnavailableError(
        absl::StrCat(where, ": no HTTP answer (", response.size(), " bytes)"));
  }
  // "HTTP/1.x CODE REASON": the code is the three digits after the first space.
  const std::string status_line = response.substr(0, response.find("\r\n"));
  int code = 0;
  if (status_line.size() < 12 || !absl::SimpleAtoi(status_line.substr(9, 3), &code) ||
      code != 200) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": ", status_line));
  }
  return response.substr(body + 4);
}

}  // namespace entrokv::testing
