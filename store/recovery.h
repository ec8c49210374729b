// Reading the journal back at start-up: every model with its open sequences, checked record by
// record before anything is rebuilt from it.
#ifndef ENTROKV_STORE_RECOVERY_H_
#define ENTROKV_STORE_RECOVERY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/pool/cache_state.h"
#include "store/records.h"
#include "store/state_store.h"

namespace entrokv::store {

struct RecoveredModel {
  ModelRecord model;
  std::vector<SequenceSnapshot> sequences;                // sorted by id
  std::vector<std::pair<std::string, std::string>> lost;  // (sequence id, reason)
};

// Every model in the store, sorted by id. DATA_LOSS naming --state_dir and the record for
// anything inconsistent: a record that does not parse, a geometry that does not validate, a
// sequence record without its model, a block-table chunk or weights without their sequence, a
// missing or extra chunk, a chunk of the wrong size. (The pool-level checks, frames in range
// and one layer per frame, are CacheState::Restore's.)
[[nodiscard]] absl::StatusOr<std::vector<RecoveredModel>> LoadState(const StateStore& store);

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_RECOVERY_H_
