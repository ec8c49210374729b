// The values device_buffer_exporter writes, so the GPU test can send the same ones inline.
#ifndef ENTROKV_TESTS_SERVICE_DEVICE_BUFFER_VALUES_H_
#define ENTROKV_TESTS_SERVICE_DEVICE_BUFFER_VALUES_H_

#include <cstddef>
#include <cstdint>

namespace entrokv::testing {

// Non-negative, distinct enough that every page scores differently.
inline float ExporterValue(size_t i) {
  return static_cast<float>((static_cast<uint64_t>(i) * 2654435761u) % 1000u) / 1000.0f + 0.001f;
}

}  // namespace entrokv::testing

#endif  // ENTROKV_TESTS_SERVICE_DEVICE_BUFFER_VALUES_H_
