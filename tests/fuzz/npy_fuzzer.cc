// The .npy reader (ParseNpy, what ReadNpy does with a file's bytes). Whatever it accepts must
// hold exactly product(shape) elements; the product must not overflow on the way.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/io/npy.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace entrokv;
  const std::string contents(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<NpyArray> array = ParseNpy(contents);
  if (!array.ok()) {
    FUZZ_CHECK(array.status().code() == absl::StatusCode::kInvalidArgument,
               array.status().ToString());
    return 0;
  }
  uint64_t elements = 1;
  for (const int64_t dim : array->shape) {
    FUZZ_CHECK(dim >= 0, "negative dimension");
    FUZZ_CHECK(!__builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements),
               "accepted a shape whose element count overflows");
  }
  const uint64_t element_bytes = array->type == NpyType::kFloat32 ? 4 : 2;
  FUZZ_CHECK(elements <= array->bytes.size() && elements * element_bytes == array->bytes.size(),
             absl::StrCat(elements, " elements but ", array->bytes.size(), " bytes"));
  FUZZ_CHECK(static_cast<uint64_t>(array->element_count()) == elements, "element_count()");
  return 0;
}
