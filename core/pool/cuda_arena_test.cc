// The cuda backend on a real device; skipped where there is none (or CUDA was not built in).
#include <cstdint>
#include <vector>

#include "core/pool/arena.h"
#include "core/pool/cache_state.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

#ifdef ENTROKV_POOL_HAVE_CUDA
#include "core/cuda/device.h"
#include "core/cuda/memory.h"
#endif

namespace entrokv {
namespace {

using ::entrokv::testing::IsOk;
using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CudaArenaTest, WithoutADeviceCreateFailsCleanly) {
  CacheOptions options;
  options.geometry = {.layers = 1,
                      .query_heads = 2,
                      .kv_groups = 1,
                      .head_dim = 8,
                      .page_size = 4,
                      .element_bytes = 2};
  options.backend = Backend::kCuda;
  options.capacity_bytes = 4 * FrameBytes(options.geometry, FrameLayout::kGroup);
#ifndef ENTROKV_POOL_HAVE_CUDA
  EXPECT_THAT(CacheState::Create(options),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("cuda was not built in")));
#else
  if (cuda::DeviceCount().ok()) GTEST_SKIP() << "a device exists";
  EXPECT_THAT(CacheState::Create(options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cuda")));
#endif
}

TEST(CudaArenaTest, DeviceArenaExportsAnIpcHandleAndCopiesFrames) {
#ifndef ENTROKV_POOL_HAVE_CUDA
  GTEST_SKIP() << "CUDA was not built in";
#else
  if (!cuda::DeviceCount().ok()) GTEST_SKIP() << "no CUDA device";
  CacheOptions options;
  options.geometry = {.layers = 2,
                      .query_heads = 8,
                      .kv_groups = 2,
                      .head_dim = 64,
                      .page_size = 16,
                      .element_bytes = 2};
  options.backend = Backend::kCuda;
  options.capacity_bytes = 32 * FrameBytes(options.geometry, FrameLayout::kGroup);
  options.name = "cuda_test";
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  const ArenaInfo info = state->arena();
  EXPECT_EQ(info.backend, Backend::kCuda);
  EXPECT_EQ(info.ipc_handle.size(), static_cast<size_t>(cuda::kIpcHandleBytes));
  EXPECT_EQ(info.bytes, options.capacity_bytes);
  EXPECT_GE(info.device, 0);

  // A forked sequence's append into the shared tail copies the frame on the device. 20 tokens
  // at B = 16 make two pages, the tail (page 1) holding 4 tokens, so a fork of both pages
  // shares a partial tail.
  ASSERT_THAT(state->OpenSequence("p", 20), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequenceInfo parent, state->GetSequence("p"));
  const FrameId parent_tail = parent.block_tables[1][1][1];
  const int64_t frame_bytes = state->Stats().frame_bytes;
  std::vector<uint8_t> pattern(frame_bytes);
  for (int64_t i = 0; i < frame_bytes; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_THAT(cuda::CopyToDevice(state->FrameAddress(parent_tail), pattern.data(), frame_bytes),
              IsOk());
  ASSERT_THAT(state->ForkSequence("c", "p", 2), IsOk());
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, state->AppendTokens("c", 1));
  EXPECT_EQ(appended.frames_copied, 4);
  ENTROKV_ASSERT_OK_AND_ASSIGN(SequenceInfo child, state->GetSequence("c"));
  const FrameId child_tail = child.block_tables[1][1][1];
  ASSERT_NE(child_tail, parent_tail);
  std::vector<uint8_t> back(frame_bytes);
  ASSERT_THAT(cuda::CopyToHost(back.data(), state->FrameAddress(child_tail), frame_bytes), IsOk());
  EXPECT_EQ(back, pattern);
  EXPECT_THAT(state->CheckInvariants(), IsOk());
#endif
}

}  // namespace
}  // namespace entrokv
