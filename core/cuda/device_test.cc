#include "core/cuda/device.h"

#include "gtest/gtest.h"

namespace entrokv::cuda {
namespace {

TEST(CudaDeviceTest, DescribesEveryDevice) {
  const absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) GTEST_SKIP() << "no GPU here: " << count.status();
  for (int i = 0; i < *count; ++i) {
    const absl::StatusOr<std::string> description = DescribeDevice(i);
    ASSERT_TRUE(description.ok()) << description.status();
    EXPECT_NE(description->find("sm_"), std::string::npos);
  }
}

}  // namespace
}  // namespace entrokv::cuda
