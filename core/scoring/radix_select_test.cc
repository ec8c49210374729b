#include "core/scoring/radix_select.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

// The sort reference: order by (key desc, index asc), take `quota`, ascending.
std::vector<int32_t> SortReference(const std::vector<uint32_t>& keys, int64_t quota) {
  std::vector<int32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return keys[a] > keys[b]; });
  order.resize(static_cast<size_t>(quota));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> Radix(const std::vector<uint32_t>& keys, int64_t quota) {
  std::vector<uint32_t> work(keys.size());
  std::vector<int32_t> kept;
  KeepLargestKeys(keys.data(), static_cast<int64_t>(keys.size()), quota, work.data(), &kept);
  return kept;
}

// Key sets that stress each part of the select: uniform bits, one binade (scores sharing their
// exponent), few distinct values (ties cut at the boundary), all equal, protected pages (bit 31)
// among plain ones, sorted runs, and keys differing in the lowest bit only.
std::vector<uint32_t> Keys(int shape, int64_t pages, std::mt19937_64& rng) {
  std::vector<uint32_t> keys(static_cast<size_t>(pages));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t i = 0; i < pages; ++i) {
    uint32_t& key = keys[static_cast<size_t>(i)];
    switch (shape) {
      case 0:
        key = static_cast<uint32_t>(rng());
        break;
      case 1:
        key = std::bit_cast<uint32_t>(1.0f + unit(rng));  // one binade
        break;
      case 2:
        key = static_cast<uint32_t>(rng() % 3) * 1000u;  // three values
        break;
      case 3:
        key = 7;  // all equal
        break;
      case 4:
        key = (rng() % 5 == 0 ? 0x80000000u : 0u) | static_cast<uint32_t>(rng() % 4);
        break;
      case 5:
        key = static_cast<uint32_t>(i);  // ascending: the boundary at the end
        break;
      default:
        key = 0x3f800000u | static_cast<uint32_t>(rng() % 2);  // lowest bit only
        break;
    }
  }
  return keys;
}

TEST(RadixSelectTest, MatchesTheSortReferenceOnRandomAndAdversarialKeys) {
  std::mt19937_64 rng(20261130);
  for (int trial = 0; trial < 3000; ++trial) {
    const int shape = trial % 7;
    const int64_t pages = trial % 10 == 0 ? 2 + static_cast<int64_t>(rng() % 20000)
                                          : 2 + static_cast<int64_t>(rng() % 300);
    const std::vector<uint32_t> keys = Keys(shape, pages, rng);
    const int64_t quota = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(pages - 1));
    ASSERT_EQ(Radix(keys, quota), SortReference(keys, quota))
        << "trial " << trial << " shape " << shape << " pages " << pages << " quota " << quota;
  }
}

TEST(RadixSelectTest, KeysOrderAsTheScoresAndZeroesAreEqual) {
  const std::vector<float> scores = {0.0f, -0.0f, 1e-30f, 0.5f, 0.25f, 3e38f};
  std::vector<uint32_t> keys(scores.size());
  FillKeys(scores.data(), static_cast<int64_t>(scores.size()), keys.data());
  EXPECT_EQ(keys[0], keys[1]);
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      EXPECT_EQ(scores[i] < scores[j], keys[i] < keys[j]) << i << " " << j;
    }
  }
  std::vector<int32_t> all;
  KeepAllPages(4, &all);
  EXPECT_THAT(all, ::testing::ElementsAre(0, 1, 2, 3));
}

}  // namespace
}  // namespace entrokv
