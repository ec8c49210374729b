// ListSequences paging: the page size a request may ask for and the opaque page token.
#ifndef ENTROKV_SERVICE_LIST_PAGES_H_
#define ENTROKV_SERVICE_LIST_PAGES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv::service {

// Sequences per ListSequences page when the request asks for 0, and the most one page holds.
inline constexpr int32_t kDefaultListPageSize = 100;
inline constexpr int32_t kMaxListPageSize = 1000;
// Upper bounds of the wire bytes of one listed sequence without its tables (id of at most 128
// characters and three small fields), and of one block-table entry as CacheState counts them
// (a table's header: its tags, layer, group and length; or one frame id, 10 bytes for -1).
inline constexpr int64_t kListedSequenceBytes = 256;
inline constexpr int64_t kListedEntryBytes = 20;

// The page size of a request: 0 -> kDefaultListPageSize, above kMaxListPageSize -> that;
// INVALID_ARGUMENT naming page_size when negative.
[[nodiscard]] absl::StatusOr<int32_t> ListPageSize(int32_t requested);

// The token that resumes a listing after the sequence `last_id` (opaque to clients: web-safe
// base64 of a versioned prefix and the id, so it stays valid whatever opens or closes).
[[nodiscard]] std::string EncodePageToken(absl::string_view last_id);
// The id to resume after; "" for an empty token (the first page). INVALID_ARGUMENT naming
// page_token for anything EncodePageToken did not make.
[[nodiscard]] absl::StatusOr<std::string> DecodePageToken(absl::string_view token);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_LIST_PAGES_H_
