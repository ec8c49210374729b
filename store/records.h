// The journal's records: keys and value encodings (fixed-width little-endian, bounds-checked on
// the way back). The journal keeps state, not a log of operations: each record is the current
// value of one piece, rewritten in place when it changes, so recovery reads each piece once and
// nothing ever needs compacting by hand.
//
//   "F"                                  format marker (kFormatValue)
//   "I"                                  instance name (arena names, see StateStore::instance)
//   "C"                                  the number of the last journal write (fixed64): every
//                                        write sets it, so it ends where the journal ends
//   "M" lp(model)                        ModelRecord
//   "S" lp(model) lp(seq)                the sequence's length (fixed64)
//   "T" lp(model) lp(seq) be32(layer) be32(chunk)
//                                        block-table chunk: kv_groups x up to kChunkPages
//                                        frame ids (fixed32), [group][page - chunk*kChunkPages]
//   "W" lp(model) lp(seq) be32(layer)    cached head weights: query_heads doubles
//   "A" lp(model) lp(seq) be32(layer)    running sum of chunked ACCUMULATED statistics:
//                                        query_heads x covered tokens floats, [head][token]
//   "L" lp(model) lp(seq)                a sequence lost at recovery: the reason
//   "P" lp(model) lp(seq)                pool pressure: the sequence's terms (tenant, priority,
//                                        server-chosen budget, quota, preemption mark); absent
//                                        for a sequence with the default terms
//   "R" lp(model) lp(seq) be32(layer)    the layer's page shares (server-chosen budgets):
//                                        kv_groups lists of float32
//   "X" lp(model) lp(seq)                a swapped-out sequence (instead of its S, T, W and A
//                                        records): length, slot tables, weights, running sums, swap
//                                        arena
//
// lp(s) is s's length as big-endian 32 bits, then s: keys of one model (or sequence) share a
// prefix, and no id can pose as another's prefix.
#ifndef ENTROKV_STORE_RECORDS_H_
#define ENTROKV_STORE_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/pool/cache_state.h"
#include "core/pool/geometry.h"
#include "core/pool/pressure.h"

namespace entrokv::store {

inline constexpr char kFormatKey[] = "F";
inline constexpr char kInstanceKey[] = "I";
// Compared at start-up with the sync mark beside the journal (store/sync_mark.h).
inline constexpr char kWriteKey[] = "C";
inline constexpr char kFormatValue[] = "entrokv-state-1";
// Pages per block-table record: an append that opens a page rewrites one chunk per (layer),
// not the whole table; a decision rewrites only the chunks it evicted in.
inline constexpr int64_t kChunkPages = 64;

enum class RecordKind : char {
  kModel = 'M',
  kSequence = 'S',
  kTableChunk = 'T',
  kWeights = 'W',
  kLost = 'L',
  kRunningSum = 'A',
  kTerms = 'P',
  kShares = 'R',
  kSwapped = 'X',
};

// [0-9a-f-]+, at most 40 characters: it becomes part of shared-memory names.
[[nodiscard]] bool ValidInstance(absl::string_view instance);

struct ModelRecord {
  std::string model_id;
  ModelGeometry geometry;
  FrameLayout layout = FrameLayout::kGroup;
  Backend backend = Backend::kHost;
  int64_t capacity_bytes = 0;
  // Host: the shared-memory name of each rank's arena, to attach again; cuda: empty.
  std::vector<std::string> arena_names;
  std::vector<int> devices = {0};  // the device of each tensor-parallel rank
};

[[nodiscard]] std::string EncodeModel(const ModelRecord& model);
// DATA_LOSS when the bytes are not a ModelRecord.
[[nodiscard]] absl::StatusOr<ModelRecord> DecodeModel(absl::string_view bytes);

[[nodiscard]] std::string ModelKey(absl::string_view model_id);
// The prefix of every record of the model's sequences, of kind `kind`.
[[nodiscard]] std::string ModelPrefix(RecordKind kind, absl::string_view model_id);
[[nodiscard]] std::string SequenceKey(RecordKind kind, absl::string_view model_id,
                                      absl::string_view sequence_id);
[[nodiscard]] std::string ChunkKey(absl::string_view model_id, absl::string_view sequence_id,
                                   int32_t layer, int64_t chunk);
[[nodiscard]] std::string WeightsKey(absl::string_view model_id, absl::string_view sequence_id,
                                     int32_t layer);
[[nodiscard]] std::string RunningSumKey(absl::string_view model_id, absl::string_view sequence_id,
                                        int32_t layer);

[[nodiscard]] std::string SharesKey(absl::string_view model_id, absl::string_view sequence_id,
                                    int32_t layer);

// A parsed key. layer and chunk are set for kTableChunk (chunk), kWeights, kRunningSum and
// kShares (layer only).
struct ParsedKey {
  RecordKind kind = RecordKind::kModel;
  std::string model_id;
  std::string sequence_id;
  int32_t layer = -1;
  int64_t chunk = -1;
};
// DATA_LOSS for a key that is none of the above.
[[nodiscard]] absl::StatusOr<ParsedKey> ParseKey(absl::string_view key);

[[nodiscard]] std::string EncodeInt64(int64_t value);
[[nodiscard]] absl::StatusOr<int64_t> DecodeInt64(absl::string_view bytes);
// The chunk's entries of every group of `layer`: kv_groups x pages [first, last).
[[nodiscard]] std::string EncodeChunk(const Sequence& sequence, int32_t layer, int32_t kv_groups,
                                      int64_t first_page, int64_t last_page);
// Frames [group][page]; DATA_LOSS unless the size is kv_groups x `pages` frame ids.
[[nodiscard]] absl::StatusOr<std::vector<std::vector<FrameId>>> DecodeChunk(absl::string_view bytes,
                                                                            int32_t kv_groups,
                                                                            int64_t pages);
[[nodiscard]] std::string EncodeDoubles(const std::vector<double>& values);
[[nodiscard]] absl::StatusOr<std::vector<double>> DecodeDoubles(absl::string_view bytes);
[[nodiscard]] std::string EncodeFloats(const std::vector<float>& values);
// DATA_LOSS unless the size is whole floats.
[[nodiscard]] absl::StatusOr<std::vector<float>> DecodeFloats(absl::string_view bytes);

// Pool pressure. A sequence's terms without its shares (those are per layer, below); DATA_LOSS
// for bytes that are not such a record or hold a value out of range.
[[nodiscard]] std::string EncodeTerms(const SequencePressure& terms);
[[nodiscard]] absl::StatusOr<SequencePressure> DecodeTerms(absl::string_view bytes);
// The page shares of `layer`'s kv_groups groups (terms.shares); DATA_LOSS unless the bytes hold
// `kv_groups` lists of shares in [0, 1] or kUnscored, each of at most `max_pages`.
[[nodiscard]] std::string EncodeShares(const SequencePressure& terms, int32_t layer,
                                       int32_t kv_groups);
[[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> DecodeShares(absl::string_view bytes,
                                                                           int32_t kv_groups,
                                                                           int64_t max_pages);
// A swapped-out sequence without its terms (snapshot.pressure is not written). DATA_LOSS for
// bytes that are not one; the shapes are CacheState::Restore's to check.
[[nodiscard]] std::string EncodeSwapped(const SwappedSnapshot& snapshot);
[[nodiscard]] absl::StatusOr<SwappedSnapshot> DecodeSwapped(absl::string_view bytes);

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_RECORDS_H_
