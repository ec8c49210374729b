#include "service/rank_gather.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "core/util/dtype.h"
#include "core/util/status_macros.h"
#include "wire/checks.h"
#include "wire/convert.h"

namespace entrokv::service {
namespace {

using Clock = std::chrono::steady_clock;

// The bytes of one rank's statistic of layers[index], checked to be that rank's share: H_Q / t
// rows of `tokens` values. Empty when the layer carries no statistic (policies needing none).
absl::StatusOr<std::string> RankRows(const v1::LayerStatistic& layer, int index, int ranks,
                                     int rank, int query_heads, int64_t sequence_tokens,
                                     const ShmReader& shm, DeviceReader& device,
                                     absl::string_view model_id, absl::string_view sequence_id) {
  if (!layer.has_statistic() || layer.statistic().source_case() == v1::Statistic::SOURCE_NOT_SET) {
    return std::string();
  }
  const v1::Statistic& stat = layer.statistic();
  const std::string field = absl::StrCat("layers[", index, "].statistic");
  if (stat.source_case() == v1::Statistic::kKeys) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ".keys: the ranks of a LAYER-layout tensor-parallel model decide together from "
        "rows each sends; keys are the daemon's to read: send them once, on a DecideStream "
        "whose messages leave rank unset"));
  }
  if (stat.has_keys_mix()) {  // the gathered rows carry values only: refused, never dropped
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ".keys_mix: the ranks of a LAYER-layout tensor-parallel model decide together from "
        "rows each sends; a keys mix is the daemon's to score: send it once, on a DecideStream "
        "whose messages leave rank unset"));
  }
  ASSIGN_OR_RETURN(const DType dtype, wire::ToDType(absl::StrCat(field, ".dtype"), stat.dtype()));
  if (stat.query_heads() != query_heads / ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".query_heads: ", stat.query_heads(), ", but rank ", rank, " of ", ranks,
        " sends its own ", query_heads / ranks, " of the model's ", query_heads, " query heads"));
  }
  RETURN_IF_ERROR(wire::ValidateTokenCount(absl::StrCat(field, ".tokens"), stat.tokens(), 1));
  // Checked before any byte is read, as the decider does: a rank's rows are at most the
  // sequence's own size, whatever length a request claims.
  if (stat.tokens() != sequence_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(field, ".tokens: ", stat.tokens(),
                                                      " but the sequence holds ", sequence_tokens));
  }
  const uint64_t expected = static_cast<uint64_t>(stat.query_heads()) *
                            static_cast<uint64_t>(stat.tokens()) *
                            static_cast<uint64_t>(DTypeBytes(dtype));
  if (stat.source_case() == v1::Statistic::kData) {
    if (stat.data().size() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".data: ", stat.data().size(), " bytes, expected ", expected));
    }
    return stat.data();
  }
  if (stat.source_case() == v1::Statistic::kDeviceBuffer) {
    ASSIGN_OR_RETURN(const DeviceStatistic statistic,
                     device.Acquire(absl::StrCat(field, ".device_buffer"), stat.device_buffer(),
                                    expected, DTypeBytes(dtype), model_id, sequence_id));
    std::string rows(expected, '\0');
    RETURN_IF_ERROR(statistic.CopyToHost(rows.data()));
    return rows;
  }
  const v1::SharedMemoryRegion& region = stat.shared_memory();
  const std::string shm_field = absl::StrCat(field, ".shared_memory");
  if (region.length_bytes() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(shm_field, ".length_bytes: ", region.length_bytes(), ", expected ", expected));
  }
  ASSIGN_OR_RETURN(const ShmSegment segment, shm.Open(shm_field, region.segment()));
  RETURN_IF_ERROR(segment.CheckRange(shm_field, region.offset_bytes(), region.length_bytes()));
  std::string rows(expected, '\0');
  RETURN_IF_ERROR(segment.Read(shm_field, region.offset_bytes(), expected, rows.data()));
  return rows;
}

