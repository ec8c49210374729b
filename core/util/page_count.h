// The number of pages a sequence spans: the one place "pages = ceil(T / B)" is written.
#ifndef ENTROKV_CORE_UTIL_PAGE_COUNT_H_
#define ENTROKV_CORE_UTIL_PAGE_COUNT_H_

#include <cstdint>

namespace entrokv {

// ceil(tokens / page_size): page b covers tokens [bB, min((b+1)B, T)), the last one possibly
// partial. REQUIRES: page_size > 0, tokens >= 0, tokens + page_size does not overflow.
[[nodiscard]] constexpr int64_t PageCount(int64_t tokens, int64_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

}  // namespace entrokv

#endif  // ENTROKV_CORE_UTIL_PAGE_COUNT_H_
