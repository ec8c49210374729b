// Reading and writing NumPy .npy files (format 1.0-3.0), little-endian, C order.
#ifndef ENTROKV_CORE_IO_NPY_H_
#define ENTROKV_CORE_IO_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace entrokv {

enum class NpyType : uint8_t { kFloat32, kFloat16, kUInt16 };

// An array as read from disk: raw little-endian element bytes plus the header's description.
struct NpyArray {
  NpyType type = NpyType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // product(shape) * element size

  [[nodiscard]] int64_t element_count() const;
};

// INVALID_ARGUMENT naming what is wrong (magic, header, dtype, fortran order, size) for a
// malformed file; NOT_FOUND when it cannot be opened. Accepts '<f4', '<f2', '<u2'.
[[nodiscard]] absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
[[nodiscard]] absl::StatusOr<NpyArray> ParseNpy(const std::string& contents);

// Writes `array` as a version 1.0 file.
[[nodiscard]] absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace entrokv

#endif  // ENTROKV_CORE_IO_NPY_H_