// The request without its statistics' values, rows and rank: what every rank must agree on.
v1::DecideRequest ShapeOf(const v1::DecideRequest& request) {
  v1::DecideRequest shape = request;
  shape.clear_rank();
  for (v1::LayerStatistic& layer : *shape.mutable_layers()) {
    if (!layer.has_statistic()) continue;
    v1::Statistic* stat = layer.mutable_statistic();
    stat->clear_source();
    stat->clear_query_heads();
  }
  return shape;
}

std::string Serialized(const v1::DecideRequest& request) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  request.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

// Which set a request belongs to: the model (its object, so a re-registered id is another
// model), the sequence and the layers.
std::string KeyOf(const Model& model, const v1::DecideRequest& request) {
  std::string key = absl::StrCat(reinterpret_cast<uintptr_t>(&model), "/",
                                 request.sequence_id().size(), ":", request.sequence_id());
  for (const v1::LayerStatistic& layer : request.layers())
    absl::StrAppend(&key, ",", layer.layer());
  return key;
}

}  // namespace

RankGather::RankGather(std::chrono::milliseconds wait, int max_sets, int64_t max_bytes,
                       const ShmReader* shm, DeviceReader* device)
    : wait_(wait),
      max_sets_(max_sets),
      max_bytes_(max_bytes),
      shm_(shm),
      device_(device),
      timer_([this] { ExpireLoop(); }) {}

RankGather::~RankGather() {
  std::vector<Set> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    timer_wakeup_.Signal();
    for (auto& [key, set] : sets_) left.push_back(std::move(set));
    sets_.clear();
  }
  timer_.join();
  for (Set& set : left) {
    for (std::optional<Reply>& reply : set.replies) {
      if (reply.has_value()) {
        (*reply)(absl::UnavailableError(absl::StrCat("the daemon is shutting down; ",
                                                     set.description, " was not decided")),
                 nullptr);
      }
    }
  }
}

int RankGather::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sets_.size());
}

int64_t RankGather::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

