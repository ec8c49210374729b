// A decision runs in three steps so that a bad request never half-applies:
//  1. resolve: ids, policy, budget, each layer's statistic (bytes, shared memory or a device
//     buffer, which is mapped here) checked against the model and the sequence's length;
//  2. score: the core's fused CPU scorer per layer (the same decisions, bit for bit, as the
//     reference DecideLayer; it also rejects NaN/negative values);
//  3. apply: CacheState::ApplyDecisions, every layer at once (all or nothing under the pool's
//     lock), then the weights cache and the metrics.
// Only step 3 changes state. A concurrent AppendTokens or CloseSequence on the same sequence
// between 2 and 3 fails the whole apply (FAILED_PRECONDITION on the length, NOT_FOUND), with
// nothing applied.
//
// Two additions run inside step 2. A chunk of a chunked prefill (LayerStatistic.accumulate) is
// added to the layer's running sum first, and the sum is what the layer is scored on; the new
// sum goes to the pool with the decision in step 3. A request with degrade_on_deadline that
// runs out of time decides its remaining layers by position (the streaming policy's sinks and
// newest pages, the same quota): "out of time" is the estimate (the recent decisions' seconds
// per statistic value times this layer's values) not fitting before the deadline less a
// reserve for the reply, or a layer's scoring still running at that moment (it is stopped
// between its KV groups, as a cancelled call's is).
#include "service/decider.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/scoring/cover_mix.h"
#include "core/scoring/decision.h"
#include "core/scoring/fused_scorer.h"
#include "core/scoring/group_quotas.h"
#include "core/scoring/key_scores.h"
#include "core/scoring/layer_quotas.h"
#include "core/scoring/statistic.h"
#include "core/util/status_macros.h"
#include "wire/checks.h"
#include "wire/convert.h"
#include "wire/pressure.h"
#include "wire/resolve.h"

namespace entrokv::service {
namespace {

using wire::Annotate;
using wire::ResolvedBudget;
using wire::ResolvedPolicy;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One layer after step 1, and its results after steps 2 and 3.
struct LayerWork {
  int layer = 0;
  std::string field;                  // "layers[i]" for messages
  std::optional<StatisticView> view;  // absent for policies without a statistic
  // A shared-memory statistic is checked in step 1 but copied only just before its layer is
  // scored (into the job's one buffer), so a job holds one layer's copy at a time. `segment` is
  // the held segment it was checked in, or null when it must be opened again for the copy.
  const v1::SharedMemoryRegion* shm = nullptr;
  const ShmSegment* segment = nullptr;
  std::string shm_field;
  // A device-buffer statistic: mapped and range-checked in step 1, copied to the host like a
  // shared-memory one just before its layer is scored, unless the CUDA scorer scores the pool on
  // the statistic's device: it then reads device->device_data() in place.
  std::optional<DeviceStatistic> device;
  // A keys statistic: the daemon scores the keys in the sequence's frames just before the layer
  // is scored, into key_rows [heads][tokens].
  struct Keys {
    std::optional<KeyScore> group_score;  // keydiff, norm: each group's scores on its heads
    // Expected attention: each head's own row, from the query statistics the worker sent.
    std::vector<float> query_mean;        // [heads][head_dim]
    std::vector<float> query_covariance;  // [heads][head_dim][head_dim], or empty
    int factor_rank = 0;            // > 0: query_covariance holds factors [heads][rank][head_dim]
    DType dtype = DType::kFloat32;  // the keys' element type in the frames
    // A keys mix: the keys' share of each head's mix with the rows sent, and how the two
    // combine (MixRows).
    std::optional<double> mix_weight;
    MixRule mix_rule = MixRule::kAverage;
    // A keys mix that orders pages instead (KEYS_MIX_RULE_COVER, CoverThenFill).
    std::optional<CoverMix> cover;
  };
  std::optional<Keys> keys;
  std::vector<float> key_rows;
  DType dtype = DType::kFloat32;
  int query_heads = 0;
  std::optional<std::vector<double>> cached_weights;
  std::vector<uint8_t> live_pages;  // empty: every page held (see CacheState::LivePages)
  int64_t quota_pages = 0;
  bool accumulate = false;         // the statistic is a chunk added to the running sum
  std::vector<float> running_sum;  // with accumulate: the sum scored, kept with the decision
  bool degraded = false;           // decided by position: out of time
  LayerDecision decision;
};

// The policy a degraded layer is decided by: sinks and the newest pages, no statistic.
const Policy& DegradedPolicy() {
  static const Policy* const policy = *FindPolicy("streaming");
  return *policy;
}

// The shared-memory segments a job's layers name, each opened and checked once and held open
// until the job ends, so that a layer's copy reads the very object its checks passed (a worker
// usually names one segment for all its layers). Past kHeld distinct names, a layer's segment is
// checked now and opened again for its copy, which bounds the descriptors a job holds.
class HeldSegments {
 public:
  HeldSegments() { held_.reserve(kHeld); }

  // Checks `length` bytes at `offset` of segment `name` (errors name `field`). Returns the held
  // segment, or null when it was checked but is not held. The pointer lives as long as this.
  absl::StatusOr<const ShmSegment*> Check(const ShmReader& reader, absl::string_view field,
                                          absl::string_view name, uint64_t offset,
                                          uint64_t length) {
    for (const ShmSegment& segment : held_) {
      if (segment.name() == name) {
        RETURN_IF_ERROR(segment.CheckRange(field, offset, length));
        return &segment;
      }
    }
    ASSIGN_OR_RETURN(ShmSegment segment, reader.Open(field, name));
    RETURN_IF_ERROR(segment.CheckRange(field, offset, length));
    if (held_.size() == kHeld) return nullptr;
    held_.push_back(std::move(segment));
    return &held_.back();
  }

