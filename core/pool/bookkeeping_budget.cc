#include "core/pool/bookkeeping_budget.h"

#include "absl/strings/str_cat.h"

namespace entrokv {

absl::Status BookkeepingBudget::Reserve(int64_t bytes, absl::string_view what) {
  int64_t used = used_bytes_.load();
  do {
    if (limit_bytes_ > 0 && bytes > limit_bytes_ - used) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_bookkeeping_bytes: ", what, " needs ", bytes,
                       " more bytes of daemon bookkeeping, and the daemon's models already hold ",
                       used, " of the limit of ", limit_bytes_,
                       "; close sequences or unregister models first (nothing changed)"));
    }
  } while (!used_bytes_.compare_exchange_weak(used, used + bytes));
  return absl::OkStatus();
}

}  // namespace entrokv
