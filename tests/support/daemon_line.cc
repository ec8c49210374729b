#include "tests/support/daemon_line.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace entrokv::testing {
namespace {

constexpr absl::string_view kPrefix = "entrokvd listening on ";

// The port after the last ':' of HOST:PORT; 0 when there is none.
int PortOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return 0;
  }
  return port;
}

// One line without its newline: the addresses, or nullopt when it is not the start-up line.
std::optional<ListeningAddresses> ParseLine(absl::string_view line) {
  if (!absl::ConsumePrefix(&line, kPrefix)) return std::nullopt;
  const size_t space = line.find(' ');
  if (space == absl::string_view::npos) return std::nullopt;
  ListeningAddresses addresses;
  addresses.grpc = std::string(line.substr(0, space));
  addresses.grpc_port = PortOf(addresses.grpc);
  absl::string_view rest = line.substr(space);
  if (addresses.grpc_port == 0 || !absl::ConsumePrefix(&rest, " metrics ")) return std::nullopt;
  if (rest == "off") return addresses;
  if (!absl::ConsumePrefix(&rest, "on ") || absl::StrContains(rest, ' ')) return std::nullopt;
  addresses.metrics = std::string(rest);
  addresses.metrics_port = PortOf(rest);
  if (addresses.metrics_port == 0) return std::nullopt;
  return addresses;
}

}  // namespace

std::optional<ListeningAddresses> ParseListeningLine(absl::string_view output) {
  size_t begin = 0;
  for (size_t end = output.find('\n'); end != absl::string_view::npos;
       begin = end + 1, end = output.find('\n', begin)) {
    if (std::optional<ListeningAddresses> addresses =
            ParseLine(output.substr(begin, end - begin))) {
      return addresses;
    }
  }
  return std::nullopt;
}

}  // namespace entrokv::testing