 private:
  static constexpr size_t kHeld = 8;
  std::vector<ShmSegment> held_;  // never grows past its reserved kHeld: pointers stay valid
};

// A layer's shared-memory statistic into `out` (its length_bytes bytes), read with pread from
// the segment its checks passed, or from the segment opened and checked again when not held.
absl::Status CopyStatistic(const ShmReader& reader, const LayerWork& work, char* out) {
  const v1::SharedMemoryRegion& ref = *work.shm;
  if (work.segment != nullptr) {
    return work.segment->Read(work.shm_field, ref.offset_bytes(), ref.length_bytes(), out);
  }
  ASSIGN_OR_RETURN(const ShmSegment segment, reader.Open(work.shm_field, ref.segment()));
  RETURN_IF_ERROR(segment.CheckRange(work.shm_field, ref.offset_bytes(), ref.length_bytes()));
  return segment.Read(work.shm_field, ref.offset_bytes(), ref.length_bytes(), out);
}

// The statistic of a layer whose values are not in the request (shared memory or a device
// buffer), in host memory: `out` is resized to its bytes and filled. The one place a host
// scorer gets a device statistic's bytes (one device-to-host copy).
absl::Status HostStatistic(const ShmReader& reader, const LayerWork& work, std::vector<char>& out) {
  if (work.device.has_value()) {
    out.resize(work.device->length());
    return work.device->CopyToHost(out.data());
  }
  out.resize(work.shm->length_bytes());
  return CopyStatistic(reader, work, out.data());
}

}  // namespace

// The query heads and KV groups a decision scores: the whole model, or one rank's share of a
// group-layout tensor-parallel model, which that rank decides alone (its groups' frames are
// its own; the other groups are left as they are).
struct Shard {
  int rank = 0;  // whose arena's device scores it
  int first_head = 0;
  int heads = 0;
  int first_group = 0;
  int groups = 0;
  std::string owner;  // "the model" or "rank r's share", for messages
  [[nodiscard]] bool partial(const ModelGeometry& geometry) const {
    return groups != geometry.kv_groups;
  }
};

struct Decider::Job {
  std::string sequence_id;
  Shard shard;
  ResolvedPolicy policy;
  SelectionScope scope = SelectionScope::kGroup;
  int64_t tokens = 0;
  HeldSegments segments;  // declared before `layers`, whose LayerWork::segment point into it
  std::vector<LayerWork> layers;
  // The request's deadline (the call's, or answer_within_ms after receipt, the earlier), and
  // which of the two it is; what it allows (degrade_on_deadline); the time kept back for
  // degrading the rest and replying.
  std::optional<Clock::time_point> deadline;
  bool deadline_is_answer_within = false;
  bool degrade = false;
  Clock::duration reserve{};
  std::optional<double> auto_floor;  // budget.auto_budget: the pool's quota decides
  std::optional<double> mass_floor;  // allocator "mass": the layers' quotas move (this floor)
  PressureReport pressure;           // after the decision
};

namespace {

// What step 1 reads a device-buffer statistic with, and for whom (its mapping is held for the
// sequence until it is closed).
struct Readers {
  DeviceReader& device;
  absl::string_view model_id;
  absl::string_view sequence_id;
};

// A keys statistic's rows: each of the shard's KV groups' keys read from the sequence's frames
// and scored, the group's scores given to each of its query heads (expected attention: each
// head's own row), averaged with the rows sent in work.view for a keys mix; work.view then reads
// them. CANCELLED once `cancelled` says so, polled per head.
absl::Status ScoreKeysOf(const CacheState& state, const std::string& sequence_id,
                         const Shard& shard, int64_t tokens, const PolicyOptions& options,
                         ServiceMetrics& metrics, const std::function<bool()>& cancelled,
                         LayerWork& work) {
  const int per_group = shard.heads / shard.groups;
  const int head_dim = state.geometry().head_dim;
  const LayerWork::Keys& request = *work.keys;
  work.key_rows.assign(static_cast<size_t>(shard.heads * tokens), 0.0F);
  std::vector<float> scores(static_cast<size_t>(tokens));
  for (int g = 0; g < shard.groups; ++g) {
    absl::StatusOr<CacheState::KeyRows> keys =
        state.ReadKeys(sequence_id, work.layer, shard.first_group + g, request.dtype);
    if (!keys.ok()) return Annotate(keys.status(), absl::StrCat(work.field, ".statistic"));
    if (request.group_score.has_value()) {
      ScoreKeys(*request.group_score, keys->keys, head_dim, keys->present, scores);
    }
    for (int head = g * per_group; head < (g + 1) * per_group; ++head) {
      const std::span<float> row(work.key_rows.data() + head * tokens, static_cast<size_t>(tokens));
      if (request.group_score.has_value()) {
        std::copy(scores.begin(), scores.end(), row.begin());
        continue;
      }
      // A head's covariance term is head_dim^2 per token: a caller that gave up frees the
      // thread within one head's work rather than after the layer's.
      if (cancelled()) {
        return absl::CancelledError(absl::StrCat(
            "call cancelled or past its deadline while ", work.field,
            "'s expected attention was scored (head ", head, "); nothing was applied"));
      }
      const std::span<const float> mean(request.query_mean);
      const std::span<const float> covariance(request.query_covariance);
      const auto d = static_cast<size_t>(head_dim);
      const size_t matrix =
          (request.factor_rank > 0 ? static_cast<size_t>(request.factor_rank) : d) * d;
      ScoreExpectedAttention(
          keys->keys, head_dim, keys->present, mean.subspan(head * d, d),
          covariance.empty() ? covariance : covariance.subspan(head * matrix, matrix), row,
          request.factor_rank);
    }
    metrics.AddStatsBytes(StatSource::kPoolKeys,
                          static_cast<int64_t>(keys->keys.size()) * DTypeBytes(request.dtype));
  }
  if (request.mix_weight.has_value() || request.cover.has_value()) {
    // The rows sent are the view until now: each head's mix of the two becomes it.
    const absl::Status mixed =
        request.cover.has_value()
            ? CoverThenFill(*work.view, *request.cover, per_group, options.page_size,
                            CoverSpanOf(options, tokens), work.key_rows)
            : MixRows(*work.view, *request.mix_weight, request.mix_rule, work.key_rows);
    if (!mixed.ok()) return Annotate(mixed, work.field);  // as the scorer names a bad value sent
  }
  ASSIGN_OR_RETURN(
      work.view, StatisticView::Create(work.key_rows.data(), DType::kFloat32, shard.heads, tokens));
  return absl::OkStatus();
}

// Rows [first_head, first_head + heads) of a [query_heads][tokens] matrix (a running sum).
std::vector<float> HeadRows(const std::vector<float>& all, int query_heads, const Shard& shard) {
  const size_t tokens = all.size() / static_cast<size_t>(query_heads);
  const auto first = all.begin() + static_cast<ptrdiff_t>(tokens * shard.first_head);
  return {first, first + static_cast<ptrdiff_t>(tokens * shard.heads)};
}

// What a request with `rank` (nullopt: unset) decides. A group-layout tensor-parallel model
// decides each rank's share alone; everything else decides the whole model (a layer-layout
// model's ranks are gathered before this). INVALID_ARGUMENT naming `rank` outside [0, t).
absl::StatusOr<Shard> ShardOf(const Model& model, std::optional<int> rank) {
  const CacheState& state = model.state();
  const ModelGeometry& geometry = state.geometry();
  const int ranks = state.ranks();
  Shard whole{.heads = geometry.query_heads, .groups = geometry.kv_groups, .owner = "the model"};
  if (!rank.has_value()) return whole;
  RETURN_IF_ERROR(model.CheckRank(*rank));
  if (ranks == 1 || state.layout() != FrameLayout::kGroup) return whole;
  const int heads = geometry.query_heads / ranks;
  const int groups = geometry.kv_groups / ranks;
  return Shard{.rank = *rank,
               .first_head = *rank * heads,
               .heads = heads,
               .first_group = *rank * groups,
               .groups = groups,
               .owner = absl::StrCat("rank ", *rank, "'s share")};
}

// A keys statistic's score and, for expected attention, the query statistics of `heads` heads:
// INVALID_ARGUMENT naming the field for an unset score, sizes that are not the heads', values
// that are not finite, or query statistics with another score.
absl::StatusOr<LayerWork::Keys> ResolveKeys(const std::string& field, const v1::KeyStatistic& keys,
                                            int heads, int head_dim) {
  LayerWork::Keys out;
  switch (keys.score()) {
    case v1::KEY_SCORE_KEYDIFF:
      out.group_score = KeyScore::kKeyDiff;
      break;
    case v1::KEY_SCORE_NORM:
      out.group_score = KeyScore::kNorm;
      break;
    case v1::KEY_SCORE_EXPECTED_ATTENTION:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          ".score: must be KEY_SCORE_KEYDIFF, KEY_SCORE_NORM or KEY_SCORE_EXPECTED_ATTENTION, got ",
          keys.score()));
  }
  if (out.group_score.has_value()) {
    for (const auto& [name, values] :
         {std::pair{"query_mean", &keys.query_mean()},
          std::pair{"query_covariance", &keys.query_covariance()},
          std::pair{"query_covariance_factor", &keys.query_covariance_factor()}}) {
      if (!values->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".", name, ": only for KEY_SCORE_EXPECTED_ATTENTION, got ",
                         values->size(), " values with ", v1::KeyScore_Name(keys.score())));
      }
    }
    return out;
  }
  const int64_t mean_size = int64_t{heads} * head_dim;
  if (keys.query_mean_size() != mean_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".query_mean: ", keys.query_mean_size(),
                                                   " values, expected ", heads, " heads x ",
                                                   head_dim, " (head_dim)"));
  }
  if (keys.query_covariance_size() != 0 && keys.query_covariance_size() != mean_size * head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".query_covariance: ", keys.query_covariance_size(),
                     " values, expected none or ", heads, " heads x ", head_dim, " x ", head_dim));
  }
  const int64_t factor_size = keys.query_covariance_factor_size();
  if (factor_size != 0) {
    if (keys.query_covariance_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".query_covariance_factor: not with query_covariance (send one of the two)"));
    }
    if (factor_size % mean_size != 0 || factor_size / mean_size > head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".query_covariance_factor: ", factor_size, " values, expected ", heads,
          " heads x rank x ", head_dim, " (head_dim), rank in [1, ", head_dim, "]"));
    }
    out.factor_rank = static_cast<int>(factor_size / mean_size);
  }
  for (const auto& [name, values] :
       {std::pair{"query_mean", &keys.query_mean()},
        std::pair{"query_covariance", &keys.query_covariance()},
        std::pair{"query_covariance_factor", &keys.query_covariance_factor()}}) {
    for (int i = 0; i < values->size(); ++i) {
      if (!std::isfinite(values->Get(i))) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".", name, "[", i, "]: must be finite, got ", values->Get(i)));
      }
    }
  }
  out.query_mean.assign(keys.query_mean().begin(), keys.query_mean().end());
  const auto& covariance =
      out.factor_rank > 0 ? keys.query_covariance_factor() : keys.query_covariance();
  out.query_covariance.assign(covariance.begin(), covariance.end());
  return out;
}

