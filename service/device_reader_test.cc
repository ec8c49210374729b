// DeviceReader's cache against a fake device (host buffers stand in for other processes'
// allocations): what is mapped, when it is mapped again, and when it is released. The real
// mapping is tested on a GPU (tests/service/device_buffer_gpu_test.cc).
#include "service/device_reader.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv::service {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

// Allocations by handle; counts what is open. Shared with the test, which outlives the reader.
struct FakeDevice {
  std::map<std::string, std::vector<char>> allocations;  // handle -> bytes
  int opened = 0;
  int closed = 0;
  [[nodiscard]] int open_now() const { return opened - closed; }
};

class FakeMemory final : public DeviceMemory {
 public:
  explicit FakeMemory(FakeDevice* device) : device_(device) {}
  absl::StatusOr<Mapping> Open(absl::string_view field, absl::string_view handle,
                               int device) override {
    auto it = device_->allocations.find(std::string(handle));
    if (it == device_->allocations.end()) {
      return absl::FailedPreconditionError(absl::StrCat(field, ": no such allocation"));
    }
    ++device_->opened;
    return Mapping{.device = device, .base = it->second.data(), .bytes = it->second.size()};
  }
  void Close(const Mapping&) override { ++device_->closed; }
  absl::Status CopyToHost(absl::string_view, const Mapping& mapping, uint64_t offset,
                          uint64_t length, char* out) override {
    std::memcpy(out, static_cast<const char*>(mapping.base) + offset, length);
    return absl::OkStatus();
  }

 private:
  FakeDevice* device_;
};

std::string Handle(char fill) { return std::string(64, fill); }

v1::DeviceBufferRegion Region(const std::string& handle, uint64_t offset, uint64_t length,
                              uint64_t generation = 0) {
  v1::DeviceBufferRegion region;
  region.set_cuda_ipc_handle(handle);
  region.set_offset_bytes(offset);
  region.set_length_bytes(length);
  region.set_generation(generation);
  return region;
}

constexpr char kField[] = "layers[3].statistic.device_buffer";

class DeviceReaderTest : public ::testing::Test {
 protected:
  DeviceReaderTest() {
    device_.allocations[Handle('a')] = std::vector<char>(64);
    device_.allocations[Handle('b')] = std::vector<char>(64);
    device_.allocations[Handle('c')] = std::vector<char>(64);
    for (int i = 0; i < 64; ++i) device_.allocations[Handle('a')][i] = static_cast<char>(i);
  }
  std::unique_ptr<DeviceReader> Reader(int max_mappings = 64) {
    return std::make_unique<DeviceReader>(std::make_unique<FakeMemory>(&device_), max_mappings);
  }
  FakeDevice device_;
};

TEST(CheckDeviceRegionTest, NamesTheFieldOfEachBadInput) {
  EXPECT_THAT(CheckDeviceRegion(kField, Region("short", 0, 16), 16, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("layers[3].statistic.device_buffer.cuda_ipc_handle: 5 bytes")));
  EXPECT_THAT(CheckDeviceRegion(kField, Region(Handle('a'), 0, 12), 16, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_buffer.length_bytes: 12, expected 16")));
  EXPECT_THAT(CheckDeviceRegion(kField, Region(Handle('a'), 2, 16), 16, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_buffer.offset_bytes: 2 is not element-aligned")));
  EXPECT_THAT(
      CheckDeviceRegion(kField, Region(Handle('a'), UINT64_MAX - 3, 16), 16, 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_buffer.offset_bytes")));
  v1::DeviceBufferRegion negative = Region(Handle('a'), 0, 16);
  negative.set_device(-1);
  EXPECT_THAT(CheckDeviceRegion(kField, negative, 16, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_buffer.device: -1 is negative")));
  EXPECT_THAT(CheckDeviceRegion(kField, Region(Handle('a'), 8, 16), 16, 4), IsOk());
}

TEST_F(DeviceReaderTest, MapsOncePerAllocationAndReadsTheRange) {
  auto reader = Reader();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<DeviceStatistic> stat =
        reader->Acquire(kField, Region(Handle('a'), 8, 16), 16, 4, "m", "s");
    ASSERT_THAT(stat.status(), IsOk());
    std::vector<char> out(16);
    ASSERT_THAT(stat->CopyToHost(out.data()), IsOk());
    EXPECT_EQ(out[0], 8);
    EXPECT_EQ(out[15], 23);
  }
  EXPECT_EQ(device_.opened, 1);
  EXPECT_EQ(reader->mapped(), 1);
}

TEST_F(DeviceReaderTest, BadRegionMapsNothing) {
  auto reader = Reader();
  EXPECT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 12), 16, 4, "m", "s").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("length_bytes")));
  EXPECT_EQ(device_.opened, 0);
  EXPECT_EQ(reader->mapped(), 0);
}

TEST_F(DeviceReaderTest, RangeOutsideTheAllocationIsRefusedAndUnmapped) {
  auto reader = Reader();
  EXPECT_THAT(reader->Acquire(kField, Region(Handle('a'), 56, 16), 16, 4, "m", "s").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_buffer.offset_bytes: [56, 56 + 16) is outside the "
                                 "allocation of 64 bytes")));
  EXPECT_EQ(device_.open_now(), 0);
  EXPECT_EQ(reader->mapped(), 0);
}

TEST_F(DeviceReaderTest, OpenFailureKeepsNothing) {
  auto reader = Reader();
  EXPECT_THAT(reader->Acquire(kField, Region(Handle('z'), 0, 16), 16, 4, "m", "s").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("device_buffer.cuda_ipc_handle: no such allocation")));
  EXPECT_EQ(reader->mapped(), 0);
}

