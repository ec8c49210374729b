// ModelJournal: one model's CacheJournal over the StateStore, plus the whole-model writes
// (register, unregister, sequences lost at recovery).
#ifndef ENTROKV_STORE_MODEL_JOURNAL_H_
#define ENTROKV_STORE_MODEL_JOURNAL_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/pool/cache_journal.h"
#include "core/pool/geometry.h"
#include "store/records.h"
#include "store/state_store.h"

namespace entrokv::store {

// Each change is one atomic write of the records it touched (records.h). A write that fails
// stops the process (see CacheJournal): the in-memory change is already made and cannot be
// told to the client as a failure without lying about the state.
class ModelJournal final : public CacheJournal {
 public:
  // `store` must outlive this.
  ModelJournal(StateStore* store, std::string model_id, const ModelGeometry& geometry)
      : store_(store), model_id_(std::move(model_id)), geometry_(geometry) {}

  void SequenceOpened(const Sequence& sequence) override;
  void TokensAppended(const Sequence& sequence, int64_t first_changed_page) override;
  void TokensTruncated(const Sequence& sequence, int64_t old_page_count) override;
  void DecisionApplied(const Sequence& sequence, std::span<const LayerKeep> layers,
                       std::span<const ApplyResult> results) override;
  void HeadWeightsSet(const Sequence& sequence, int32_t layer) override;
  void SequenceClosed(const Sequence& sequence) override;
  void LostSequenceForgotten(absl::string_view sequence_id) override;
  void TermsSet(absl::string_view sequence_id, const SequencePressure& terms) override;
  void SharesSet(absl::string_view sequence_id, const SequencePressure& terms,
                 int32_t layer) override;
  void SequenceSwappedOut(const SwappedSnapshot& snapshot) override;
  void SwappedSequenceClosed(absl::string_view sequence_id) override;

 private:
  void PutChunks(leveldb::WriteBatch& batch, const Sequence& sequence, int32_t layer,
                 int64_t first_chunk, int64_t last_chunk) const;
  // The layer's running sum as the sequence holds it (deleted when it has none).
  void PutRunningSum(leveldb::WriteBatch& batch, const Sequence& sequence, int32_t layer) const;
  void Commit(leveldb::WriteBatch& batch) const;
  // Deletes the sequence's S, T (of `pages` pages) and W records.
  void DeleteResident(leveldb::WriteBatch& batch, absl::string_view sequence_id,
                      int64_t pages) const;
  // Deletes its P and R records.
  void DeleteTerms(leveldb::WriteBatch& batch, absl::string_view sequence_id) const;

  StateStore* const store_;
  const std::string model_id_;
  const ModelGeometry geometry_;
};

// A registered model, synced before RegisterModel answers.
[[nodiscard]] absl::Status RecordModel(StateStore& store, const ModelRecord& model);
// Every record of the model and its sequences, atomically (UnregisterModel).
[[nodiscard]] absl::Status DeleteModel(StateStore& store, absl::string_view model_id);
// Recovery found the model's frames gone (a cuda arena, a host arena no longer there): rewrites
// the model (its new arena) and replaces its sequences by lost marks carrying `reason`, in one
// synced write.
[[nodiscard]] absl::Status RecordLoss(StateStore& store, const ModelRecord& model,
                                      const std::vector<std::string>& lost_ids,
                                      absl::string_view reason);

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_MODEL_JOURNAL_H_