// A keys mix (Statistic.keys_mix) for `heads` heads: the keys statistic as ResolveKeys checks
// it, the keys' element type, their weight and the rule; INVALID_ARGUMENT naming the field
// otherwise, or with accumulate (a chunk's column sums are not one row to average).
absl::StatusOr<LayerWork::Keys> ResolveKeysMix(const std::string& field, const v1::KeysMix& mix,
                                               int heads, int head_dim, bool accumulate) {
  const std::string at = absl::StrCat(field, ".keys_mix");
  if (accumulate) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, ": not with accumulate (a chunk's column sums are added, not mixed)"));
  }
  ASSIGN_OR_RETURN(LayerWork::Keys keys,
                   ResolveKeys(absl::StrCat(at, ".keys"), mix.keys(), heads, head_dim));
  ASSIGN_OR_RETURN(keys.dtype, wire::ToDType(absl::StrCat(at, ".keys_dtype"), mix.keys_dtype()));
  const bool cover = mix.rule() == v1::KEYS_MIX_RULE_COVER;
  if (cover) {
    if (mix.keys_weight() != 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".keys_weight: not with KEYS_MIX_RULE_COVER (it orders pages, it adds no scores)"));
    }
    CoverMix parameters;
    if (mix.cover_mass() != 0.0) parameters.mass = mix.cover_mass();
    if (mix.cover_question_kernel() != 0) parameters.question_kernel = mix.cover_question_kernel();
    if (mix.cover_keys_kernel() != 0) parameters.keys_kernel = mix.cover_keys_kernel();
    parameters.question_forward = mix.cover_question_forward();
    parameters.rank_sinks = mix.cover_rank_sinks();
    RETURN_IF_ERROR(ValidateCoverMix(absl::StrCat(at, ".cover_"), parameters));
    keys.cover = parameters;
    return keys;
  }
  if (mix.cover_mass() != 0.0 || mix.cover_question_kernel() != 0 || mix.cover_keys_kernel() != 0 ||
      mix.cover_question_forward() || mix.cover_rank_sinks()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at,
                     ".cover_mass, cover_question_kernel, cover_keys_kernel, "
                     "cover_question_forward, cover_rank_sinks: only with KEYS_MIX_RULE_COVER"));
  }
  const double weight = mix.keys_weight();
  if (weight == 0.0) {
    keys.mix_weight = 0.5;
  } else if (!(weight > 0.0 && weight < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, ".keys_weight: must be in (0, 1) (unset: 0.5), got ", weight));
  } else {
    keys.mix_weight = weight;
  }
  switch (mix.rule()) {
    case v1::KEYS_MIX_RULE_UNSPECIFIED:
    case v1::KEYS_MIX_RULE_AVERAGE:
      keys.mix_rule = MixRule::kAverage;
      break;
    case v1::KEYS_MIX_RULE_MAX:
      keys.mix_rule = MixRule::kMax;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          at,
          ".rule: must be KEYS_MIX_RULE_AVERAGE, KEYS_MIX_RULE_MAX or KEYS_MIX_RULE_COVER (unset: "
          "average), got ",
          mix.rule()));
  }
  return keys;
}