TEST_F(DeviceReaderTest, NewerGenerationRemapsOlderIsRefused) {
  auto reader = Reader();
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16, 1), 16, 4, "m", "s").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16, 2), 16, 4, "m", "s").status(),
              IsOk());
  EXPECT_EQ(device_.opened, 2);
  EXPECT_EQ(device_.closed, 1);  // generation 1's mapping
  EXPECT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16, 1), 16, 4, "m", "s").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("device_buffer.generation: 1 is older than generation 2")));
  EXPECT_EQ(device_.opened, 2);
  EXPECT_EQ(reader->mapped(), 1);
}

TEST_F(DeviceReaderTest, ReleasedWhenTheLastSequenceUsingItCloses) {
  auto reader = Reader();
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s1").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s2").status(),
              IsOk());
  reader->ReleaseSequence("m", "s1");
  EXPECT_EQ(device_.open_now(), 1);
  reader->ReleaseSequence("other", "s2");  // another model's sequence of the same name
  EXPECT_EQ(device_.open_now(), 1);
  reader->ReleaseSequence("m", "s2");
  EXPECT_EQ(device_.open_now(), 0);
  EXPECT_EQ(reader->mapped(), 0);
}

TEST_F(DeviceReaderTest, ReleasedWhenTheModelGoes) {
  auto reader = Reader();
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s1").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('b'), 0, 16), 16, 4, "m", "s2").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('c'), 0, 16), 16, 4, "n", "s1").status(),
              IsOk());
  reader->ReleaseModel("m");
  EXPECT_EQ(device_.open_now(), 1);
  EXPECT_EQ(reader->mapped(), 1);
}

TEST_F(DeviceReaderTest, ADecisionStillReadingKeepsItsMapping) {
  auto reader = Reader();
  absl::StatusOr<DeviceStatistic> stat =
      reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s");
  ASSERT_THAT(stat.status(), IsOk());
  reader->ReleaseSequence("m", "s");
  EXPECT_EQ(reader->mapped(), 0);
  EXPECT_EQ(device_.open_now(), 1);
  std::vector<char> out(16);
  EXPECT_THAT(stat->CopyToHost(out.data()), IsOk());
  stat = absl::CancelledError("done");
  EXPECT_EQ(device_.open_now(), 0);
}

TEST_F(DeviceReaderTest, BoundedLeastRecentlyUsedGoesFirst) {
  auto reader = Reader(/*max_mappings=*/2);
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('b'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('c'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  EXPECT_EQ(reader->mapped(), 2);
  EXPECT_EQ(device_.open_now(), 2);
  // 'b' went: mapping it again opens it again; 'a' is still mapped.
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  EXPECT_EQ(device_.opened, 3);
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('b'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  EXPECT_EQ(device_.opened, 4);
}

TEST_F(DeviceReaderTest, DestroyingTheReaderReleasesEverything) {
  auto reader = Reader();
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('a'), 0, 16), 16, 4, "m", "s").status(),
              IsOk());
  ASSERT_THAT(reader->Acquire(kField, Region(Handle('b'), 0, 16), 16, 4, "m", "t").status(),
              IsOk());
  reader.reset();
  EXPECT_EQ(device_.open_now(), 0);
}

}  // namespace
}  // namespace entrokv::service
