// Reading the journal back at start-up: every model with its open sequences, checked record by
// record before anything is rebuilt from it.
#ifndef ENTROKV_STORE_RECOVERY_H_
#define ENTROKV_STORE_RECOVERY_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/cache_state.h"
#include "store/records.h"
#include "store/state_store.h"

namespace entrokv::store {

struct RecoveredModel {
  ModelRecord model;
  std::vector<SequenceSnapshot> sequences;                // sorted by id
  std::vector<std::pair<std::string, std::string>> lost;  // (sequence id, reason)
  std::vector<SwappedSnapshot> swapped;                   // swapped-out sequences, sorted by id
};

// Every model in the store, sorted by id. DATA_LOSS naming --state_dir and the record for
// anything inconsistent: a record that does not parse, a geometry that does not validate, a
// sequence record without its model, a block-table chunk or weights without their sequence, a
// missing or extra chunk, a chunk of the wrong size; pool-pressure terms, shares or a swapped-out
// sequence that do not parse, terms without their sequence, shares without terms. (The
// pool-level checks, frames in range and one layer per frame, are CacheState::Restore's.)
[[nodiscard]] absl::StatusOr<std::vector<RecoveredModel>> LoadState(const StateStore& store);

// LoadState over any source of records: `scan` calls its visitor for every (key, value) in key
// order, as StateStore::Scan does; `path` names the journal in messages. The checks live here,
// so the recovery fuzzer (tests/fuzz) runs them on fuzzed records without a LevelDB.
using RecordVisitor = std::function<absl::Status(absl::string_view, absl::string_view)>;
[[nodiscard]] absl::StatusOr<std::vector<RecoveredModel>> LoadRecords(
    absl::string_view path, const std::function<absl::Status(const RecordVisitor&)>& scan);

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_RECOVERY_H_