// Step 1 for one layer's statistic.
absl::Status ResolveStatistic(const v1::LayerStatistic& input, const Shard& shard, int head_dim,
                              int64_t sequence_tokens, const Policy& policy, const ShmReader& shm,
                              HeldSegments& segments, const Readers& readers,
                              ServiceMetrics& metrics, LayerWork& work) {
  const std::string field = absl::StrCat(work.field, ".statistic");
  const v1::Statistic& stat = input.statistic();
  const bool present = input.has_statistic() && stat.source_case() != v1::Statistic::SOURCE_NOT_SET;
  if (input.accumulate()) {
    if (!present) {
      return absl::InvalidArgumentError(
          absl::StrCat(work.field, ".accumulate: needs a statistic (a chunk's column sums)"));
    }
    if (stat.kind() != v1::STATISTIC_KIND_ACCUMULATED) {
      return absl::InvalidArgumentError(absl::StrCat(
          work.field, ".accumulate: the statistic's kind must be STATISTIC_KIND_ACCUMULATED, got ",
          v1::StatisticKind_Name(stat.kind()).empty() ? absl::StrCat(stat.kind())
                                                      : v1::StatisticKind_Name(stat.kind())));
    }
    work.accumulate = true;
  }
  if (!present) {
    if (policy.needs_statistic()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": must carry data, shared_memory or device_buffer for policy ", policy.name()));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const DType dtype, wire::ToDType(absl::StrCat(field, ".dtype"), stat.dtype()));
  if (stat.query_heads() != shard.heads) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".query_heads: ", stat.query_heads(),
                                                   ", ", shard.owner, " has ", shard.heads));
  }
  RETURN_IF_ERROR(wire::ValidateTokenCount(absl::StrCat(field, ".tokens"), stat.tokens(), 1));
  if (stat.tokens() != sequence_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(field, ".tokens: ", stat.tokens(),
                                                      " but the sequence holds ", sequence_tokens));
  }
  const uint64_t expected =
      static_cast<uint64_t>(stat.query_heads()) * stat.tokens() * DTypeBytes(dtype);
  const void* data = nullptr;
  if (stat.source_case() == v1::Statistic::kKeys) {
    if (stat.has_keys_mix()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".keys_mix: mixes the keys' scores with values sent, and keys sends none"));
    }
    if (work.accumulate) {
      return absl::InvalidArgumentError(absl::StrCat(
          work.field, ".accumulate: not with a keys statistic (the keys are read whole)"));
    }
    ASSIGN_OR_RETURN(work.keys,
                     ResolveKeys(absl::StrCat(field, ".keys"), stat.keys(), shard.heads, head_dim));
    work.keys->dtype = dtype;
    work.dtype = dtype;
    work.query_heads = stat.query_heads();
    return absl::OkStatus();
  }
  if (stat.has_keys_mix()) {
    ASSIGN_OR_RETURN(
        work.keys, ResolveKeysMix(field, stat.keys_mix(), shard.heads, head_dim, work.accumulate));
  }
  if (stat.source_case() == v1::Statistic::kData) {
    if (stat.data().size() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".data: ", stat.data().size(), " bytes, expected ", expected));
    }
    data = stat.data().data();
    metrics.AddStatsBytes(StatSource::kBytes, static_cast<int64_t>(expected));
  } else if (stat.source_case() == v1::Statistic::kDeviceBuffer) {
    ASSIGN_OR_RETURN(
        work.device,
        readers.device.Acquire(absl::StrCat(field, ".device_buffer"), stat.device_buffer(),
                               expected, DTypeBytes(dtype), readers.model_id, readers.sequence_id));
    work.dtype = dtype;
    work.query_heads = stat.query_heads();
    return absl::OkStatus();
  } else {
    const v1::SharedMemoryRegion& ref = stat.shared_memory();
    const std::string shm_field = absl::StrCat(field, ".shared_memory");
    if (ref.length_bytes() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(shm_field, ".length_bytes: ", ref.length_bytes(), ", expected ", expected));
    }
    if (ref.offset_bytes() % DTypeBytes(dtype) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          shm_field, ".offset_bytes: ", ref.offset_bytes(), " is not element-aligned"));
    }
    ASSIGN_OR_RETURN(work.segment, segments.Check(shm, shm_field, ref.segment(), ref.offset_bytes(),
                                                  ref.length_bytes()));
    work.shm = &ref;
    work.shm_field = shm_field;
    work.dtype = dtype;
    work.query_heads = stat.query_heads();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(work.view,
                   StatisticView::Create(data, dtype, stat.query_heads(), stat.tokens()));
  return absl::OkStatus();
}

// Evicted-page counts go to reason="budget" for positional policies, "score" otherwise. In the
// LAYER layout the group scope's union is the shadow: what per-group selection keeps or, in
// layer scope, would have kept.
void RecordDecision(Model& model, const Policy& policy, FrameLayout layout,
                    const v1::LayerDecision& out) {
  PoolMetrics& metrics = model.metrics();
  const PoolMetrics::PolicySeries& series = metrics.policy(policy.name());
  series.decisions->Increment();
  int64_t evicted = 0;
  int64_t kept = 0;
  for (const v1::GroupDecision& group : out.groups()) {
    evicted += group.evicted_pages_size();
    kept += group.kept_pages_size();
    if (group.has_shadow_uor()) metrics.union_overhead_ratio->Observe(group.shadow_uor());
    if (group.has_disagreement()) metrics.group_disagreement->Observe(group.disagreement());
    if (group.has_retained_mass()) metrics.retained_mass_ratio->Observe(group.retained_mass());
  }
  (policy.needs_statistic() ? series.evicted_score : series.evicted_budget)
      ->Increment(static_cast<double>(evicted));
  series.retained->Increment(static_cast<double>(kept));
  if (layout != FrameLayout::kLayer) return;
  metrics.page_union_ratio->Observe(out.page_union_ratio());
  const int64_t quota = std::min(out.quota_pages(), out.page_count());
  if (quota > 0) {
    metrics.group_scope_page_union_ratio->Observe(
        static_cast<double>(out.group_scope_union_pages()) / static_cast<double>(quota));
  }
  metrics.layer_scope_frames_saved->Increment(
      static_cast<double>(std::max<int64_t>(0, out.group_scope_union_pages() - out.union_pages())));
}

}  // namespace

namespace {

// Budget allocator "mass": the layers scored (every page kept and ranked) share the pages the
// uniform plan gives them (MoveLayerQuotas); a degraded layer keeps its uniform quota, decided
// by position.
void MoveLayerQuotas(std::vector<LayerWork>& layers, const Shard& shard, int64_t tokens,
                     SelectionScope scope, const PolicyOptions& options, double floor) {
  std::vector<LayerRequest> requests;
  std::vector<LayerDecision*> decisions;
  int64_t total = 0;
  for (LayerWork& work : layers) {
    if (work.degraded) continue;
    LayerRequest request =
        LayerRequestFor(std::nullopt, shard.heads, shard.groups, tokens, work.quota_pages);
    request.scope = scope;
    request.live_pages = work.live_pages;
    requests.push_back(std::move(request));
    decisions.push_back(&work.decision);
    total += work.quota_pages;
  }
  entrokv::MoveLayerQuotas(options, requests, decisions, total, floor);
}

}  // namespace

void Decider::SetBeforeApplyHookForTest(BeforeApplyHook hook) {
  absl::MutexLock lock(&hook_mu_);
  before_apply_hook_ = std::move(hook);
}

double Decider::SecondsPerValue() const {
  absl::MutexLock lock(&estimate_mu_);
  return seconds_per_value_;
}

