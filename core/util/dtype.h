// Element types a statistic may arrive in, and their conversion to float32.
#ifndef ENTROKV_CORE_UTIL_DTYPE_H_
#define ENTROKV_CORE_UTIL_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16 };

// Bytes per element.
[[nodiscard]] constexpr int DTypeBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
[[nodiscard]] absl::string_view DTypeName(DType dtype);
// Accepts "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16".
[[nodiscard]] absl::StatusOr<DType> ParseDType(absl::string_view name);

// bfloat16 is the upper half of a float32: widening is exact.
[[nodiscard]] inline float BFloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// IEEE binary16 to float32, exact for every input including subnormals, inf and NaN.
[[nodiscard]] inline float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t wide;
  if (exponent == 0x1f) {
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    wide = sign;
  } else {
    // Subnormal: shift the mantissa up until its leading one is the implicit bit.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    wide = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Rounds to nearest even; used by tests and the simulator to make half-precision inputs.
[[nodiscard]] uint16_t FloatToBFloat16(float value);
[[nodiscard]] uint16_t FloatToFloat16(float value);

// Widens `count` elements of `dtype` at `src` into `dst`.
void WidenToFloat(const void* src, DType dtype, int64_t count, float* dst);

}  // namespace entrokv

#endif  // ENTROKV_CORE_UTIL_DTYPE_H_
