// CacheJournal: what a CacheState tells a durable store about every change it makes, so that
// a restarted daemon can rebuild the pool exactly (CacheState::Restore). core/ only defines
// the interface; the store behind it (service side, --state_dir) is not core's concern.
#ifndef ENTROKV_CORE_POOL_CACHE_JOURNAL_H_
#define ENTROKV_CORE_POOL_CACHE_JOURNAL_H_

#include <cstdint>
#include <span>

#include "absl/strings/string_view.h"
#include "core/pool/pressure.h"
#include "core/pool/sequence.h"

namespace entrokv {

// Every method is called under the CacheState's lock, after the change is made in memory and
// before the call returns, in the order the changes happen; the Sequence passed shows the state
// after the change. Methods must not fail: an implementation that cannot make a change durable
// stops the process, so what a restart recovers never contradicts what a client was told.
// Pool reference counts and the free list are never journaled: they follow from the block
// tables.
class CacheJournal {
 public:
  virtual ~CacheJournal() = default;
  // A new sequence (opened or forked): everything about it.
  virtual void SequenceOpened(const Sequence& sequence) = 0;
  // The length changed; block-table entries changed only at pages >= first_changed_page (==
  // page_count() when no entry changed).
  virtual void TokensAppended(const Sequence& sequence, int64_t first_changed_page) = 0;
  // The sequence lost its last tokens (Sequence::Truncate): it held old_page_count pages before;
  // block-table entries past page_count() are gone, the running sums may have shrunk.
  virtual void TokensTruncated(const Sequence& sequence, int64_t old_page_count) = 0;
  // One decision over one or more layers: entries of layers[i].layer changed at the pages
  // results[i].evicted_pages_per_group names, and its running sum when results[i].running_sum_set.
  // Made durable as one write (all layers or none).
  virtual void DecisionApplied(const Sequence& sequence, std::span<const LayerKeep> layers,
                               std::span<const ApplyResult> results) = 0;
  // The cached head weights of `layer` changed.
  virtual void HeadWeightsSet(const Sequence& sequence, int32_t layer) = 0;
  // The sequence is being closed (still intact when this is called).
  virtual void SequenceClosed(const Sequence& sequence) = 0;
  // A sequence marked lost at recovery was closed by its client (or reopened).
  virtual void LostSequenceForgotten(absl::string_view sequence_id) = 0;

  // Pool pressure. The terms of an open (or swapped-out) sequence changed: tenant, priority,
  // budget, quota, preemption mark (the page shares are written by SharesSet).
  virtual void TermsSet(absl::string_view sequence_id, const SequencePressure& terms) = 0;
  // A decision with a server-chosen budget kept new page shares for `layer` (terms.shares);
  // made durable with the terms, as one write.
  virtual void SharesSet(absl::string_view sequence_id, const SequencePressure& terms,
                         int32_t layer) = 0;
  // The sequence was swapped out: its block tables, weights and lengths become `snapshot`
  // (one write; its terms and shares stay). Opening it again (a resume) is SequenceOpened.
  virtual void SequenceSwappedOut(const SwappedSnapshot& snapshot) = 0;
  // A swapped-out sequence was closed (terms and shares go too).
  virtual void SwappedSequenceClosed(absl::string_view sequence_id) = 0;
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_POOL_CACHE_JOURNAL_H_
