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
  [[nodiscard]] size_t left() const { return rest_.size(); }

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
  out.push_back(2);  // record version: 1 had one arena name and no devices
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
  PutBe32(out, static_cast<uint32_t>(model.arena_names.size()));
  for (const std::string& name : model.arena_names) PutLengthPrefixed(out, name);
  PutBe32(out, static_cast<uint32_t>(model.devices.size()));
  for (const int device : model.devices) PutLe(out, static_cast<uint32_t>(device), 4);
  return out;
}

absl::StatusOr<ModelRecord> DecodeModel(absl::string_view bytes) {
  if (bytes.empty() || (bytes[0] != 1 && bytes[0] != 2)) {
    return Bad("model record of an unknown version");
  }
  const int version = bytes[0];
  Reader reader(bytes.substr(1));
  ModelRecord model;
  uint64_t fields[6] = {};
  uint64_t layout = 0;
  uint64_t backend = 0;
  uint64_t capacity = 0;
  bool ok = reader.LengthPrefixed(&model.model_id);
  for (uint64_t& field : fields) ok = ok && reader.Le(8, &field);
  ok = ok && reader.Le(1, &layout) && reader.Le(1, &backend) && reader.Le(8, &capacity);
  if (version == 1) {
    std::string name;
    ok = ok && reader.LengthPrefixed(&name);
    if (!name.empty()) model.arena_names = {name};
  } else {
    // Counts bounded by the bytes left, so a damaged count allocates nothing.
    uint32_t names = 0;
    uint32_t devices = 0;
    ok = ok && reader.Be32(&names) && names <= reader.left() / 4;
    model.arena_names.resize(ok ? names : 0);
    for (std::string& name : model.arena_names) ok = ok && reader.LengthPrefixed(&name);
    ok = ok && reader.Be32(&devices) && devices >= 1 && devices <= reader.left() / 4;
    model.devices.resize(ok ? devices : 0);
    for (int& device : model.devices) {
      uint64_t value = 0;
      ok = ok && reader.Le(4, &value) && value <= static_cast<uint64_t>(INT32_MAX);
      device = static_cast<int>(value);
    }
  }
  ok = ok && reader.done();
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

std::string SharesKey(absl::string_view model_id, absl::string_view sequence_id, int32_t layer) {
  std::string key = SequenceKey(RecordKind::kShares, model_id, sequence_id);
  PutBe32(key, static_cast<uint32_t>(layer));
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
    case RecordKind::kTerms:
    case RecordKind::kSwapped:
      ok = ok && reader.LengthPrefixed(&parsed.sequence_id);
      break;
    case RecordKind::kTableChunk:
      ok = ok && reader.LengthPrefixed(&parsed.sequence_id) && reader.Be32(&layer) &&
           reader.Be32(&chunk);
      break;
    case RecordKind::kWeights:
    case RecordKind::kRunningSum:
    case RecordKind::kShares:
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
                         parsed.kind == RecordKind::kRunningSum ||
                         parsed.kind == RecordKind::kShares
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

namespace {

void PutDouble(std::string& out, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  PutLe(out, bits, 8);
}

bool GetDouble(Reader& reader, double* value) {
  uint64_t bits = 0;
  if (!reader.Le(8, &bits)) return false;
  std::memcpy(value, &bits, sizeof(bits));
  return true;
}

void PutFloat(std::string& out, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  PutLe(out, bits, 4);
}

// A count of `unit`-byte items that the rest of the record can hold (so a damaged count cannot
// make the reader allocate beyond the record).
bool GetCount(Reader& reader, size_t unit, uint64_t* count) {
  return reader.Le(4, count) && *count * unit <= reader.left();
}

}  // namespace

std::string EncodeTerms(const SequencePressure& terms) {
  std::string out;
  out.push_back(1);  // record version
  PutLengthPrefixed(out, terms.tenant);
  PutLe(out, static_cast<uint32_t>(terms.priority), 4);
  out.push_back(static_cast<char>((terms.auto_budget ? 1 : 0) | (terms.preempt ? 2 : 0) |
                                  (terms.protect_tail ? 4 : 0)));
  PutDouble(out, terms.floor_fraction);
  PutLe(out, static_cast<uint64_t>(terms.quota_frames), 8);
  out.push_back(static_cast<char>(terms.quota_reason));
  PutLe(out, static_cast<uint64_t>(terms.admitted), 8);
  PutLe(out, static_cast<uint64_t>(terms.sink_pages), 8);
  PutLe(out, static_cast<uint64_t>(terms.recent_pages), 8);
  return out;
}

absl::StatusOr<SequencePressure> DecodeTerms(absl::string_view bytes) {
  if (bytes.empty() || bytes[0] != 1) return Bad("terms record of an unknown version");
  Reader reader(bytes.substr(1));
  SequencePressure terms;
  uint64_t priority = 0;
  uint64_t flags = 0;
  uint64_t quota = 0;
  uint64_t reason = 0;
  uint64_t admitted = 0;
  uint64_t sink = 0;
  uint64_t recent = 0;
  const bool ok = reader.LengthPrefixed(&terms.tenant) && reader.Le(4, &priority) &&
                  reader.Le(1, &flags) && GetDouble(reader, &terms.floor_fraction) &&
                  reader.Le(8, &quota) && reader.Le(1, &reason) && reader.Le(8, &admitted) &&
                  reader.Le(8, &sink) && reader.Le(8, &recent) && reader.done();
  if (!ok) return Bad("terms record is truncated or too long");
  terms.priority = static_cast<int32_t>(static_cast<uint32_t>(priority));
  if (terms.priority < kMinPriority || terms.priority > kMaxPriority || flags > 7 ||
      !(terms.floor_fraction > 0.0 && terms.floor_fraction <= 1.0) ||
      reason > static_cast<uint64_t>(ReclaimReason::kTarget) ||
      quota > static_cast<uint64_t>(INT64_MAX) || admitted > static_cast<uint64_t>(INT64_MAX) ||
      sink > static_cast<uint64_t>(INT32_MAX) || recent > static_cast<uint64_t>(INT32_MAX)) {
    return Bad("terms record holds a value out of range");
  }
  terms.auto_budget = (flags & 1) != 0;
  terms.preempt = (flags & 2) != 0;
  terms.protect_tail = (flags & 4) != 0;
  terms.quota_frames = static_cast<int64_t>(quota);
  terms.quota_reason = static_cast<ReclaimReason>(reason);
  terms.admitted = static_cast<int64_t>(admitted);
  terms.sink_pages = static_cast<int64_t>(sink);
  terms.recent_pages = static_cast<int64_t>(recent);
  return terms;
}

std::string EncodeShares(const SequencePressure& terms, int32_t layer, int32_t kv_groups) {
  std::string out;
  PutLe(out, static_cast<uint32_t>(kv_groups), 4);
  for (int32_t g = 0; g < kv_groups; ++g) {
    const size_t t = static_cast<size_t>(layer) * kv_groups + g;
    const std::vector<float> none;
    const std::vector<float>& shares = t < terms.shares.size() ? terms.shares[t] : none;
    PutLe(out, static_cast<uint32_t>(shares.size()), 4);
    for (const float share : shares) PutFloat(out, share);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> DecodeShares(absl::string_view bytes,
                                                             int32_t kv_groups, int64_t max_pages) {
  Reader reader(bytes);
  uint64_t groups = 0;
  if (!reader.Le(4, &groups) || groups != static_cast<uint64_t>(kv_groups)) {
    return Bad("shares record of another group count");
  }
  std::vector<std::vector<float>> shares(static_cast<size_t>(kv_groups));
  for (std::vector<float>& group : shares) {
    uint64_t count = 0;
    if (!GetCount(reader, 4, &count) || count > static_cast<uint64_t>(max_pages)) {
      return Bad("shares record is truncated or too long");
    }
    group.resize(static_cast<size_t>(count));
    for (float& share : group) {
      uint64_t bits = 0;
      reader.Le(4, &bits);
      const auto word = static_cast<uint32_t>(bits);
      std::memcpy(&share, &word, sizeof(share));
      if (!(share == kUnscored || (share >= 0.0f && share <= 1.0f))) {
        return Bad("shares record holds a share out of range");
      }
    }
  }
  if (!reader.done()) return Bad("shares record is too long");
  return shares;
}

std::string EncodeSwapped(const SwappedSnapshot& snapshot) {
  std::string out;
  out.push_back(1);  // record version
  PutLe(out, static_cast<uint64_t>(snapshot.length), 8);
  PutLe(out, static_cast<uint64_t>(snapshot.slot_count), 8);
  PutLengthPrefixed(out, snapshot.arena_name);
  PutLe(out, static_cast<uint32_t>(snapshot.slots.size()), 4);
  for (const std::vector<int32_t>& table : snapshot.slots) {
    PutLe(out, static_cast<uint32_t>(table.size()), 4);
    for (const int32_t slot : table) PutLe(out, static_cast<uint32_t>(slot), 4);
  }
  PutLe(out, static_cast<uint32_t>(snapshot.head_weights.size()), 4);
  for (const std::vector<double>& weights : snapshot.head_weights) {
    PutLe(out, static_cast<uint32_t>(weights.size()), 4);
    for (const double weight : weights) PutDouble(out, weight);
  }
  PutLe(out, static_cast<uint32_t>(snapshot.running_sums.size()), 4);
  for (const std::vector<float>& sum : snapshot.running_sums) {
    PutLe(out, static_cast<uint32_t>(sum.size()), 4);
    for (const float value : sum) PutFloat(out, value);
  }
  return out;
}

absl::StatusOr<SwappedSnapshot> DecodeSwapped(absl::string_view bytes) {
  if (bytes.empty() || bytes[0] != 1) return Bad("swapped record of an unknown version");
  Reader reader(bytes.substr(1));
  SwappedSnapshot snapshot;
  uint64_t length = 0;
  uint64_t slots = 0;
  uint64_t tables = 0;
  if (!reader.Le(8, &length) || !reader.Le(8, &slots) ||
      !reader.LengthPrefixed(&snapshot.arena_name) || !GetCount(reader, 4, &tables) ||
      length > static_cast<uint64_t>(INT64_MAX) || slots > static_cast<uint64_t>(INT64_MAX)) {
    return Bad("swapped record is truncated or out of range");
  }
  snapshot.length = static_cast<int64_t>(length);
  snapshot.slot_count = static_cast<int64_t>(slots);
  snapshot.slots.resize(static_cast<size_t>(tables));
  for (std::vector<int32_t>& table : snapshot.slots) {
    uint64_t pages = 0;
    if (!GetCount(reader, 4, &pages)) return Bad("swapped record is truncated");
    table.resize(static_cast<size_t>(pages));
    for (int32_t& slot : table) {
      uint64_t value = 0;
      reader.Le(4, &value);
      slot = static_cast<int32_t>(static_cast<uint32_t>(value));
    }
  }
  uint64_t layers = 0;
  if (!GetCount(reader, 4, &layers)) return Bad("swapped record is truncated");
  snapshot.head_weights.resize(static_cast<size_t>(layers));
  for (std::vector<double>& weights : snapshot.head_weights) {
    uint64_t count = 0;
    if (!GetCount(reader, 8, &count)) return Bad("swapped record is truncated");
    weights.resize(static_cast<size_t>(count));
    for (double& weight : weights) GetDouble(reader, &weight);
  }
  uint64_t sums = 0;
  if (!GetCount(reader, 4, &sums)) return Bad("swapped record is truncated");
  snapshot.running_sums.resize(static_cast<size_t>(sums));
  for (std::vector<float>& sum : snapshot.running_sums) {
    uint64_t count = 0;
    if (!GetCount(reader, 4, &count)) return Bad("swapped record is truncated");
    sum.resize(static_cast<size_t>(count));
    for (float& value : sum) {
      uint64_t bits = 0;
      reader.Le(4, &bits);
      const auto word = static_cast<uint32_t>(bits);
      std::memcpy(&value, &word, sizeof(value));
    }
  }
  if (!reader.done()) return Bad("swapped record is too long");
  return snapshot;
}

}  // namespace entrokv::store
