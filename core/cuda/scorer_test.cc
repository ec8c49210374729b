// The CUDA scorer against the fused CPU path (which fused_scorer_test.cc holds to the reference):
// every fused policy, dtype, order and odd shape, batches of layers, statistics in host and in
// device memory, bad values and bad devices. Skips where no GPU is present (label gpu).
#include "core/cuda/scorer.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/cuda/device.h"
#include "core/scoring/fused_scorer.h"
#include "core/testing/decisions.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::cuda {
namespace {

using ::entrokv::testing::ExpectSameDecision;
using ::entrokv::testing::RandomCase;
using ::entrokv::testing::Statistic;
using ::entrokv::testing::StatusIs;
using ::entrokv::testing::TestSeed;
using ::testing::HasSubstr;

bool HaveGpu() { return DeviceCount().ok(); }

std::vector<absl::string_view> FusedPolicyNames() {
  std::vector<absl::string_view> names;
  for (const absl::string_view name : PolicyNames()) {
    if (IsFusedPolicy(**FindPolicy(name))) names.push_back(name);
  }
  return names;
}

// Device copies of a case's statistics, freed with it; `shift` bytes past an allocation's start
// (a multiple of the element size: 0 is 16-byte aligned, the others are not).
class DeviceCopies {
 public:
  explicit DeviceCopies(const RandomCase& c, size_t shift = 0) {
    for (size_t l = 0; l < c.requests.size(); ++l) {
      const Statistic& statistic = *c.statistics[l];
      void* allocation = nullptr;
      EXPECT_EQ(cudaMalloc(&allocation, statistic.bytes() + shift + 1), cudaSuccess);
      char* data = static_cast<char*>(allocation) + shift;
      EXPECT_EQ(cudaMemcpy(data, statistic.data(), statistic.bytes(), cudaMemcpyHostToDevice),
                cudaSuccess);
      buffers_.push_back(allocation);
      LayerRequest request = c.requests[l];
      request.statistic =
          *StatisticView::Create(data, statistic.dtype, statistic.heads, statistic.tokens);
      requests_.push_back(request);
    }
  }
  ~DeviceCopies() {
    for (void* data : buffers_) cudaFree(data);
  }
  const std::vector<LayerRequest>& requests() const { return requests_; }

 private:
  std::vector<void*> buffers_;
  std::vector<LayerRequest> requests_;
};

TEST(CudaScorerTest, MatchesTheFusedCpuPathOnRandomAndAdversarialInputs) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU here";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (ENTROKV_TEST_SEED replays it)");
  std::mt19937_64 rng(seed);
  const std::vector<absl::string_view> names = FusedPolicyNames();
  // Mostly the orders the device scores; 1 and 0.5 go to the CPU inside the same call.
  const std::vector<double> alphas = {2.0, 2.0, kAlphaInfinity, 1.0, 0.5};
  // ENTROKV_GPU_TRIALS: fewer trials, for the sanitizers (bench/gpu/device_checks.sh).
  const char* trials_text = std::getenv("ENTROKV_GPU_TRIALS");
  const int trials = trials_text != nullptr ? std::atoi(trials_text) : 300;
  int on_device = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const int layers = 1 + trial % 3;
    const std::unique_ptr<RandomCase> c =
        testing::MakeRandomCase(rng, trial, names, alphas, layers);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << c->Describe());
    ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<LayerDecision> expected,
                                 DecideModel(*c->policy, c->options, c->requests, 1));
    // Odd trials: device statistics that are not 16-byte aligned (the pooling's element loads).
    const bool odd = trial % 2 == 1;
    ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scorer> scorer, Scorer::Create(0));
    for (const bool device_memory : {false, true}) {
      SCOPED_TRACE(device_memory ? "statistic in device memory" : "statistic in host memory");
      absl::StatusOr<std::vector<LayerDecision>> actual;
      const DeviceCopies copies(*c,
                                odd ? static_cast<size_t>(DTypeBytes(c->statistics[0]->dtype)) : 0);
      if (device_memory) {
        if (!ScoresOnDevice(*c->policy, c->options, c->requests[0])) continue;
        actual = scorer->DecideModelOnDevice(*c->policy, c->options, copies.requests());
      } else {
        actual = scorer->DecideModel(*c->policy, c->options, c->requests);
      }
      ASSERT_TRUE(actual.ok()) << actual.status();
      ASSERT_EQ(actual->size(), expected.size());
      for (size_t l = 0; l < expected.size(); ++l) {
        SCOPED_TRACE(::testing::Message() << "layer " << l);
        ExpectSameDecision(expected[l], (*actual)[l]);
      }
    }
    on_device += ScoresOnDevice(*c->policy, c->options, c->requests[0]) ? 1 : 0;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(on_device, trials / 2);  // the comparison is mostly of the device's work
}

