// The statistic decoder: bytes of any dtype -> float rows (StatisticView::Create, Row,
// ValidateValues, WidenToFloat), checked element by element against an independent decoding.
//
// Input: dtype selector, query_heads - 1 (0..7), then the values; tokens is what fits. The
// values are copied into a buffer of exactly that size, so a read past a row shows under ASan.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/scoring/statistic.h"
#include "core/util/dtype.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_input.h"

namespace entrokv::fuzz {
namespace {

// IEEE binary16 by its definition (not by bit manipulation, as the decoder does it).
float ReferenceFloat16(uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
  }
  return sign ? -magnitude : magnitude;
}

float Reference(const uint8_t* element, DType dtype) {
  if (dtype == DType::kFloat32) {
    float value;
    std::memcpy(&value, element, sizeof(value));
    return value;
  }
  const uint16_t bits = static_cast<uint16_t>(element[0] | (element[1] << 8));
  if (dtype == DType::kFloat16) return ReferenceFloat16(bits);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace
}  // namespace entrokv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace entrokv;
  fuzz::FuzzInput input(data, size);
  const DType dtype = static_cast<DType>(input.TakeByte() % 3);
  const int query_heads = 1 + input.TakeByte() % 8;
  const std::string values = input.TakeRest();
  const int64_t tokens =
      static_cast<int64_t>(values.size()) / (int64_t{query_heads} * DTypeBytes(dtype));
  if (tokens == 0) {
    // No whole row: Create must refuse zero tokens rather than make an empty view.
    FUZZ_CHECK(!StatisticView::Create(values.data(), dtype, query_heads, 0).ok(), "tokens == 0");
    return 0;
  }
  const size_t bytes = static_cast<size_t>(query_heads * tokens * DTypeBytes(dtype));
  // float-aligned, exactly `bytes` long (rounded up to whole floats for the allocation only).
  std::unique_ptr<float[]> buffer(new float[(bytes + 3) / 4]);
  std::memcpy(buffer.get(), values.data(), bytes);
  absl::StatusOr<StatisticView> view =
      StatisticView::Create(buffer.get(), dtype, query_heads, tokens);
  FUZZ_CHECK(view.ok(), view.status().ToString());

  bool all_valid = true;
  std::vector<float> scratch;
  const auto* raw = reinterpret_cast<const uint8_t*>(buffer.get());
  for (int h = 0; h < query_heads; ++h) {
    const std::span<const float> row = view->Row(h, &scratch);
    FUZZ_CHECK(static_cast<int64_t>(row.size()) == tokens, "row length");
    for (int64_t t = 0; t < tokens; ++t) {
      const float expected = fuzz::Reference(raw + (h * tokens + t) * DTypeBytes(dtype), dtype);
      FUZZ_CHECK(fuzz::SameFloat(row[t], expected),
                 absl::StrCat("head ", h, " token ", t, ": ", row[t], " != ", expected));
      all_valid = all_valid && expected >= 0.0f && std::isfinite(expected);
    }
  }
  const absl::Status valid = view->ValidateValues();
  FUZZ_CHECK(valid.ok() == all_valid, valid.ToString());
  return 0;
}
