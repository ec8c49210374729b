// The two macros every fallible function in entrokv uses. Debian's Abseil has none.
#ifndef ENTROKV_CORE_UTIL_STATUS_MACROS_H_
#define ENTROKV_CORE_UTIL_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ENTROKV_MACRO_CONCAT_INNER_(a, b) a##b
#define ENTROKV_MACRO_CONCAT_(a, b) ENTROKV_MACRO_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const absl::Status _entrokv_status = (expr);       \
    if (!_entrokv_status.ok()) return _entrokv_status; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()): binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(ENTROKV_MACRO_CONCAT_(_entrokv_or_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(*tmp)

#endif  // ENTROKV_CORE_UTIL_STATUS_MACROS_H_
