// Checks of single request fields, and the shape of their errors: INVALID_ARGUMENT with the
// offending field first ("<field>: why"). The daemon runs them before any state changes; a
// client may run them to refuse a request before sending it.
#ifndef ENTROKV_WIRE_CHECKS_H_
#define ENTROKV_WIRE_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace entrokv::wire {

// INVALID_ARGUMENT "<field>: <why>".
[[nodiscard]] absl::Status InvalidField(absl::string_view field, absl::string_view why);

inline constexpr int kMaxIdLength = 128;

// Model, sequence and page-token ids: non-empty, at most 128 characters of [A-Za-z0-9._:/-].
[[nodiscard]] absl::Status ValidateId(absl::string_view field, absl::string_view id);

// A token count in [min_tokens, kMaxSequenceTokens] (the one bound on a sequence's length, so
// every handler agrees on it); INVALID_ARGUMENT naming `field` otherwise.
[[nodiscard]] absl::Status ValidateTokenCount(absl::string_view field, int64_t tokens,
                                              int64_t min_tokens);

// A request's own time budget in milliseconds (answer_within_ms): in [0, kMaxAnswerWithinMs], 0
// meaning none; INVALID_ARGUMENT naming `field` otherwise.
inline constexpr int64_t kMaxAnswerWithinMs = 3'600'000;  // one hour
[[nodiscard]] absl::Status ValidateAnswerWithin(absl::string_view field, int64_t milliseconds);

// At most the first 200 characters of client input, with "..." when cut: error messages echo
// what they refuse, and an unbounded echo would turn the error into an oversized trailer.
inline constexpr size_t kMaxEchoedChars = 200;
[[nodiscard]] std::string EchoInput(absl::string_view input);

// Same code, message prefixed with "<prefix>: " (OK stays OK).
[[nodiscard]] absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

}  // namespace entrokv::wire

#endif  // ENTROKV_WIRE_CHECKS_H_
