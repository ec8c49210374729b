#include "service/list_pages.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "wire/checks.h"

namespace entrokv::service {
namespace {

constexpr absl::string_view kTokenPrefix = "entrokv.list.v1:";

}  // namespace

absl::StatusOr<int32_t> ListPageSize(int32_t requested) {
  if (requested < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: must be >= 0 (0: the default ",
                                                   kDefaultListPageSize, "), got ", requested));
  }
  if (requested == 0) return kDefaultListPageSize;
  return std::min(requested, kMaxListPageSize);
}

std::string EncodePageToken(absl::string_view last_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(kTokenPrefix, last_id));
}

absl::StatusOr<std::string> DecodePageToken(absl::string_view token) {
  if (token.empty()) return std::string();
  const auto invalid = [&token] {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: '", wire::EchoInput(token),
                     "' is not a next_page_token of ListSequences; start again without one"));
  };
  std::string decoded;
  if (!absl::WebSafeBase64Unescape(token, &decoded) || !absl::StartsWith(decoded, kTokenPrefix)) {
    return invalid();
  }
  std::string id = decoded.substr(kTokenPrefix.size());
  if (!wire::ValidateId("page_token", id).ok()) return invalid();
  return id;
}

}  // namespace entrokv::service
