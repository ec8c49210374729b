#include "service/shm_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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
using ::testing::_;
using ::testing::HasSubstr;

// A segment of this test's own, named per process and test, holding `bytes`; unlinked at the end.
class Segment {
 public:
  Segment(const std::string& tag, const std::string& bytes)
      : name_(absl::StrCat("/entrokv-shm-reader-test-", ::getpid(), "-", tag)) {
    Write(bytes);
  }
  ~Segment() { ::shm_unlink(name_.c_str()); }

  // Replaces the name's object with a new one holding `bytes` (the old object lives on for
  // whoever holds it open).
  void Replace(const std::string& bytes) {
    ::shm_unlink(name_.c_str());
    Write(bytes);
  }
  void Truncate(off_t size) {
    const int fd = ::shm_open(name_.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, size), 0);
    ::close(fd);
  }
  const std::string& name() const { return name_; }

 private:
  void Write(const std::string& bytes) {
    const int fd = ::shm_open(name_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }

  std::string name_;
};

std::string ReadAll(const ShmSegment& segment, uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  EXPECT_THAT(segment.Read("f", offset, length, out.data()), IsOk());
  return out;
}

// The daemon checks a request's segment, scores other layers, then copies: what it copies must
// be the object its checks passed, even when the worker's name now points at another one.
TEST(ShmReaderTest, AHeldSegmentReadsTheObjectItsChecksPassed) {
  Segment segment("held", "checked bytes");
  const ShmReader reader;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ShmSegment held, reader.Open("layers[0]", segment.name()));
  EXPECT_EQ(held.name(), segment.name());
  EXPECT_THAT(held.CheckRange("layers[0]", 0, 13), IsOk());
  segment.Replace("another object, longer than the first");
  EXPECT_EQ(ReadAll(held, 0, 13), "checked bytes");
  EXPECT_EQ(ReadAll(held, 8, 5), "bytes");
  // Opened again, the name gives the new object.
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ShmSegment reopened, reader.Open("layers[0]", segment.name()));
  EXPECT_EQ(ReadAll(reopened, 0, 7), "another");
}

TEST(ShmReaderTest, ARangeOutsideTheSegmentIsRefusedNamingTheField) {
  Segment segment("range", std::string(100, 'x'));
  const ShmReader reader;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ShmSegment held, reader.Open("stat", segment.name()));
  EXPECT_THAT(held.CheckRange("stat", 0, 100), IsOk());
  EXPECT_THAT(held.CheckRange("stat", 100, 0), IsOk());
  EXPECT_THAT(held.CheckRange("stat.shared_memory", 60, 41),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stat.shared_memory: [60, 60 + 41) is outside segment")));
  EXPECT_THAT(held.CheckRange("stat", 101, 0), StatusIs(absl::StatusCode::kInvalidArgument, _));
  // An offset near 2^64 does not wrap around the check.
  EXPECT_THAT(held.CheckRange("stat", ~uint64_t{0} - 10, 20),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST(ShmReaderTest, ASegmentThatShrankWhileHeldIsAFailedPreconditionNotACrash) {
  Segment segment("shrunk", std::string(4096, 'y'));
  const ShmReader reader;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const ShmSegment held, reader.Open("stat", segment.name()));
  ASSERT_THAT(held.CheckRange("stat", 0, 4096), IsOk());
  segment.Truncate(1000);  // the same object, shrunk by its owner
  std::string out(4096, '\0');
  EXPECT_THAT(held.Read("stat", 0, 4096, out.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shrank")));
}

TEST(ShmReaderTest, BadNamesAndMissingSegmentsAreRefused) {
  const ShmReader reader;
  EXPECT_THAT(reader.Open("stat", "/other-prefix").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stat.segment")));
  EXPECT_THAT(reader.Open("stat", "/entrokv/sub").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(reader.Open("stat", absl::StrCat("/entrokv-missing-", ::getpid())).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("stat.segment")));
}

}  // namespace
}  // namespace entrokv::service
