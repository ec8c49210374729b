#include "store/model_journal.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "core/util/log.h"
#include "core/util/page_count.h"
#include "core/util/status_macros.h"

namespace entrokv::store {
namespace {

int64_t ChunkOf(int64_t page) { return page / kChunkPages; }

leveldb::Slice AsSlice(const std::string& s) { return leveldb::Slice(s.data(), s.size()); }

}  // namespace

void ModelJournal::PutChunks(leveldb::WriteBatch& batch, const Sequence& sequence, int32_t layer,
                             int64_t first_chunk, int64_t last_chunk) const {
  for (int64_t chunk = first_chunk; chunk <= last_chunk; ++chunk) {
    const int64_t first_page = chunk * kChunkPages;
    const int64_t last_page = std::min(sequence.page_count(), first_page + kChunkPages);
    batch.Put(AsSlice(ChunkKey(model_id_, sequence.id(), layer, chunk)),
              AsSlice(EncodeChunk(sequence, layer, geometry_.kv_groups, first_page, last_page)));
  }
}

void ModelJournal::PutRunningSum(leveldb::WriteBatch& batch, const Sequence& sequence,
                                 int32_t layer) const {
  const std::string key = RunningSumKey(model_id_, sequence.id(), layer);
  if (sequence.running_sum(layer).empty()) {
    batch.Delete(AsSlice(key));
  } else {
    batch.Put(AsSlice(key), AsSlice(EncodeFloats(sequence.running_sum(layer))));
  }
}

void ModelJournal::Commit(leveldb::WriteBatch& batch) const {
  const absl::Status written = store_->Write(batch);
  if (written.ok()) return;
  LogFatal(absl::StrCat("model '", model_id_, "': ", written.message(),
                        "; stopping so that a restart recovers exactly what clients were told"));
}

void ModelJournal::DeleteResident(leveldb::WriteBatch& batch, absl::string_view sequence_id,
                                  int64_t pages) const {
  batch.Delete(AsSlice(SequenceKey(RecordKind::kSequence, model_id_, sequence_id)));
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    if (pages > 0) {
      for (int64_t chunk = 0; chunk <= ChunkOf(pages - 1); ++chunk) {
        batch.Delete(AsSlice(ChunkKey(model_id_, sequence_id, layer, chunk)));
      }
    }
    batch.Delete(AsSlice(WeightsKey(model_id_, sequence_id, layer)));
    batch.Delete(AsSlice(RunningSumKey(model_id_, sequence_id, layer)));
  }
}

void ModelJournal::DeleteTerms(leveldb::WriteBatch& batch, absl::string_view sequence_id) const {
  batch.Delete(AsSlice(SequenceKey(RecordKind::kTerms, model_id_, sequence_id)));
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    batch.Delete(AsSlice(SharesKey(model_id_, sequence_id, layer)));
  }
}

void ModelJournal::SequenceOpened(const Sequence& sequence) {
  leveldb::WriteBatch batch;
  batch.Delete(AsSlice(SequenceKey(RecordKind::kLost, model_id_, sequence.id())));
  // A resumed sequence was swapped out until now.
  batch.Delete(AsSlice(SequenceKey(RecordKind::kSwapped, model_id_, sequence.id())));
  batch.Put(AsSlice(SequenceKey(RecordKind::kSequence, model_id_, sequence.id())),
            AsSlice(EncodeInt64(sequence.length())));
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    if (sequence.page_count() > 0) {
      PutChunks(batch, sequence, layer, 0, ChunkOf(sequence.page_count() - 1));
    }
    if (!sequence.head_weights(layer).empty()) {
      batch.Put(AsSlice(WeightsKey(model_id_, sequence.id(), layer)),
                AsSlice(EncodeDoubles(sequence.head_weights(layer))));
    }
    if (!sequence.running_sum(layer).empty()) PutRunningSum(batch, sequence, layer);
  }
  Commit(batch);
}

void ModelJournal::TokensAppended(const Sequence& sequence, int64_t first_changed_page) {
  leveldb::WriteBatch batch;
  batch.Put(AsSlice(SequenceKey(RecordKind::kSequence, model_id_, sequence.id())),
            AsSlice(EncodeInt64(sequence.length())));
  if (first_changed_page < sequence.page_count()) {
    for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
      PutChunks(batch, sequence, layer, ChunkOf(first_changed_page),
                ChunkOf(sequence.page_count() - 1));
    }
  }
  Commit(batch);
}

void ModelJournal::TokensTruncated(const Sequence& sequence, int64_t old_page_count) {
  leveldb::WriteBatch batch;  // one write: the length, the tables' tails and the sums together
  batch.Put(AsSlice(SequenceKey(RecordKind::kSequence, model_id_, sequence.id())),
            AsSlice(EncodeInt64(sequence.length())));
  const int64_t pages = sequence.page_count();
  for (int32_t layer = 0; layer < geometry_.layers; ++layer) {
    if (pages < old_page_count) {
      // The chunk now holding the last page shrank; the chunks after it went.
      if (pages > 0) PutChunks(batch, sequence, layer, ChunkOf(pages - 1), ChunkOf(pages - 1));
      const int64_t first_gone = pages > 0 ? ChunkOf(pages - 1) + 1 : 0;
      for (int64_t chunk = first_gone; chunk <= ChunkOf(old_page_count - 1); ++chunk) {
        batch.Delete(AsSlice(ChunkKey(model_id_, sequence.id(), layer, chunk)));
      }
    }
    if (sequence.running_sum_bytes() > 0) PutRunningSum(batch, sequence, layer);
  }
  Commit(batch);
}

