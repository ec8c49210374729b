#include "core/util/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace entrokv {

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view what) {
  Json value = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a well-formed JSON document"));
  }
  return value;
}

std::string DumpJson(const Json& value, int indent) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

double RoundTo(double value, int digits) {
  if (!std::isfinite(value)) return value;
  const double scale = std::pow(10.0, digits);
  return std::round(value * scale) / scale;
}

}  // namespace entrokv