void Decider::SetSecondsPerValueForTest(double seconds) {
  absl::MutexLock lock(&estimate_mu_);
  seconds_per_value_ = seconds;
}

void Decider::RecordScoringTime(int64_t values, double seconds) const {
  if (values <= 0) return;
  const double sample = seconds / static_cast<double>(values);
  absl::MutexLock lock(&estimate_mu_);
  // Recent decisions weigh most: the machine's load, not the history, decides the next one.
  seconds_per_value_ = seconds_per_value_ == 0.0 ? sample : 0.7 * seconds_per_value_ + 0.3 * sample;
}

absl::Status Decider::Run(Model& model, Job& job, const std::function<bool()>& cancelled,
                          std::vector<v1::LayerDecision*>& outputs) const {
  const ModelGeometry& geometry = model.state().geometry();
  // Step 2: score every layer. One scorer per job: it is not thread-safe, and its scratch
  // buffers are reused across the job's layers. A fresh copy buffer per job, zero-filled, was
  // measured no slower than one kept across jobs (docs/performance.md, "The service path").
  FusedScorer scorer(job.policy.options);
  // --scorer: a pool the CUDA scorer serves is scored on its arena's device (a rank's share on
  // its rank's; a host pool's on device 0), with the same decisions; degraded layers stay on
  // the CPU (no statistic).
  const ArenaInfo arena = model.state().arena(job.shard.rank);
  const bool on_device = device_scorers_ != nullptr && device_scorers_->ScoresPool(arena.backend);
  const int scoring_device = arena.backend == Backend::kCuda ? arena.device : 0;
  std::vector<char> copied;  // the shared-memory statistic of the layer being scored
  // The moment a layer must be done by: the deadline less the reserve when the rest may be
  // degraded; answer_within_ms itself when it may not. A call's own deadline without
  // degrade_on_deadline is left to `cancelled`, as it always was.
  std::optional<Clock::time_point> finish_by;
  const Shard& shard = job.shard;
  const int64_t values = int64_t{shard.heads} * job.tokens;  // of one layer
  const auto estimate = [this](int64_t n) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(SecondsPerValue() * static_cast<double>(n)));
  };
  if (job.deadline.has_value() && job.degrade) {
    // Scoring stops only between KV groups: one group's work is kept back too.
    finish_by = *job.deadline - job.reserve - estimate(values / shard.groups);
  } else if (job.deadline.has_value() && job.deadline_is_answer_within) {
    finish_by = *job.deadline;
  }
  const auto out_of_time = [&finish_by] {
    return finish_by.has_value() && Clock::now() >= *finish_by;
  };
  const auto past_budget = [&job](absl::string_view when) {
    return absl::DeadlineExceededError(
        absl::StrCat(job.deadline_is_answer_within ? "answer_within_ms" : "deadline", ": passed ",
                     when, "; nothing was applied (degrade_on_deadline answers in time instead)"));
  };
  bool degrading = false;  // from this layer on, decided by position
  for (size_t scored = 0; scored < job.layers.size(); ++scored) {
    LayerWork& work = job.layers[scored];
    // A call whose client gave up (or whose deadline passed) frees its worker before the next
    // layer rather than after the whole job.
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat("call cancelled or past its deadline after ", scored,
                                               " of ", job.layers.size(),
                                               " layers were scored; nothing was applied"));
    }
    if (job.degrade && finish_by.has_value() && !degrading) {
      degrading = Clock::now() + estimate(values) > *finish_by;
    }
    const auto start = Clock::now();
    // A degraded layer reads no statistic, unless it is a chunk: its columns still go into the
    // running sum, so the next decision of the layer scores every chunk.
    // A device_buffer statistic on the device that scores the pool is read there in place.
    // A keys mix reads the rows sent on the host.
    const bool in_place = on_device && work.device.has_value() && !work.accumulate &&
                          !work.keys.has_value() && work.device->device() == scoring_device;
    if (in_place && !degrading) {
      ASSIGN_OR_RETURN(work.view, StatisticView::Create(work.device->device_data(), work.dtype,
                                                        work.query_heads, job.tokens));
      metrics_->AddStatsBytes(StatSource::kDeviceBuffer,
                              static_cast<int64_t>(work.device->length()));
    } else if ((work.shm != nullptr || work.device.has_value()) &&
               (!degrading || work.accumulate)) {
      RETURN_IF_ERROR(HostStatistic(*shm_, work, copied));
      ASSIGN_OR_RETURN(work.view, StatisticView::Create(copied.data(), work.dtype, work.query_heads,
                                                        job.tokens));
      metrics_->AddStatsBytes(
          work.device.has_value() ? StatSource::kDeviceBuffer : StatSource::kSharedMemory,
          static_cast<int64_t>(copied.size()));
      metrics_->ObservePhase(Phase::kDecode, SecondsSince(start));
    }
    // The keys are scored once the rows sent are on the host (a keys mix averages the two).
    if (work.keys.has_value() && !degrading) {
      RETURN_IF_ERROR(ScoreKeysOf(model.state(), job.sequence_id, shard, job.tokens,
                                  job.policy.options, *metrics_, cancelled, work));
    }
    if (work.accumulate) {
      absl::StatusOr<std::vector<float>> before =
          model.state().RunningSum(job.sequence_id, work.layer);
      if (!before.ok()) return Annotate(before.status(), work.field);
      if (shard.partial(geometry)) *before = HeadRows(*before, geometry.query_heads, shard);
      absl::StatusOr<std::vector<float>> sum = AddChunk(*work.view, *before);
      if (!sum.ok()) return Annotate(sum.status(), work.field);
      work.running_sum = *std::move(sum);
      ASSIGN_OR_RETURN(work.view, StatisticView::Create(work.running_sum.data(), DType::kFloat32,
                                                        shard.heads, job.tokens));
    }
    // A decision after earlier ones selects among the pages still held: an evicted page is
    // never kept again, so each group keeps exactly min(K, live pages).
    absl::StatusOr<std::vector<uint8_t>> live =
        model.state().LivePages(job.sequence_id, work.layer);
    if (!live.ok()) return Annotate(live.status(), work.field);
    work.live_pages = *std::move(live);
    if (shard.partial(geometry) && !work.live_pages.empty()) {
      // Group-major: the shard's groups are one contiguous run.
      const auto pages = static_cast<ptrdiff_t>(work.live_pages.size()) / geometry.kv_groups;
      const auto first = work.live_pages.begin() + pages * shard.first_group;
      work.live_pages = std::vector<uint8_t>(first, first + pages * shard.groups);
    }
    if (!degrading) {
      // A server-chosen budget and the "mass" allocator rank every page here and choose the
      // quota later.
      LayerRequest request =
          LayerRequestFor(work.view, shard.heads, shard.groups, job.tokens, work.quota_pages);
      request.scope = job.scope;
      if (job.auto_floor.has_value() || job.mass_floor.has_value()) {
        RankEveryPage(geometry.page_size, &request);
      }
      // Polled between the layer's groups too: a call that gave up, or a layer still running at
      // the moment it must be done by, stops there.
      request.cancelled = [&cancelled, &out_of_time] { return cancelled() || out_of_time(); };
      if (work.cached_weights.has_value()) request.cached_weights = *work.cached_weights;
      request.live_pages = work.live_pages;
      const auto score_start = Clock::now();
      absl::StatusOr<LayerDecision> decision =
          in_place    ? device_scorers_->DecideLayerInPlace(scoring_device, *job.policy.policy,
                                                            job.policy.options, request)
          : on_device ? device_scorers_->DecideLayer(scoring_device, *job.policy.policy,
                                                     job.policy.options, request)
                      : scorer.DecideLayer(*job.policy.policy, request);
      metrics_->ObservePhase(Phase::kScore, SecondsSince(score_start));
      if (absl::IsCancelled(decision.status())) {
        if (cancelled()) {
          return absl::CancelledError(
              absl::StrCat("call cancelled or past its deadline: ", work.field, ": ",
                           decision.status().message(), "; nothing was applied"));
        }
        if (!job.degrade) {
          return past_budget(absl::StrCat("while ", work.field, " was scored (",
                                          decision.status().message(), ")"));
        }
        degrading = true;  // this layer ran late: it and the rest are decided by position
      } else {
        if (!decision.ok()) return Annotate(decision.status(), work.field);
        work.decision = *std::move(decision);
        RecordScoringTime(values, SecondsSince(start));
      }
    }
    if (degrading) {
      LayerRequest request =
          LayerRequestFor(std::nullopt, shard.heads, shard.groups, job.tokens, work.quota_pages);
      request.scope = job.scope;
      request.measure = false;
      request.live_pages = work.live_pages;
      // By position: no page is ranked, so the groups keep fixed quotas.
      PolicyOptions by_position = job.policy.options;
      by_position.group_floor = 1.0;
      absl::StatusOr<LayerDecision> decision =
          entrokv::DecideLayer(DegradedPolicy(), by_position, request);
      if (!decision.ok()) return Annotate(decision.status(), work.field);
      work.decision = *std::move(decision);
      work.degraded = true;
    }
    if (work.shm != nullptr || work.device.has_value()) work.view.reset();  // into `copied`
  }
  if (job.mass_floor.has_value()) {
    MoveLayerQuotas(job.layers, shard, job.tokens, job.scope, job.policy.options, *job.mass_floor);
  }
  BeforeApplyHook hook;
  {
    absl::MutexLock lock(&hook_mu_);
    hook = before_apply_hook_;
  }
  if (hook) hook(cancelled);
  if (cancelled()) return absl::CancelledError("call cancelled before the decision was applied");
  if (!job.degrade && out_of_time()) return past_budget("before the decision was applied");
  // Step 3: apply every layer at once, all or nothing under the pool's lock: a racing
  // AppendTokens or CloseSequence then lands wholly before (nothing applied) or after (every
  // layer applied and reported), never between two layers. Chunks' running sums go with it.
  auto start = Clock::now();
  absl::StatusOr<std::vector<ApplyResult>> applied =
      job.auto_floor.has_value() ? ApplyAuto(model, job) : ApplyFixed(model, job);
  metrics_->ObservePhase(Phase::kApply, SecondsSince(start));
  if (!applied.ok()) return applied.status();

  for (size_t i = 0; i < job.layers.size(); ++i) {
    LayerWork& work = job.layers[i];
    const ApplyResult& result = (*applied)[i];
    const Policy& decided_by = work.degraded ? DegradedPolicy() : *job.policy.policy;
    start = Clock::now();
    v1::LayerDecision& out = *outputs[i];
    out.set_layer(work.layer);
    out.set_page_count(work.decision.page_count);
    out.set_quota_pages(work.decision.quota_pages);
    out.set_tokens(job.tokens);
    out.set_policy(std::string(decided_by.name()));
    out.set_page_union_ratio(result.page_union_ratio);
    out.set_scope(wire::ToProto(work.decision.scope));
    out.set_union_pages(work.decision.union_pages);
    out.set_group_scope_union_pages(work.decision.group_scope_union_pages);
    out.set_degraded(work.degraded);
    out.mutable_freed_frames()->Assign(result.freed_frames.begin(), result.freed_frames.end());
    std::vector<double> weights;
    for (size_t g = 0; g < work.decision.groups.size(); ++g) {
      const GroupDecision& group = work.decision.groups[g];
      v1::GroupDecision* wire = out.add_groups();
      wire->set_group(static_cast<int32_t>(shard.first_group + static_cast<int>(g)));
      wire->mutable_kept_pages()->Assign(group.kept_pages.begin(), group.kept_pages.end());
      if (const size_t applied = shard.first_group + g;
          applied < result.evicted_pages_per_group.size()) {
        for (int64_t page : result.evicted_pages_per_group[applied]) {
          wire->add_evicted_pages(static_cast<int32_t>(page));
        }
      }
      wire->mutable_weights()->Assign(group.weights.begin(), group.weights.end());
      wire->mutable_entropies()->Assign(group.entropies.begin(), group.entropies.end());
      if (group.shadow_uor) wire->set_shadow_uor(*group.shadow_uor);
      if (group.disagreement) wire->set_disagreement(*group.disagreement);
      if (group.retained_mass) wire->set_retained_mass(*group.retained_mass);
      weights.insert(weights.end(), group.weights.begin(), group.weights.end());
    }
    // Cache prefill weights for later decode-time calls (only freshly computed ones).
    if (!work.cached_weights.has_value() && weights.size() == static_cast<size_t>(shard.heads)) {
      model.CacheWeightRows(job.sequence_id, work.layer, shard.first_head, std::move(weights));
    }
    RecordDecision(model, decided_by, model.state().layout(), out);
    if (work.degraded) model.metrics().decisions_degraded->Increment();
    metrics_->ObservePhase(Phase::kSelect, SecondsSince(start));
  }
  absl::StatusOr<PressureReport> pressure = model.state().Pressure(job.sequence_id);
  if (pressure.ok()) job.pressure = *pressure;
  model.RefreshOccupancy();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ApplyResult>> Decider::ApplyFixed(Model& model, Job& job) const {
  const ModelGeometry& geometry = model.state().geometry();
  const Shard& shard = job.shard;
  std::vector<LayerKeep> keeps(job.layers.size());
  for (size_t i = 0; i < job.layers.size(); ++i) {
    const LayerDecision& decision = job.layers[i].decision;
    keeps[i].layer = job.layers[i].layer;
    if (shard.partial(geometry)) {
      // Another rank's groups keep every page they hold: this decision leaves them as they are.
      std::vector<int32_t> every_page(static_cast<size_t>(decision.page_count));
      std::iota(every_page.begin(), every_page.end(), 0);
      keeps[i].kept_pages_per_group.assign(static_cast<size_t>(geometry.kv_groups), every_page);
      for (size_t g = 0; g < decision.groups.size(); ++g) {
        keeps[i].kept_pages_per_group[shard.first_group + g] = decision.groups[g].kept_pages;
      }
    } else {
      for (const GroupDecision& group : decision.groups) {
        keeps[i].kept_pages_per_group.push_back(group.kept_pages);
      }
    }
    if (job.layers[i].accumulate) {
      keeps[i].running_sum = std::move(job.layers[i].running_sum);
      if (shard.partial(geometry)) {
        keeps[i].running_sum_first_head = shard.first_head;
        keeps[i].running_sum_heads = shard.heads;
      }
    }
  }
  return model.state().ApplyDecisions(job.sequence_id, job.tokens, std::move(keeps));
}

