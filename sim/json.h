// The little JSON the trace metadata needs: a parser for any well-formed document (so traces a
// Python capture writes with json.dump read back) and escaping for the writer.
#ifndef ENTROKV_SIM_JSON_H_
#define ENTROKV_SIM_JSON_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv::sim {

// A parsed value. Objects keep their members in document order. Copyable.
struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string text;
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;

  // The member named `key`, or nullptr. REQUIRES: type == kObject (else nullptr).
  [[nodiscard]] const JsonValue* Find(absl::string_view key) const;
};

// INVALID_ARGUMENT with the byte offset of the first error.
[[nodiscard]] absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// `text` as a quoted JSON string.
[[nodiscard]] std::string JsonQuote(absl::string_view text);

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_JSON_H_
