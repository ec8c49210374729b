#include "service/metrics.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace entrokv::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Render(ServiceMetrics& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
}

TEST(ServiceMetricsTest, EveryFamilyOfTheArchitectureIsRegistered) {
  ServiceMetrics metrics;
  metrics.AddPool("m", 12, 2);
  const std::string text = Render(metrics);
  for (const char* family :
       {"entrokv_pool_frames", "entrokv_pool_capacity_bytes", "entrokv_pool_device_bytes",
        "entrokv_pool_bookkeeping_bytes", "entrokv_sequences_active", "entrokv_decisions_total",
        "entrokv_pages_evicted_total", "entrokv_pages_retained_total",
        "entrokv_union_overhead_ratio", "entrokv_group_disagreement", "entrokv_page_union_ratio",
        "entrokv_retained_mass_ratio", "entrokv_group_scope_page_union_ratio",
        "entrokv_layer_scope_frames_saved_total", "entrokv_decision_duration_seconds",
        "entrokv_stats_bytes_total", "entrokv_rpc_requests_total",
        "entrokv_rpc_duration_seconds"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + family + " ")) << family;
  }
}

TEST(ServiceMetricsTest, StartUpSeriesExistBeforeAnyTraffic) {
  ServiceMetrics metrics;
  const std::string text = Render(metrics);
  EXPECT_THAT(text, HasSubstr("entrokv_rpc_requests_total{code=\"OK\",method=\"Decide\"} 0"));
  EXPECT_THAT(text, HasSubstr("phase=\"apply\""));
  EXPECT_THAT(text, HasSubstr("entrokv_stats_bytes_total{source=\"shared_memory\"} 0"));
}

TEST(ServiceMetricsTest, PoolSeriesAppearOnceWithBucketsUpToTheGroupSize) {
  ServiceMetrics metrics;
  PoolMetrics* a = metrics.AddPool("m", 12, 2);
  EXPECT_EQ(metrics.AddPool("m", 12, 2), a);
  a->union_overhead_ratio->Observe(3.0);
  const std::string text = Render(metrics);
  EXPECT_THAT(text, HasSubstr("entrokv_union_overhead_ratio_bucket{pool=\"m\",le=\"6\"} 1"));
  EXPECT_THAT(text, HasSubstr("entrokv_pool_frames{pool=\"m\",state=\"free\"}"));
  EXPECT_THAT(text, HasSubstr("policy=\"page_entrokv\""));
}

TEST(ServiceMetricsTest, RecordsRpcsByMethodAndCode) {
  ServiceMetrics metrics;
  metrics.RecordRpc(Method::kOpenSequence, grpc::StatusCode::ALREADY_EXISTS, 0.001);
  EXPECT_THAT(Render(metrics),
              HasSubstr("entrokv_rpc_requests_total{code=\"ALREADY_EXISTS\",method="
                        "\"OpenSequence\"} 1"));
}

}  // namespace
}  // namespace entrokv::service