absl::StatusOr<std::vector<ApplyResult>> Decider::ApplyAuto(Model& model, Job& job) const {
  // The scorer kept every live page and ranked them; the pool's quota decides what goes.
  std::vector<AutoLayer> layers(job.layers.size());
  for (size_t i = 0; i < job.layers.size(); ++i) {
    layers[i].layer = job.layers[i].layer;
    for (GroupDecision& group : job.layers[i].decision.groups) {
      if (group.page_scores.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "budget.auto_budget: policy ", job.policy.policy->name(),
            " ranks no pages; a server-chosen budget needs a pooling policy (page_entrokv, mean, "
            "max, raw_entropy, h2o, snapkv)"));
      }
      layers[i].page_scores.push_back(std::move(group.page_scores));
    }
  }
  const Protections& protections = job.policy.options.protections;
  AutoTerms terms;
  terms.floor_fraction = job.auto_floor;
  terms.protect_tail = protections.tail_page;
  terms.sink_pages = protections.sink_pages ? SinkPageCount(job.policy.options, job.tokens) : 0;
  terms.recent_pages = protections.recent_pages;
  ASSIGN_OR_RETURN(AutoResult result,
                   model.state().ApplyAutoDecision(job.sequence_id, job.tokens, layers, terms));
  job.pressure.reclaimed_frames = result.reclaimed_frames;
  // What each group keeps is what it held, less what the quota took.
  for (size_t i = 0; i < job.layers.size(); ++i) {
    LayerDecision& decision = job.layers[i].decision;
    const ApplyResult& applied = result.layers[i];
    for (size_t g = 0; g < decision.groups.size(); ++g) {
      std::vector<int32_t>& kept = decision.groups[g].kept_pages;
      if (g >= applied.evicted_pages_per_group.size()) continue;
      const std::vector<int64_t>& evicted = applied.evicted_pages_per_group[g];
      kept.erase(std::remove_if(kept.begin(), kept.end(),
                                [&evicted](int32_t page) {
                                  return std::binary_search(evicted.begin(), evicted.end(),
                                                            static_cast<int64_t>(page));
                                }),
                 kept.end());
    }
    decision.quota_pages = 0;  // K as kept: the groups may keep different counts
    for (const GroupDecision& group : decision.groups) {
      decision.quota_pages =
          std::max(decision.quota_pages, static_cast<int64_t>(group.kept_pages.size()));
    }
  }
  return std::move(result.layers);
}