TEST(CudaScorerTest, LongRowsAndEveryPolicyAtModelShapes) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU here";
  // Rows longer than a tile and than the lanes many times over, a partial last page, bf16.
  std::mt19937_64 rng(TestSeed());
  for (const absl::string_view name : FusedPolicyNames()) {
    for (const DType dtype : {DType::kBFloat16, DType::kFloat32}) {
      PolicyOptions options;
      options.protections.tail_page = true;
      const int heads = 16;
      const int groups = 2;
      // Rows of whole 16 bytes (read 16 bytes a load) and not.
      const int64_t tokens = dtype == DType::kBFloat16 ? 65536 : 70001;
      std::vector<std::unique_ptr<Statistic>> statistics;
      std::vector<LayerRequest> requests;
      for (int l = 0; l < 4; ++l) {
        statistics.push_back(std::make_unique<Statistic>(
            dtype, heads, tokens, testing::RandomValues(rng, heads, tokens, 4)));
        LayerRequest request = LayerRequestFor(statistics.back()->View(), heads, groups, tokens,
                                               PageCount(tokens, 16) / (l + 2));
        request.measure = l % 2 == 0;
        requests.push_back(request);
      }
      SCOPED_TRACE(::testing::Message() << name << " " << DTypeName(dtype));
      const Policy& policy = **FindPolicy(name);
      ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<LayerDecision> expected,
                                   DecideModel(policy, options, requests, 1));
      ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scorer> scorer, Scorer::Create(0));
      ENTROKV_ASSERT_OK_AND_ASSIGN(const std::vector<LayerDecision> actual,
                                   scorer->DecideModel(policy, options, requests));
      for (size_t l = 0; l < expected.size(); ++l) ExpectSameDecision(expected[l], actual[l]);
    }
  }
}

// Pages longer than a pooling tile (2048 tokens) and up to the device's 4096-token limit.
TEST(CudaScorerTest, PagesLongerThanATile) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU here";
  std::mt19937_64 rng(TestSeed());
  for (const int page_size : {2049, 3000, 4096}) {
    PolicyOptions options;
    options.page_size = page_size;
    options.protections.tail_page = true;
    const int64_t tokens = 3 * page_size + 17;
    const Statistic statistic(DType::kBFloat16, 4, tokens,
                              testing::RandomValues(rng, 4, tokens, 4));
    for (const absl::string_view name : FusedPolicyNames()) {
      for (const bool measure : {false, true}) {
        SCOPED_TRACE(::testing::Message() << name << " B " << page_size << " measure " << measure);
        LayerRequest request = LayerRequestFor(statistic.View(), 4, 2, tokens, 2);
        request.measure = measure;
        const Policy& policy = **FindPolicy(name);
        ENTROKV_ASSERT_OK_AND_ASSIGN(
            const std::vector<LayerDecision> expected,
            DecideModel(policy, options, std::span<const LayerRequest>(&request, 1), 1));
        ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scorer> scorer, Scorer::Create(0));
        ENTROKV_ASSERT_OK_AND_ASSIGN(
            const std::vector<LayerDecision> actual,
            scorer->DecideModel(policy, options, std::span<const LayerRequest>(&request, 1)));
        ExpectSameDecision(expected[0], actual[0]);
      }
    }
  }
}

TEST(CudaScorerTest, BadValuesGetTheCpuPathsErrorInLayerOrder) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU here";
  const PolicyOptions options;
  const Policy& policy = **FindPolicy("page_entrokv");
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -1.0f, std::numeric_limits<float>::infinity()}) {
    std::vector<float> good_values(4 * 100, 0.5f);
    std::vector<float> bad_values = good_values;
    bad_values[2 * 100 + 37] = bad;  // head 2, token 37
    const Statistic good(DType::kFloat32, 4, 100, good_values);
    const Statistic broken(DType::kFloat32, 4, 100, bad_values);
    const std::vector<LayerRequest> requests = {LayerRequestFor(good.View(), 4, 2, 100, 2),
                                                LayerRequestFor(broken.View(), 4, 2, 100, 2),
                                                LayerRequestFor(good.View(), 4, 2, 100, 0)};
    const absl::StatusOr<std::vector<LayerDecision>> expected =
        DecideModel(policy, options, requests, 1);
    ASSERT_FALSE(expected.ok());
    EXPECT_THAT(expected.status().message(), HasSubstr("37"));
    ENTROKV_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Scorer> scorer, Scorer::Create(0));
    const absl::StatusOr<std::vector<LayerDecision>> actual =
        scorer->DecideModel(policy, options, requests);
    EXPECT_EQ(actual.status(), expected.status()) << "bad value " << bad;
  }
}

TEST(CudaScorerTest, ADeviceThatDoesNotExistIsNamed) {
  const absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) {
    EXPECT_THAT(Scorer::Create(0), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
    return;
  }
  EXPECT_THAT(Scorer::Create(*count),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device")));
  EXPECT_THAT(Scorer::Create(-1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device")));
}

}  // namespace
}  // namespace entrokv::cuda
