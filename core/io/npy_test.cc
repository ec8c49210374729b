#include "core/io/npy.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".npy"))
      .string();
}

TEST(NpyTest, WriteThenReadRoundTrips) {
  NpyArray array;
  array.type = NpyType::kFloat32;
  array.shape = {2, 3};
  const float values[6] = {0.f, 1.f, 2.5f, -3.f, 4.f, 1e-9f};
  array.bytes.assign(reinterpret_cast<const uint8_t*>(values),
                     reinterpret_cast<const uint8_t*>(values) + sizeof(values));
  const std::string path = TempPath("roundtrip");
  ASSERT_TRUE(WriteNpy(path, array).ok());
  ENTROKV_ASSERT_OK_AND_ASSIGN(NpyArray read, ReadNpy(path));
  EXPECT_EQ(read.type, NpyType::kFloat32);
  EXPECT_EQ(read.shape, array.shape);
  EXPECT_EQ(read.bytes, array.bytes);
  std::remove(path.c_str());
}

TEST(NpyTest, ReadsOneDimensionalAndHalfPrecision) {
  NpyArray array;
  array.type = NpyType::kUInt16;
  array.shape = {4};
  array.bytes.assign(8, 0x3c);
  const std::string path = TempPath("half");
  ASSERT_TRUE(WriteNpy(path, array).ok());
  ENTROKV_ASSERT_OK_AND_ASSIGN(NpyArray read, ReadNpy(path));
  EXPECT_EQ(read.type, NpyType::kUInt16);
  EXPECT_EQ(read.shape, std::vector<int64_t>{4});
  std::remove(path.c_str());
}

TEST(NpyTest, ParsesAHeaderAsNumpyWritesIt) {
  std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(header.size()));
  file.push_back('\0');
  file += header;
  file += std::string("\x00\x3c\x00\x40", 4);
  ENTROKV_ASSERT_OK_AND_ASSIGN(NpyArray read, ParseNpy(file));
  EXPECT_EQ(read.type, NpyType::kFloat16);
  EXPECT_EQ(read.shape, (std::vector<int64_t>{1, 2}));
}

TEST(NpyTest, RejectsMalformedFilesWithAReason) {
  EXPECT_THAT(ParseNpy("not numpy at all"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  auto with_header = [](const std::string& dict, const std::string& data) {
    std::string file = std::string("\x93NUMPY\x01\x00", 8);
    file.push_back(static_cast<char>(dict.size()));
    file.push_back('\0');
    return file + dict + data;
  };
  EXPECT_THAT(ParseNpy(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
                                   std::string(8, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(ParseNpy(with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                                   std::string(4, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(ParseNpy(with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                                   std::string(4, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Fortran")));
  EXPECT_THAT(ParseNpy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                                   std::string(4, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
  // Found by tests/fuzz/npy_fuzzer (corpus/npy/regress-shape-overflow): 4 * 2**62 elements
  // wrapped to 0, so an empty file passed as a 4 x 2**62 array.
  EXPECT_THAT(
      ParseNpy(with_header(
          "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4611686018427387904), }", "")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("addressed")));
  EXPECT_THAT(ReadNpy("/nonexistent/file.npy"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

}  // namespace
}  // namespace entrokv
