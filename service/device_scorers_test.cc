#include "service/device_scorers.h"

#include <memory>

#include "core/scoring/fused_scorer.h"
#include "core/testing/decisions.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

// Whether this build and host can score on a GPU: --scorer=auto finds out.
bool HaveDeviceScoring() {
  absl::StatusOr<std::unique_ptr<DeviceScorers>> scorers =
      DeviceScorers::Create(ScorerSetting::kAuto);
  return scorers.ok() && (*scorers)->ScoresPool(Backend::kCuda);
}

TEST(DeviceScorersTest, CpuNeverScoresOnADevice) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceScorers> scorers,
                               DeviceScorers::Create(ScorerSetting::kCpu));
  EXPECT_FALSE(scorers->ScoresPool(Backend::kHost));
  EXPECT_FALSE(scorers->ScoresPool(Backend::kCuda));
  EXPECT_EQ(scorers->description(), "cpu");
}

TEST(DeviceScorersTest, AutoScoresOnlyPoolsOnAGpuAndCudaEveryPoolOrRefusesToStart) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceScorers> automatic,
                               DeviceScorers::Create(ScorerSetting::kAuto));
  EXPECT_FALSE(automatic->ScoresPool(Backend::kHost));
  const absl::StatusOr<std::unique_ptr<DeviceScorers>> cuda =
      DeviceScorers::Create(ScorerSetting::kCuda);
  if (!HaveDeviceScoring()) {
    EXPECT_FALSE(automatic->ScoresPool(Backend::kCuda));
    EXPECT_THAT(automatic->description(), HasSubstr("--scorer=auto"));
    EXPECT_THAT(cuda, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--scorer=cuda")));
    return;
  }
  EXPECT_TRUE(automatic->ScoresPool(Backend::kCuda));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_TRUE((*cuda)->ScoresPool(Backend::kHost));
  EXPECT_TRUE((*cuda)->ScoresPool(Backend::kCuda));
  EXPECT_THAT((*cuda)->description(), HasSubstr("cuda on"));
}

// A layer through the lent scorers is the fused CPU path's decision (on a GPU: the CUDA
// scorer's; without one: the CPU's, which the same call falls back to).
TEST(DeviceScorersTest, DecidesALayerAsTheFusedPath) {
  const bool gpu = HaveDeviceScoring();
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<DeviceScorers> scorers,
      DeviceScorers::Create(gpu ? ScorerSetting::kCuda : ScorerSetting::kCpu));
  const ::entrokv::testing::Statistic statistic(
      DType::kBFloat16, 8, 1000,
      std::vector<float>(8000, 0.25f));  // every page ties: the lower pages win
  const PolicyOptions options;
  const Policy& policy = **FindPolicy("page_entrokv");
  const LayerRequest request = LayerRequestFor(statistic.View(), 8, 2, 1000, 7);
  FusedScorer cpu(options);
  ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision expected, cpu.DecideLayer(policy, request));
  for (int call = 0; call < 3; ++call) {  // the scorer goes back and is lent again
    ENTROKV_ASSERT_OK_AND_ASSIGN(const LayerDecision actual,
                                 scorers->DecideLayer(0, policy, options, request));
    ::entrokv::testing::ExpectSameDecision(expected, actual);
  }
}

}  // namespace
}  // namespace entrokv::service