namespace {

// The rank a request names: DecideRequest.rank always (0 on a model of one rank),
// DecideLayerRequest.rank when set.
std::optional<int> RankOf(const v1::DecideRequest& request) { return request.rank(); }
std::optional<int> RankOf(const v1::DecideLayerRequest& request) {
  return request.has_rank() ? std::optional<int>(request.rank()) : std::nullopt;
}

// Step 1 shared by both entry points (DecideRequest and DecideLayerRequest carry the same
// sequence, budget and policy fields): the job's sequence, length and policy, and the quotas.
template <typename Request>
absl::Status PrepareJob(Model& model, const Request& request, const wire::Defaults& defaults,
                        std::string* sequence_id, Shard* shard, int64_t* tokens,
                        ResolvedPolicy* policy, SelectionScope* scope, ResolvedBudget* quotas,
                        std::optional<double>* auto_floor) {
  RETURN_IF_ERROR(wire::ValidateId("sequence_id", request.sequence_id()));
  ASSIGN_OR_RETURN(*shard, ShardOf(model, RankOf(request)));
  RETURN_IF_ERROR(wire::ValidateAnswerWithin("answer_within_ms", request.answer_within_ms()));
  *sequence_id = request.sequence_id();
  const ModelGeometry& geometry = model.state().geometry();
  ASSIGN_OR_RETURN(*policy, wire::ResolvePolicy(request.policy(), defaults, geometry.page_size));
  ASSIGN_OR_RETURN(*scope,
                   wire::ResolveScope(request.policy().scope(), defaults, model.state().layout()));
  ASSIGN_OR_RETURN(*tokens, model.state().SequenceLength(*sequence_id));
  if (*tokens < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence_id: '", *sequence_id, "' holds no tokens to decide on"));
  }
  ASSIGN_OR_RETURN(*quotas,
                   wire::ResolveBudget(request.budget(), request.has_budget(), geometry, *tokens));
  *auto_floor = quotas->auto_floor;
  if (*scope == SelectionScope::kLayer && shard->partial(geometry)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.scope: SELECTION_SCOPE_LAYER pools every KV group of a layer, and ", shard->owner,
        " of a group-layout tensor-parallel model holds only its own; use SELECTION_SCOPE_GROUP"));
  }
  RETURN_IF_ERROR(
      ValidateGroupQuotas("policy.group_floor", *policy->policy, policy->options, *scope));
  if (MovesGroupQuotas(policy->options) && shard->partial(geometry)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.group_floor: quotas move between every KV group of a layer, and ", shard->owner,
        " of a group-layout tensor-parallel model holds only its own; leave it at 1"));
  }
  // The pool's quota takes pages by every group's scores; a rank alone has only its own.
  if (auto_floor->has_value() && shard->partial(geometry)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget.auto_budget: not for ", shard->owner,
        " of a group-layout tensor-parallel model (each rank decides alone, and the pool's quota "
        "needs every group's scores); use a fixed budget"));
  }
  if (quotas->mass_floor.has_value()) {
    if (!policy->policy->ranks_pages()) {
      return absl::InvalidArgumentError(
          absl::StrCat("budget.allocator: 'mass' moves pages to the layers whose scores need them, "
                       "and policy ",
                       policy->policy->name(), " ranks no pages; use uniform or pyramid"));
    }
    if (shard->partial(geometry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "budget.allocator: 'mass' moves pages by every KV group's scores, and ", shard->owner,
          " of a group-layout tensor-parallel model holds only its own; use uniform or pyramid"));
    }
  }
  // A layer decided by position ranks no pages, so the pool would have no shares to take by.
  if (auto_floor->has_value() && request.degrade_on_deadline()) {
    return absl::InvalidArgumentError(
        "degrade_on_deadline: not with budget.auto_budget (a layer decided by position ranks no "
        "pages for the pool's quota); use a fixed budget, or answer_within_ms alone");
  }
  return absl::OkStatus();
}

