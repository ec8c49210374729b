// JSON through nlohmann::json, wrapped so that project code never sees its exceptions: parsing
// returns a status, writing replaces invalid UTF-8 instead of throwing. Objects keep their keys in
// insertion order, so the documents the tools print read in a stable, designed order.
#ifndef ENTROKV_CORE_UTIL_JSON_H_
#define ENTROKV_CORE_UTIL_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace entrokv {

using Json = nlohmann::ordered_json;

// INVALID_ARGUMENT naming `what` when `text` is not one well-formed JSON document.
[[nodiscard]] absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view what);

// `indent` < 0: compact, one line, no spaces (what the CLI prints); otherwise pretty-printed.
// Never throws: bytes that are not UTF-8 are written as U+FFFD.
[[nodiscard]] std::string DumpJson(const Json& value, int indent = -1);

// `value` rounded to `digits` decimals, so that measured numbers print as 2.165 rather than
// 2.16499999999999.
[[nodiscard]] double RoundTo(double value, int digits);

}  // namespace entrokv

#endif  // ENTROKV_CORE_UTIL_JSON_H_