absl::StatusOr<std::optional<RankGather::Complete>> RankGather::Add(
    const Model& model, const v1::DecideRequest& request, Reply reply) {
  const int ranks = model.state().ranks();
  const int query_heads = model.state().geometry().query_heads;
  const int rank = request.rank();
  RETURN_IF_ERROR(model.CheckRank(rank));
  RETURN_IF_ERROR(wire::ValidateId("sequence_id", request.sequence_id()));
  ASSIGN_OR_RETURN(const int64_t sequence_tokens,
                   model.state().SequenceLength(request.sequence_id()));
  std::vector<std::string> rows;
  for (int i = 0; i < request.layers_size(); ++i) {
    ASSIGN_OR_RETURN(std::string layer_rows,
                     RankRows(request.layers(i), i, ranks, rank, query_heads, sequence_tokens,
                              *shm_, *device_, model.id(), request.sequence_id()));
    rows.push_back(std::move(layer_rows));
  }
  v1::DecideRequest shape = ShapeOf(request);
  std::string shape_bytes = Serialized(shape);
  const std::string key = KeyOf(model, request);

  std::vector<Reply> failed;  // replies of a set this request broke, answered unlocked
  absl::Status error;
  std::optional<Complete> complete;
  int64_t bytes = 0;
  for (const std::string& layer_rows : rows) bytes += static_cast<int64_t>(layer_rows.size());
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(key);
    if (it != sets_.end() && it->second.shape != shape_bytes) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "rank: rank ", rank, "'s Decide for ", it->second.description,
          " differs from the first rank's in more than its statistics (layers, budget, policy, "
          "flags and the statistics' dtype, tokens and kind must be the same); no rank's "
          "decision was applied"));
      for (std::optional<Reply>& waiting : it->second.replies) {
        if (waiting.has_value()) failed.push_back(*std::move(waiting));
      }
      held_bytes_ -= it->second.bytes;
      sets_.erase(it);
    } else if (it != sets_.end() && it->second.replies[static_cast<size_t>(rank)].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("rank: rank ", rank, " already sent ",
                                                     it->second.description,
                                                     ", which waits for the other ranks"));
    } else if (const bool completes = it != sets_.end() && it->second.arrived + 1 == ranks;
               !completes && held_bytes_ + bytes > max_bytes_) {
      // The last rank's rows never wait; every other rank's do, and are bounded.
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_inflight_decisions: tensor-parallel decisions waiting for their ranks hold ",
          held_bytes_, " bytes of statistics; rank ", rank, "'s ", bytes,
          " would pass the bound of ", max_bytes_,
          " (--max_inflight_decisions x --max_message_bytes); retry with backoff"));
    } else if (it == sets_.end()) {
      if (static_cast<int>(sets_.size()) >= max_sets_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("max_inflight_decisions: ", max_sets_,
                         " tensor-parallel decisions wait for their ranks; retry with backoff"));
      }
      Set set;
      std::vector<std::string> layers;
      for (const v1::LayerStatistic& layer : request.layers()) {
        layers.push_back(absl::StrCat(layer.layer()));
      }
      set.description = absl::StrCat("layers [", absl::StrJoin(layers, ", "), "] of sequence \"",
                                     request.sequence_id(), "\" of model \"", model.id(), "\"");
      set.request = std::move(shape);
      set.shape = std::move(shape_bytes);
      set.rows.resize(static_cast<size_t>(ranks));
      set.replies.resize(static_cast<size_t>(ranks));
      set.deadline = Clock::now() + wait_;
      it = sets_.emplace(key, std::move(set)).first;
      timer_wakeup_.Signal();
    }
    if (error.ok()) {
      Set& set = it->second;
      set.rows[static_cast<size_t>(rank)] = std::move(rows);
      set.replies[static_cast<size_t>(rank)] = std::move(reply);
      set.bytes += bytes;
      held_bytes_ += bytes;
      if (++set.arrived == ranks) {
        complete.emplace();
        complete->request = std::move(set.request);
        for (int i = 0; i < complete->request.layers_size(); ++i) {
          v1::LayerStatistic* layer = complete->request.mutable_layers(i);
          if (set.rows[0][static_cast<size_t>(i)].empty()) continue;
          v1::Statistic* stat = layer->mutable_statistic();
          stat->set_query_heads(query_heads);
          std::string* data = stat->mutable_data();
          for (int r = 0; r < ranks; ++r)
            data->append(set.rows[static_cast<size_t>(r)][static_cast<size_t>(i)]);
        }
        for (std::optional<Reply>& waiting : set.replies)
          complete->replies.push_back(*std::move(waiting));
        held_bytes_ -= set.bytes;
        sets_.erase(it);
      }
    }
  }
  if (!error.ok()) {
    for (Reply& waiting : failed) waiting(error, nullptr);
    return error;
  }
  return complete;
}

std::vector<RankGather::Set> RankGather::TakeExpired(Clock::time_point now) {
  std::vector<Set> expired;
  for (auto it = sets_.begin(); it != sets_.end();) {
    if (it->second.deadline <= now) {
      held_bytes_ -= it->second.bytes;
      expired.push_back(std::move(it->second));
      sets_.erase(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

void RankGather::ExpireLoop() {
  for (;;) {
    std::vector<Set> expired;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      std::optional<Clock::time_point> next;
      for (const auto& [key, set] : sets_) {
        if (!next.has_value() || set.deadline < *next) next = set.deadline;
      }
      if (next.has_value()) {
        timer_wakeup_.WaitWithTimeout(&mu_, absl::FromChrono(*next - Clock::now()));
      } else {
        timer_wakeup_.Wait(&mu_);
      }
      if (stopping_) return;
      expired = TakeExpired(Clock::now());
    }
    for (Set& set : expired) {
      std::vector<std::string> missing;
      for (size_t r = 0; r < set.replies.size(); ++r) {
        if (!set.replies[r].has_value()) missing.push_back(absl::StrCat(r));
      }
      const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
          "rank_wait_ms: rank", missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
          " of ", set.replies.size(), " sent no Decide for ", set.description, " within ",
          wait_.count(), " ms of the first; nothing was applied"));
      for (std::optional<Reply>& reply : set.replies) {
        if (reply.has_value()) (*reply)(status, nullptr);
      }
    }
  }
}

}  // namespace entrokv::service