// The request's deadline and what it allows (Job::deadline, degrade, reserve).
template <typename Request>
void PrepareDeadline(const Request& request, const CallTiming& timing,
                     std::optional<Clock::time_point>* deadline, bool* is_answer_within,
                     bool* degrade, Clock::duration* reserve) {
  *deadline = timing.deadline;
  *is_answer_within = false;
  if (request.answer_within_ms() > 0) {
    const Clock::time_point within =
        timing.received + std::chrono::milliseconds(request.answer_within_ms());
    if (!deadline->has_value() || within < **deadline) {
      *deadline = within;
      *is_answer_within = true;
    }
  }
  *degrade = request.degrade_on_deadline();
  // Kept back for deciding the rest by position and sending the reply: a tenth of the time the
  // request had, within [1 ms, 20 ms].
  if (deadline->has_value()) {
    *reserve =
        std::clamp<Clock::duration>((**deadline - timing.received) / 10,
                                    std::chrono::milliseconds(1), std::chrono::milliseconds(20));
  }
}

absl::Status PrepareLayer(Model& model, absl::string_view sequence_id, const Shard& shard,
                          int64_t tokens, const ResolvedPolicy& policy,
                          const ResolvedBudget& quotas, const v1::LayerStatistic& input,
                          bool use_cached_weights, const ShmReader& shm, HeldSegments& segments,
                          DeviceReader& device, ServiceMetrics& metrics, LayerWork& work) {
  const ModelGeometry& geometry = model.state().geometry();
  if (input.layer() < 0 || input.layer() >= geometry.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(work.field, ".layer: ", input.layer(), " not in [0, ", geometry.layers, ")"));
  }
  work.layer = input.layer();
  work.quota_pages = quotas.pages_per_layer[work.layer];
  if (quotas.auto_floor.has_value() && input.accumulate()) {
    return absl::InvalidArgumentError(absl::StrCat(
        work.field,
        ".accumulate: not with budget.auto_budget (a chunk's running sum is kept with a fixed "
        "budget's decision); decide chunks with a fixed budget"));
  }
  const Readers readers{.device = device, .model_id = model.id(), .sequence_id = sequence_id};
  RETURN_IF_ERROR(ResolveStatistic(input, shard, geometry.head_dim, tokens, *policy.policy, shm,
                                   segments, readers, metrics, work));
  if (work.keys.has_value() && work.keys->cover.has_value()) {
    RETURN_IF_ERROR(ValidateCoverPolicy(absl::StrCat(work.field, ".statistic.keys_mix.rule"),
                                        *policy.policy, policy.options));
  }
  if (use_cached_weights) {
    work.cached_weights = model.CachedWeights(sequence_id, work.layer);
    if (work.cached_weights.has_value() && shard.partial(geometry)) {  // the rank's rows
      const auto first = work.cached_weights->begin() + shard.first_head;
      work.cached_weights = std::vector<double>(first, first + shard.heads);
    }
    // NaN: a head whose tensor-parallel rank has not cached its weights yet.
    if (work.cached_weights.has_value() &&
        std::any_of(work.cached_weights->begin(), work.cached_weights->end(),
                    [](double weight) { return std::isnan(weight); })) {
      work.cached_weights.reset();
    }
    if (!work.cached_weights.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("use_cached_weights: no weights cached for sequence '", sequence_id,
                       "' layer ", work.layer));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Decider::Decide(Model& model, const v1::DecideRequest& request,
                             const std::function<bool()>& cancelled, v1::DecideResponse* response,
                             const CallTiming& timing) const {
  const auto start = Clock::now();
  Job job;
  ResolvedBudget quotas;
  RETURN_IF_ERROR(PrepareJob(model, request, defaults_, &job.sequence_id, &job.shard, &job.tokens,
                             &job.policy, &job.scope, &quotas, &job.auto_floor));
  job.mass_floor = quotas.mass_floor;
  PrepareDeadline(request, timing, &job.deadline, &job.deadline_is_answer_within, &job.degrade,
                  &job.reserve);
  if (request.layers().empty()) {
    return absl::InvalidArgumentError("layers: must name at least one layer");
  }
  absl::flat_hash_set<int> seen;
  job.layers.resize(request.layers_size());
  for (int i = 0; i < request.layers_size(); ++i) {
    LayerWork& work = job.layers[i];
    work.field = absl::StrCat("layers[", i, "]");
    RETURN_IF_ERROR(PrepareLayer(model, job.sequence_id, job.shard, job.tokens, job.policy, quotas,
                                 request.layers(i), request.use_cached_weights(), *shm_,
                                 job.segments, *device_, *metrics_, work));
    if (!seen.insert(work.layer).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(work.field, ".layer: ", work.layer, " appears twice"));
    }
  }
  metrics_->ObservePhase(Phase::kDecode, SecondsSince(start));
  std::vector<v1::LayerDecision*> outputs;
  v1::DecideResponse staged;
  for (int i = 0; i < request.layers_size(); ++i) outputs.push_back(staged.add_layers());
  RETURN_IF_ERROR(Run(model, job, cancelled, outputs));
  *staged.mutable_pressure() = wire::ToProto(job.pressure);
  *response = std::move(staged);
  return absl::OkStatus();
}

absl::Status Decider::DecideLayer(Model& model, const v1::DecideLayerRequest& request,
                                  const std::function<bool()>& cancelled,
                                  v1::LayerDecision* response, const CallTiming& timing) const {
  const auto start = Clock::now();
  Job job;
  ResolvedBudget quotas;
  RETURN_IF_ERROR(PrepareJob(model, request, defaults_, &job.sequence_id, &job.shard, &job.tokens,
                             &job.policy, &job.scope, &quotas, &job.auto_floor));
  if (quotas.mass_floor.has_value()) {
    return absl::InvalidArgumentError(
        "budget.allocator: 'mass' moves pages between the layers of one Decide call, and "
        "DecideStream decides one layer at a time; send the layers in one Decide call, or use "
        "uniform or pyramid");
  }
  PrepareDeadline(request, timing, &job.deadline, &job.deadline_is_answer_within, &job.degrade,
                  &job.reserve);
  job.layers.resize(1);
  job.layers[0].field = "layer";
  RETURN_IF_ERROR(PrepareLayer(model, job.sequence_id, job.shard, job.tokens, job.policy, quotas,
                               request.layer(), request.use_cached_weights(), *shm_, job.segments,
                               *device_, *metrics_, job.layers[0]));
  metrics_->ObservePhase(Phase::kDecode, SecondsSince(start));
  std::vector<v1::LayerDecision*> outputs = {response};
  RETURN_IF_ERROR(Run(model, job, cancelled, outputs));
  *response->mutable_pressure() = wire::ToProto(job.pressure);
  return absl::OkStatus();
}

}  // namespace entrokv::service
