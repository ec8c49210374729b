#include "wire/checks.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/pool/sequence.h"

namespace entrokv::wire {

absl::Status InvalidField(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

std::string EchoInput(absl::string_view input) {
  if (input.size() <= kMaxEchoedChars) return std::string(input);
  return absl::StrCat(input.substr(0, kMaxEchoedChars), "...");
}

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

absl::Status ValidateId(absl::string_view field, absl::string_view id) {
  if (id.empty()) return InvalidField(field, "must not be empty");
  if (id.size() > kMaxIdLength) {
    return InvalidField(field, absl::StrCat("longer than ", kMaxIdLength, " characters"));
  }
  for (const char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '/' && c != '-') {
      return InvalidField(field, "may hold only [A-Za-z0-9._:/-]");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenCount(absl::string_view field, int64_t tokens, int64_t min_tokens) {
  if (tokens < min_tokens || tokens > kMaxSequenceTokens) {
    return InvalidField(field, absl::StrCat("must be in [", min_tokens, ", ", kMaxSequenceTokens,
                                            "], got ", tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateAnswerWithin(absl::string_view field, int64_t milliseconds) {
  if (milliseconds < 0 || milliseconds > kMaxAnswerWithinMs) {
    return InvalidField(field, absl::StrCat("must be in [0, ", kMaxAnswerWithinMs,
                                            "] milliseconds (0: none), got ", milliseconds));
  }
  return absl::OkStatus();
}

}  // namespace entrokv::wire