void ModelJournal::DecisionApplied(const Sequence& sequence, std::span<const LayerKeep> layers,
                                   std::span<const ApplyResult> results) {
  leveldb::WriteBatch batch;  // every layer in one write: a crash keeps all or none
  bool changed = false;
  for (size_t i = 0; i < layers.size() && i < results.size(); ++i) {
    std::set<int64_t> chunks;
    for (const std::vector<int64_t>& pages : results[i].evicted_pages_per_group) {
      for (const int64_t page : pages) chunks.insert(ChunkOf(page));
    }
    for (const int64_t chunk : chunks) PutChunks(batch, sequence, layers[i].layer, chunk, chunk);
    changed = changed || !chunks.empty();
    if (results[i].running_sum_set) {
      PutRunningSum(batch, sequence, layers[i].layer);
      changed = true;
    }
  }
  if (changed) Commit(batch);  // nothing evicted: nothing changed
}

void ModelJournal::HeadWeightsSet(const Sequence& sequence, int32_t layer) {
  leveldb::WriteBatch batch;
  const std::string key = WeightsKey(model_id_, sequence.id(), layer);
  if (sequence.head_weights(layer).empty()) {
    batch.Delete(AsSlice(key));
  } else {
    batch.Put(AsSlice(key), AsSlice(EncodeDoubles(sequence.head_weights(layer))));
  }
  Commit(batch);
}

void ModelJournal::SequenceClosed(const Sequence& sequence) {
  leveldb::WriteBatch batch;
  DeleteResident(batch, sequence.id(), sequence.page_count());
  DeleteTerms(batch, sequence.id());
  Commit(batch);
}

void ModelJournal::LostSequenceForgotten(absl::string_view sequence_id) {
  leveldb::WriteBatch batch;
  batch.Delete(AsSlice(SequenceKey(RecordKind::kLost, model_id_, sequence_id)));
  Commit(batch);
}

void ModelJournal::TermsSet(absl::string_view sequence_id, const SequencePressure& terms) {
  leveldb::WriteBatch batch;
  batch.Put(AsSlice(SequenceKey(RecordKind::kTerms, model_id_, sequence_id)),
            AsSlice(EncodeTerms(terms)));
  Commit(batch);
}

void ModelJournal::SharesSet(absl::string_view sequence_id, const SequencePressure& terms,
                             int32_t layer) {
  leveldb::WriteBatch batch;
  batch.Put(AsSlice(SequenceKey(RecordKind::kTerms, model_id_, sequence_id)),
            AsSlice(EncodeTerms(terms)));
  batch.Put(AsSlice(SharesKey(model_id_, sequence_id, layer)),
            AsSlice(EncodeShares(terms, layer, geometry_.kv_groups)));
  Commit(batch);
}

void ModelJournal::SequenceSwappedOut(const SwappedSnapshot& snapshot) {
  leveldb::WriteBatch batch;
  DeleteResident(batch, snapshot.id, PageCount(snapshot.length, geometry_.page_size));
  batch.Put(AsSlice(SequenceKey(RecordKind::kSwapped, model_id_, snapshot.id)),
            AsSlice(EncodeSwapped(snapshot)));
  if (snapshot.pressure.has_value()) {
    batch.Put(AsSlice(SequenceKey(RecordKind::kTerms, model_id_, snapshot.id)),
              AsSlice(EncodeTerms(*snapshot.pressure)));
  }
  Commit(batch);
}

void ModelJournal::SwappedSequenceClosed(absl::string_view sequence_id) {
  leveldb::WriteBatch batch;
  batch.Delete(AsSlice(SequenceKey(RecordKind::kSwapped, model_id_, sequence_id)));
  DeleteTerms(batch, sequence_id);
  Commit(batch);
}

absl::Status RecordModel(StateStore& store, const ModelRecord& model) {
  leveldb::WriteBatch batch;
  batch.Put(AsSlice(ModelKey(model.model_id)), AsSlice(EncodeModel(model)));
  return store.Write(batch, /*sync=*/true);
}

absl::Status DeleteModel(StateStore& store, absl::string_view model_id) {
  std::vector<std::string> prefixes = {ModelKey(model_id)};
  for (const RecordKind kind : {RecordKind::kSequence, RecordKind::kTableChunk,
                                RecordKind::kWeights, RecordKind::kRunningSum, RecordKind::kLost,
                                RecordKind::kTerms, RecordKind::kShares, RecordKind::kSwapped}) {
    prefixes.push_back(ModelPrefix(kind, model_id));
  }
  RETURN_IF_ERROR(store.DeletePrefixes(prefixes));
  return store.Sync();
}

absl::Status RecordLoss(StateStore& store, const ModelRecord& model,
                        const std::vector<std::string>& lost_ids, absl::string_view reason) {
  leveldb::WriteBatch batch;
  for (const RecordKind kind :
       {RecordKind::kSequence, RecordKind::kTableChunk, RecordKind::kWeights,
        RecordKind::kRunningSum, RecordKind::kTerms, RecordKind::kShares, RecordKind::kSwapped}) {
    RETURN_IF_ERROR(store.Scan(ModelPrefix(kind, model.model_id),
                               [&batch](absl::string_view key, absl::string_view) {
                                 batch.Delete(leveldb::Slice(key.data(), key.size()));
                                 return absl::OkStatus();
                               }));
  }
  batch.Put(AsSlice(ModelKey(model.model_id)), AsSlice(EncodeModel(model)));
  for (const std::string& id : lost_ids) {
    batch.Put(AsSlice(SequenceKey(RecordKind::kLost, model.model_id, id)),
              leveldb::Slice(reason.data(), reason.size()));
  }
  return store.Write(batch, /*sync=*/true);
}

}  // namespace entrokv::store
