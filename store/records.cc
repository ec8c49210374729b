#include "store/records.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace entrokv::store {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("journal record: ", what));
}

void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void PutBe32(std::string& out, uint32_t value) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void PutLengthPrefixed(std::string& out, absl::string_view s) {
  PutBe32(out, static_cast<uint32_t>(s.size()));
  out.append(s.data(), s.size());
}

// Reads fixed-width fields off the front of a byte string; any overrun fails.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : rest_(bytes) {}
  bool Le(int bytes, uint64_t* value) {
    if (rest_.size() < static_cast<size_t>(bytes)) return false;
    *value = 0;
    for (int i = 0; i < bytes; ++i) {
      *value |= static_cast<uint64_t>(static_cast<unsigned char>(rest_[i])) << (8 * i);
    }
    rest_.remove_prefix(bytes);
    return true;
  }
  bool Be32(uint32_t* value) {
    if (rest_.size() < 4) return false;
    *value = 0;
    for (int i = 0; i < 4; ++i) *value = (*value << 8) | static_cast<unsigned char>(rest_[i]);
    rest_.remove_prefix(4);
    return true;
  }
  bool LengthPrefixed(std::string* s) {
    uint32_t size = 0;
    if (!Be32(&size) || rest_.size() < size) return false;
    s->assign(rest_.data(), size);
    rest_.remove_prefix(size);
    return true;
  }
  [[nodiscard]] bool done() const { return rest_.empty(); }

 private:
  absl::string_view rest_;
};

}  // namespace

bool ValidInstance(absl::string_view instance) {
  if (instance.empty() || instance.size() > 40) return false;
  for (const char c : instance) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-')) return false;
  }
  return true;
}

std::string EncodeModel(const ModelRecord& model) {
  std::string out;
  out.push_back(1);  // record version
  PutLengthPrefixed(out, model.model_id);
  const ModelGeometry& g = model.geometry;
  for (const int64_t field :
       {int64_t{g.layers}, int64_t{g.query_heads}, int64_t{g.kv_groups}, int64_t{g.head_dim},
        int64_t{g.page_size}, int64_t{g.element_bytes}}) {
    PutLe(out, static_cast<uint64_t>(field), 8);
  }
  out.push_back(static_cast<char>(model.layout));
  out.push_back(static_cast<char>(model.backend));
  PutLe(out, static_cast<uint64_t>(model.capacity_bytes), 8);
  PutLengthPrefixed(out, model.arena_name);
  return out;
}

absl::StatusOr<ModelRecord> DecodeModel(absl::string_view bytes) {
  if (bytes.empty() || bytes[0] != 1) return Bad("model record of an unknown version");
  Reader reader(bytes.substr(1));
  ModelRecord model;
  uint64_t fields[6] = {};
  uint64_t layout = 0;
  uint64_t backend = 0;
  uint64_t capacity = 0;
  bool ok = reader.LengthPrefixed(&model.model_id);
  for (uint64_t& field : fields) ok = ok && reader.Le(8, &field);
  ok = ok && reader.Le(1, &layout) && reader.Le(1, &backend) && reader.Le(8, &capacity) &&
       reader.LengthPrefixed(&model.arena_name) && reader.done();
  if (!ok) return Bad("model record is truncated or too long");
  for (const uint64_t field : fields) {
    if (field > static_cast<uint64_t>(INT32_MAX)) return Bad("model geometry out of range");
  }
  if (layout > static_cast<uint64_t>(FrameLayout::kLayer) ||
      backend > static_cast<uint64_t>(Backend::kCuda) ||
      capacity > static_cast<uint64_t>(INT64_MAX)) {
    return Bad("model record names an unknown layout or backend");
  }
  model.geometry.layers = static_cast<int>(fields[0]);
  model.geometry.query_heads = static_cast<int>(fields[1]);
  model.geometry.kv_groups = static_cast<int>(fields[2]);
  model.geometry.head_dim = static_cast<int>(fields[3]);
  model.geometry.page_size = static_cast<int>(fields[4]);
  model.geometry.element_bytes = static_cast<int>(fields[5]);
  model.layout = static_cast<FrameLayout>(layout);
  model.backend = static_cast<Backend>(backend);
  model.capacity_bytes = static_cast<int64_t>(capacity);
  return model;
}

std::string ModelKey(absl::string_view model_id) {
  std::string key(1, static_cast<char>(RecordKind::kModel));
  PutLengthPrefixed(key, model_id);
  return key;
}

std::string ModelPrefix(RecordKind kind, absl::string_view model_id) {
  std::string key(1, static_cast<char>(kind));
  PutLengthPrefixed(key, model_id);
  return key;
}

std::string SequenceKey(RecordKind kind, absl::string_view model_id,
                        absl::string_view sequence_id) {
  std::string key = ModelPrefix(kind, model_id);
  PutLengthPrefixed(key, sequence_id);
  return key;
}

std::string ChunkKey(absl::string_view model_id, absl::string_view sequence_id, int32_t layer,
                     int64_t chunk) {
  std::string key = SequenceKey(RecordKind::kTableChunk, model_id, sequence_id);
  PutBe32(key, static_cast<uint32_t>(layer));
  PutBe32(key, static_cast<uint32_t>(chunk));
  return key;
}

