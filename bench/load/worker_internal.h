// Constants and small checks shared by the worker's two halves (worker.cc: lifecycle and
// decisions; worker_bad_requests.cc: the bad requests).
#ifndef ENTROKV_BENCH_LOAD_WORKER_INTERNAL_H_
#define ENTROKV_BENCH_LOAD_WORKER_INTERNAL_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bench/load/worker.h"
#include "core/pool/geometry.h"
#include "entrokv/v1/cache_manager.pb.h"
#include "grpcpp/grpcpp.h"

namespace entrokv::bench::worker_internal {

using grpc::StatusCode;

inline constexpr int64_t kMaxTokens = 1536;  // ordinary sequences stay below (cheap under ASan)
inline constexpr int kMaxSequencesPerModel = 4;
inline constexpr int kSlots = 8;  // statistics one call may reference in the worker's segment
inline constexpr int64_t kSlotBytes = int64_t{12} * kMaxTokens * 4;  // the largest layer statistic
inline constexpr uint64_t kPrivateCapacityBytes = uint64_t{4} << 20;
// The private model: only its worker uses it, so decisions and counters are checked exactly.
inline constexpr Shape kPrivateShape{3, 8, 2, 4, 16, 2, FrameLayout::kGroup};

inline std::string Cut(const std::string& text) {
  return text.size() <= 300 ? text : absl::StrCat(text.substr(0, 300), "...");
}

// Ascending, distinct, in [0, pages).
inline bool PageList(const google::protobuf::RepeatedField<int32_t>& pages, int64_t count) {
  for (int i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] >= count || (i > 0 && pages[i] <= pages[i - 1])) return false;
  }
  return true;
}

// Frames of a reply: inside the pool, on a real (layer, group, page), one (layer, group, page)
// per frame; in the LAYER layout the kv_groups entries of one (layer, page) name the same frame
// (core/pool/sequence.h, AppendResult).
inline bool FrameList(const google::protobuf::RepeatedPtrField<v1::FrameAssignment>& frames,
                      const Shape& shape, int64_t capacity_frames, int64_t first_page,
                      int64_t end_page) {
  std::map<int32_t, std::pair<int32_t, int64_t>> owner;  // frame -> (layer, page)
  std::set<std::tuple<int32_t, int32_t, int64_t>> entries;
  for (const v1::FrameAssignment& f : frames) {
    if (f.frame() < 0 || f.frame() >= capacity_frames || f.layer() < 0 ||
        f.layer() >= shape.layers || f.group() < 0 || f.group() >= shape.kv_groups ||
        f.page() < first_page || f.page() >= end_page ||
        !entries.emplace(f.layer(), f.group(), f.page()).second) {
      return false;
    }
    const auto [it, fresh] = owner.emplace(f.frame(), std::make_pair(f.layer(), f.page()));
    if (!fresh && (shape.layout == FrameLayout::kGroup ||
                   it->second != std::make_pair(f.layer(), f.page()))) {
      return false;
    }
  }
  return true;
}

}  // namespace entrokv::bench::worker_internal

namespace entrokv::bench {

// Defined here so that both halves of the worker instantiate it.
template <typename Request, typename Response, typename Method>
grpc::Status Worker::Call(const char* kind, Method method, const Request& request,
                          Response* response, const char* bad_case, int timeout_ms) {
  grpc::ClientContext context;
  PrepareCall(
      &context, *context_->options,
      std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : context_->options->call_timeout_ms));
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = ((*stub_).*method)(&context, request, response);
  CountCall(
      kind,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
      bad_case);
  return status;
}

}  // namespace entrokv::bench

#endif  // ENTROKV_BENCH_LOAD_WORKER_INTERNAL_H_
