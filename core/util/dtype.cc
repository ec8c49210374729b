#include "core/util/dtype.h"

#include <array>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace entrokv {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "f32" || name == "float32") return DType::kFloat32;
  if (name == "f16" || name == "float16") return DType::kFloat16;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: '", name, "' is not one of f32, f16, bf16"));
}

uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t FloatToFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs_bits > 0x7f800000u ? 0x200u : 0));
  }
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: inf
  if (abs_bits < 0x33000001u) return sign;             // below half the smallest subnormal
  int exponent = static_cast<int>(abs_bits >> 23) - 127;
  uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
  int shift;  // how far the 24-bit mantissa moves right to become 11 (or fewer) bits
  uint32_t biased;
  if (exponent < -14) {
    shift = 13 + (-14 - exponent);
    biased = 0;
  } else {
    shift = 13;
    biased = static_cast<uint32_t>(exponent + 15);
  }
  uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u))) ++kept;
  // For normals kept includes the implicit bit (0x400); adding biased<<10 and
  // subtracting 0x400 lets a mantissa overflow carry into the exponent.
  uint32_t result = biased == 0 ? kept : ((biased << 10) + kept - 0x400u);
  return static_cast<uint16_t>(sign | result);
}

namespace {

// Every float16 value widened once: a long row is then one load per element, not the branches
// of Float16ToFloat. 256 KiB, built on first use.
const float* Float16Table() {
  static const std::unique_ptr<const std::array<float, 65536>> table = [] {
    auto values = std::make_unique<std::array<float, 65536>>();
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      (*values)[bits] = Float16ToFloat(static_cast<uint16_t>(bits));
    }
    return std::unique_ptr<const std::array<float, 65536>>(std::move(values));
  }();
  return table->data();
}

}  // namespace

void WidenToFloat(const void* src, DType dtype, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16: {
      const auto* in = static_cast<const uint16_t*>(src);
      const float* table = Float16Table();
      for (int64_t i = 0; i < count; ++i) dst[i] = table[in[i]];
      return;
    }
    case DType::kBFloat16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = BFloat16ToFloat(in[i]);
      return;
    }
  }
}

}  // namespace entrokv
