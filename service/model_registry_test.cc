// ModelRegistry::Recover's checks of what a journal recorded, before any arena is made.
#include "service/model_registry.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics.h"
#include "store/recovery.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

store::RecoveredModel RecordedModel(const std::string& id, int64_t capacity_bytes) {
  store::RecoveredModel recovered;
  recovered.model.model_id = id;
  recovered.model.geometry = {.layers = 1,
                              .query_heads = 2,
                              .kv_groups = 1,
                              .head_dim = 4,
                              .page_size = 4,
                              .element_bytes = 2};
  recovered.model.backend = Backend::kCuda;  // nothing to attach: no arena is touched
  recovered.model.capacity_bytes = capacity_bytes;
  return recovered;
}

// Found by tests/fuzz/recovery_fuzzer (corpus/recovery/regress-capacity-overflow): the sum of
// the recorded capacities overflowed int64 (undefined behaviour; in practice it wrapped
// negative and passed the --pool_capacity_bytes check).
TEST(ModelRegistryTest, RecoveredCapacitiesThatOverflowAreRefused) {
  ServiceMetrics metrics;
  ModelRegistry registry(/*capacity_bytes=*/int64_t{1} << 20, /*max_models=*/4,
                         /*max_bookkeeping_bytes=*/0, CacheLimits{}, &metrics);
  const int64_t half = std::numeric_limits<int64_t>::max() / 2 + 2;
  std::vector<store::RecoveredModel> models;
  models.push_back(RecordedModel("a", half));
  models.push_back(RecordedModel("b", half));
  EXPECT_THAT(registry.Recover(std::move(models)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--pool_capacity_bytes")));
  EXPECT_EQ(registry.size(), 0);
}

}  // namespace
}  // namespace entrokv::service
