// Reads a fuzz input front to back: fixed-width little-endian fields and byte strings. Running
// out of bytes yields zeros and empty strings, so every input, however short, is a valid one.
#ifndef ENTROKV_TESTS_FUZZ_FUZZ_INPUT_H_
#define ENTROKV_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace entrokv::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  [[nodiscard]] uint64_t TakeLe(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes && size_ > 0; ++i) {
      value |= static_cast<uint64_t>(*data_) << (8 * i);
      ++data_;
      --size_;
    }
    return value;
  }
  [[nodiscard]] uint8_t TakeByte() { return static_cast<uint8_t>(TakeLe(1)); }
  // At most `count` bytes (fewer when the input ends).
  [[nodiscard]] std::string TakeBytes(size_t count) {
    if (count > size_) count = size_;
    std::string out(reinterpret_cast<const char*>(data_), count);
    data_ += count;
    size_ -= count;
    return out;
  }
  // A string whose length is the next little-endian u16.
  [[nodiscard]] std::string TakeLengthPrefixed() { return TakeBytes(TakeLe(2)); }
  [[nodiscard]] std::string TakeRest() { return TakeBytes(size_); }
  [[nodiscard]] size_t remaining() const { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace entrokv::fuzz

// Every fuzz target defines it; libFuzzer (-DENTROKV_FUZZ=ON) or replay_main.cc calls it.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // ENTROKV_TESTS_FUZZ_FUZZ_INPUT_H_