std::string WeightsKey(absl::string_view model_id, absl::string_view sequence_id, int32_t layer) {
  std::string key = SequenceKey(RecordKind::kWeights, model_id, sequence_id);
  PutBe32(key, static_cast<uint32_t>(layer));
  return key;
}

std::string RunningSumKey(absl::string_view model_id, absl::string_view sequence_id,
                          int32_t layer) {
  std::string key = SequenceKey(RecordKind::kRunningSum, model_id, sequence_id);
  PutBe32(key, static_cast<uint32_t>(layer));
  return key;
}

absl::StatusOr<ParsedKey> ParseKey(absl::string_view key) {
  if (key.empty()) return Bad("empty key");
  ParsedKey parsed;
  parsed.kind = static_cast<RecordKind>(key[0]);
  Reader reader(key.substr(1));
  bool ok = reader.LengthPrefixed(&parsed.model_id);
  uint32_t layer = 0;
  uint32_t chunk = 0;
  switch (parsed.kind) {
    case RecordKind::kModel:
      break;
    case RecordKind::kSequence:
    case RecordKind::kLost:
      ok = ok && reader.LengthPrefixed(&parsed.sequence_id);
      break;
    case RecordKind::kTableChunk:
      ok = ok && reader.LengthPrefixed(&parsed.sequence_id) && reader.Be32(&layer) &&
           reader.Be32(&chunk);
      break;
    case RecordKind::kWeights:
    case RecordKind::kRunningSum:
      ok = ok && reader.LengthPrefixed(&parsed.sequence_id) && reader.Be32(&layer);
      break;
    default:
      return Bad(
          absl::StrCat("unknown key kind 0x", absl::Hex(static_cast<unsigned char>(key[0]))));
  }
  if (!ok || !reader.done() || layer > INT32_MAX || chunk > INT32_MAX) {
    return Bad("malformed key");
  }
  parsed.layer = parsed.kind == RecordKind::kTableChunk || parsed.kind == RecordKind::kWeights ||
                         parsed.kind == RecordKind::kRunningSum
                     ? static_cast<int32_t>(layer)
                     : -1;
  parsed.chunk = parsed.kind == RecordKind::kTableChunk ? static_cast<int64_t>(chunk) : -1;
  return parsed;
}

std::string EncodeInt64(int64_t value) {
  std::string out;
  PutLe(out, static_cast<uint64_t>(value), 8);
  return out;
}

absl::StatusOr<int64_t> DecodeInt64(absl::string_view bytes) {
  Reader reader(bytes);
  uint64_t value = 0;
  if (!reader.Le(8, &value) || !reader.done()) return Bad("length record is not 8 bytes");
  return static_cast<int64_t>(value);
}

std::string EncodeChunk(const Sequence& sequence, int32_t layer, int32_t kv_groups,
                        int64_t first_page, int64_t last_page) {
  std::string out;
  out.reserve(static_cast<size_t>(kv_groups * (last_page - first_page) * 4));
  for (int32_t group = 0; group < kv_groups; ++group) {
    const std::vector<FrameId>& table = sequence.block_table(layer, group);
    for (int64_t page = first_page; page < last_page; ++page) {
      PutLe(out, static_cast<uint32_t>(table[page]), 4);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<FrameId>>> DecodeChunk(absl::string_view bytes,
                                                              int32_t kv_groups, int64_t pages) {
  if (static_cast<int64_t>(bytes.size()) != int64_t{kv_groups} * pages * 4) {
    return Bad(absl::StrCat("block-table chunk of ", bytes.size(), " bytes, expected ",
                            int64_t{kv_groups} * pages * 4));
  }
  Reader reader(bytes);
  std::vector<std::vector<FrameId>> frames(kv_groups, std::vector<FrameId>(pages));
  for (auto& group : frames) {
    for (FrameId& frame : group) {
      uint64_t value = 0;
      reader.Le(4, &value);
      frame = static_cast<FrameId>(static_cast<uint32_t>(value));
    }
  }
  return frames;
}

std::string EncodeDoubles(const std::vector<double>& values) {
  std::string out;
  for (const double value : values) {
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    PutLe(out, bits, 8);
  }
  return out;
}

absl::StatusOr<std::vector<double>> DecodeDoubles(absl::string_view bytes) {
  if (bytes.size() % 8 != 0) return Bad("head weights are not whole doubles");
  Reader reader(bytes);
  std::vector<double> values(bytes.size() / 8);
  for (double& value : values) {
    uint64_t bits = 0;
    reader.Le(8, &bits);
    std::memcpy(&value, &bits, sizeof(bits));
  }
  return values;
}

std::string EncodeFloats(const std::vector<float>& values) {
  std::string out;
  out.reserve(values.size() * 4);
  for (const float value : values) {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    PutLe(out, bits, 4);
  }
  return out;
}

absl::StatusOr<std::vector<float>> DecodeFloats(absl::string_view bytes) {
  if (bytes.size() % 4 != 0) return Bad("a running sum is not whole floats");
  Reader reader(bytes);
  std::vector<float> values(bytes.size() / 4);
  for (float& value : values) {
    uint64_t bits = 0;
    reader.Le(4, &bits);
    const auto narrow = static_cast<uint32_t>(bits);
    std::memcpy(&value, &narrow, sizeof(value));
  }
  return values;
}

}  // namespace entrokv::store
