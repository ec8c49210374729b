// Issue 12's resource and security cases against the in-process daemon over loopback: models
// come and go without leaking descriptors or metric series, limits answer RESOURCE_EXHAUSTED,
// and nothing changes when a call is refused.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_fixture.h"
#include "tests/service/test_support.h"

namespace entrokv::service {
namespace {

using ::entrokv::service::testing::kGroups;
using ::entrokv::service::testing::kHeads;
using ::entrokv::service::testing::kLayers;
using ::entrokv::service::testing::LoopbackOptions;
using ::entrokv::service::testing::RegisterRequest;
using ::entrokv::service::testing::ServiceTest;
using ::testing::HasSubstr;

int OpenDescriptors() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (const dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.';
  ::closedir(dir);
  return count;
}

// Series of the daemon's registry carrying the label pool=`pool`.
int SeriesOfPool(const Server& server, const std::string& pool) {
  int count = 0;
  for (const prometheus::MetricFamily& family :
       const_cast<Server&>(server).metrics().registry()->Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        count += label.name == "pool" && label.value == pool;
      }
    }
  }
  return count;
}

class HardeningTest : public ServiceTest {
 protected:
  grpc::Status RegisterStatus(const std::string& model) {
    grpc::ClientContext context;
    v1::RegisterModelResponse response;
    return stub_->RegisterModel(&context, RegisterRequest(model, kLayers, kHeads, kGroups, 1 << 16),
                                &response);
  }
  grpc::Status Unregister(const std::string& model, bool force, int64_t* closed = nullptr) {
    grpc::ClientContext context;
    v1::UnregisterModelRequest request;
    request.set_model_id(model);
    request.set_force(force);
    v1::UnregisterModelResponse response;
    const grpc::Status status = stub_->UnregisterModel(&context, request, &response);
    if (closed != nullptr) *closed = response.closed_sequences();
    return status;
  }
};

// Issue 12 #3: every model kept its arena descriptor for good and added ~84 series.
TEST_F(HardeningTest, UnregisteringModelsReleasesDescriptorsAndSeries) {
  ASSERT_TRUE(RegisterStatus("warm").ok());
  ASSERT_TRUE(Unregister("warm", false).ok());
  const int before = OpenDescriptors();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 300; ++i) {
    const std::string model = "m" + std::to_string(i);
    ASSERT_TRUE(RegisterStatus(model).ok()) << i;
    ASSERT_GT(SeriesOfPool(*server_, model), 0);
    Open(model, "s", 40);
    const grpc::Status refused = Unregister(model, /*force=*/false);
    ASSERT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << i;
    EXPECT_THAT(refused.error_message(), HasSubstr("force"));
    EXPECT_EQ(Stats(model).sequences_active(), 1);  // the refusal changed nothing
    int64_t closed = 0;
    ASSERT_TRUE(Unregister(model, /*force=*/true, &closed).ok()) << i;
    EXPECT_EQ(closed, 1);
    EXPECT_EQ(SeriesOfPool(*server_, model), 0) << model;
  }
  EXPECT_LE(OpenDescriptors(), before + 4);
  EXPECT_EQ(server_->service().registry().size(), 0);
  // The id can be taken again, with a fresh pool.
  ASSERT_TRUE(RegisterStatus("m0").ok());
  EXPECT_EQ(Stats("m0").sequences_active(), 0);
  EXPECT_EQ(Unregister("nope", true).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HardeningTest, MaxModelsIsAnsweredWithResourceExhausted) {
  ServerOptions options = LoopbackOptions();
  options.max_models = 2;
  Restart(options);
  ASSERT_TRUE(RegisterStatus("a").ok());
  ASSERT_TRUE(RegisterStatus("b").ok());
  const grpc::Status full = RegisterStatus("c");
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("max_models"));
  ASSERT_TRUE(Unregister("a", false).ok());
  EXPECT_TRUE(RegisterStatus("c").ok());
}

}  // namespace
}  // namespace entrokv::service
