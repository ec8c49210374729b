#include "store/recovery.h"

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/pool/geometry_bounds.h"
#include "core/util/page_count.h"
#include "core/util/status_macros.h"

namespace entrokv::store {
namespace {

using SequenceId = std::pair<std::string, std::string>;  // (model, sequence)

struct SequenceParts {
  int64_t length = -1;                                        // -1: no "S" record seen
  std::map<std::pair<int32_t, int64_t>, std::string> chunks;  // (layer, chunk) -> bytes
  std::map<int32_t, std::string> weights;                     // layer -> bytes
  std::map<int32_t, std::string> running_sums;                // layer -> bytes
};

}  // namespace

absl::StatusOr<std::vector<RecoveredModel>> LoadState(const StateStore& store) {
  return LoadRecords(store.path(),
                     [&store](const RecordVisitor& visit) { return store.Scan("", visit); });
}

absl::StatusOr<std::vector<RecoveredModel>> LoadRecords(
    absl::string_view path, const std::function<absl::Status(const RecordVisitor&)>& scan) {
  const auto damaged = [path](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("--state_dir: the journal in ", path, " is inconsistent (", what,
                     "); refusing to trust it. Move it away to start empty"));
  };
  std::map<std::string, RecoveredModel> models;
  std::map<SequenceId, SequenceParts> sequences;
  std::map<SequenceId, std::string> lost;
  std::map<SequenceId, std::string> terms;
  std::map<SequenceId, std::map<int32_t, std::string>> shares;
  std::map<SequenceId, std::string> swapped;
  absl::Status scanned = scan([&](absl::string_view key, absl::string_view value) {
    if (key == kFormatKey || key == kInstanceKey || key == kWriteKey) return absl::OkStatus();
    absl::StatusOr<ParsedKey> parsed = ParseKey(key);
    if (!parsed.ok()) return damaged(parsed.status().message());
    const SequenceId id(parsed->model_id, parsed->sequence_id);
    switch (parsed->kind) {
      case RecordKind::kModel: {
        absl::StatusOr<ModelRecord> model = DecodeModel(value);
        if (!model.ok()) return damaged(model.status().message());
        if (model->model_id != parsed->model_id) return damaged("model record under another id");
        // Bounded as RegisterModel bounds it: the tables below are sized by the geometry.
        absl::Status valid = ValidateGeometry(model->geometry);
        if (valid.ok()) valid = ValidateGeometryBounds(model->geometry);
        if (valid.ok()) valid = ValidateFrameBounds(model->geometry, model->layout);
        if (!valid.ok()) {
          return damaged(absl::StrCat("model '", model->model_id, "': ", valid.message()));
        }
        models[model->model_id].model = *std::move(model);
        break;
      }
      case RecordKind::kSequence: {
        absl::StatusOr<int64_t> length = DecodeInt64(value);
        if (!length.ok()) return damaged(length.status().message());
        // Bounded before any arithmetic on it (pages, chunks) can overflow.
        if (*length < 0 || *length > kMaxSequenceTokens) {
          return damaged(
              absl::StrCat("sequence length ", *length, " outside [0, ", kMaxSequenceTokens, "]"));
        }
        sequences[id].length = *length;
        break;
      }
      case RecordKind::kTableChunk:
        sequences[id].chunks[{parsed->layer, parsed->chunk}] = std::string(value);
        break;
      case RecordKind::kWeights:
        sequences[id].weights[parsed->layer] = std::string(value);
        break;
      case RecordKind::kRunningSum:
        sequences[id].running_sums[parsed->layer] = std::string(value);
        break;
      case RecordKind::kLost:
        lost[id] = std::string(value);
        break;
      case RecordKind::kTerms:
        terms[id] = std::string(value);
        break;
      case RecordKind::kShares:
        shares[id][parsed->layer] = std::string(value);
        break;
      case RecordKind::kSwapped:
        swapped[id] = std::string(value);
        break;
    }
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(scanned);

  // Pool pressure: every sequence's terms with their shares, by id.
  std::map<SequenceId, SequencePressure> pressure;
  for (const auto& [id, bytes] : terms) {
    const std::string where = absl::StrCat("model '", id.first, "' sequence '", id.second, "'");
    const auto model = models.find(id.first);
    if (model == models.end()) return damaged(absl::StrCat(where, ": terms without a model"));
    if (!sequences.contains(id) && !swapped.contains(id)) {
      return damaged(absl::StrCat(where, ": terms without their sequence"));
    }
    absl::StatusOr<SequencePressure> decoded = DecodeTerms(bytes);
    if (!decoded.ok()) return damaged(absl::StrCat(where, ": ", decoded.status().message()));
    const ModelGeometry& g = model->second.model.geometry;
    if (const auto layers = shares.find(id); layers != shares.end()) {
      decoded->shares.resize(static_cast<size_t>(g.layers) * g.kv_groups);
      for (const auto& [layer, layer_bytes] : layers->second) {
        if (layer >= g.layers) return damaged(absl::StrCat(where, ": shares of layer ", layer));
        absl::StatusOr<std::vector<std::vector<float>>> groups =
            DecodeShares(layer_bytes, g.kv_groups, PageCount(kMaxSequenceTokens, g.page_size));
        if (!groups.ok()) return damaged(absl::StrCat(where, ": ", groups.status().message()));
        for (int32_t group = 0; group < g.kv_groups; ++group) {
          decoded->shares[static_cast<size_t>(layer) * g.kv_groups + group] =
              std::move((*groups)[static_cast<size_t>(group)]);
        }
      }
    }
    pressure[id] = *std::move(decoded);
  }
  for (const auto& [id, layers] : shares) {
    if (!terms.contains(id)) {
      return damaged(absl::StrCat("model '", id.first, "' sequence '", id.second,
                                  "': page shares without terms"));
    }
  }
  for (const auto& [id, bytes] : swapped) {
    const std::string where = absl::StrCat("model '", id.first, "' sequence '", id.second, "'");
    const auto model = models.find(id.first);
    if (model == models.end()) return damaged(absl::StrCat(where, ": swapped out without a model"));
    if (sequences.contains(id)) return damaged(absl::StrCat(where, ": both resident and swapped"));
    absl::StatusOr<SwappedSnapshot> snapshot = DecodeSwapped(bytes);
    if (!snapshot.ok()) return damaged(absl::StrCat(where, ": ", snapshot.status().message()));
    snapshot->id = id.second;
    if (const auto found = pressure.find(id); found != pressure.end()) {
      snapshot->pressure = found->second;
    }
    model->second.swapped.push_back(*std::move(snapshot));
  }

  for (auto& [id, parts] : sequences) {
    const auto& [model_id, sequence_id] = id;
    const std::string where = absl::StrCat("model '", model_id, "' sequence '", sequence_id, "'");
    const auto model = models.find(model_id);
    if (model == models.end()) return damaged(absl::StrCat(where, ": no model record"));
    if (parts.length < 0) return damaged(absl::StrCat(where, ": records without a length"));
    const ModelGeometry& g = model->second.model.geometry;
    SequenceSnapshot snapshot;
    snapshot.id = sequence_id;
    snapshot.length = parts.length;
    const int64_t pages = PageCount(parts.length, g.page_size);
    const int64_t chunks = (pages + kChunkPages - 1) / kChunkPages;
    if (static_cast<int64_t>(parts.chunks.size()) != chunks * g.layers) {
      return damaged(absl::StrCat(where, ": ", parts.chunks.size(), " block-table chunks, ",
                                  chunks * g.layers, " expected"));
    }
    snapshot.tables.assign(static_cast<size_t>(g.layers) * g.kv_groups, {});
    for (auto& table : snapshot.tables) table.reserve(pages);
    for (const auto& [position, bytes] : parts.chunks) {
      const auto [layer, chunk] = position;
      if (layer >= g.layers || chunk >= chunks) {
        return damaged(absl::StrCat(where, ": chunk (", layer, ", ", chunk, ") out of range"));
      }
      const int64_t in_chunk = std::min(kChunkPages, pages - chunk * kChunkPages);
      absl::StatusOr<std::vector<std::vector<FrameId>>> frames =
          DecodeChunk(bytes, g.kv_groups, in_chunk);
      if (!frames.ok()) return damaged(absl::StrCat(where, ": ", frames.status().message()));
      // Chunks come in (layer, chunk) order, so appending fills each table page by page.
      for (int32_t group = 0; group < g.kv_groups; ++group) {
        auto& table = snapshot.tables[static_cast<size_t>(layer) * g.kv_groups + group];
        table.insert(table.end(), (*frames)[group].begin(), (*frames)[group].end());
      }
    }
    snapshot.head_weights.assign(g.layers, {});
    for (const auto& [layer, bytes] : parts.weights) {
      if (layer >= g.layers) return damaged(absl::StrCat(where, ": weights of layer ", layer));
      absl::StatusOr<std::vector<double>> weights = DecodeDoubles(bytes);
      if (!weights.ok()) return damaged(absl::StrCat(where, ": ", weights.status().message()));
      snapshot.head_weights[layer] = *std::move(weights);
    }
    if (!parts.running_sums.empty()) snapshot.running_sums.assign(g.layers, {});
    for (const auto& [layer, bytes] : parts.running_sums) {
      if (layer >= g.layers) return damaged(absl::StrCat(where, ": running sum of layer ", layer));
      absl::StatusOr<std::vector<float>> sum = DecodeFloats(bytes);
      if (!sum.ok()) return damaged(absl::StrCat(where, ": ", sum.status().message()));
      // The shape against the geometry and the length: Sequence::FromSnapshot.
      snapshot.running_sums[layer] = *std::move(sum);
    }
    if (const auto found = pressure.find(id); found != pressure.end()) {
      snapshot.pressure = found->second;
    }
    model->second.sequences.push_back(std::move(snapshot));
  }
  for (auto& [id, reason] : lost) {
    const auto model = models.find(id.first);
    if (model == models.end()) {
      return damaged(
          absl::StrCat("lost sequence '", id.second, "' of unknown model '", id.first, "'"));
    }
    model->second.lost.emplace_back(id.second, reason);
  }
  std::vector<RecoveredModel> out;
  for (auto& [id, model] : models) out.push_back(std::move(model));
  return out;
}

}  // namespace entrokv::store
