// The host backend: a forked child maps the arena by name and by fd, reads what the parent
// wrote, and writes back bytes the parent then sees; generated names never collide.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"
#include "core/pool/cache_state.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace entrokv {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kBytes = 1 << 20;

uint8_t Pattern(int64_t i) { return static_cast<uint8_t>((i * 131 + 7) & 0xFF); }

// Runs `child` in a forked process; returns its exit code (or 255 when it died otherwise).
template <typename Fn>
int RunInChild(Fn child) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

// In the child: 0 when every byte matches the pattern, then the first byte is set to 0xEE.
int CheckAndMark(absl::StatusOr<std::unique_ptr<HostArenaMapping>> mapping) {
  if (!mapping.ok()) return 2;
  if ((*mapping)->bytes() != kBytes) return 3;
  const auto* data = static_cast<uint8_t*>((*mapping)->data());
  for (int64_t i = 0; i < kBytes; ++i) {
    if (data[i] != Pattern(i)) return 4;
  }
  static_cast<uint8_t*>((*mapping)->data())[0] = 0xEE;
  return 0;
}

TEST(HostArenaTest, AnotherProcessMapsTheArenaByName) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("by name/test", kBytes));
  const ArenaInfo info = arena->info();
  EXPECT_EQ(info.backend, Backend::kHost);
  EXPECT_EQ(info.bytes, kBytes);
  ASSERT_EQ(info.name.find('/', 1), std::string::npos) << info.name;
  auto* data = static_cast<uint8_t*>(arena->base());
  for (int64_t i = 0; i < kBytes; ++i) data[i] = Pattern(i);
  const std::string name = info.name;
  EXPECT_EQ(RunInChild([&] { return CheckAndMark(HostArenaMapping::OpenByName(name)); }), 0);
  EXPECT_EQ(data[0], 0xEE);  // the child's write is visible here: one shared region
}

TEST(HostArenaTest, AnotherProcessMapsTheArenaByFd) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("by_fd", kBytes));
  auto* data = static_cast<uint8_t*>(arena->base());
  for (int64_t i = 0; i < kBytes; ++i) data[i] = Pattern(i);
  const int fd = arena->info().fd;
  ASSERT_GE(fd, 0);
  EXPECT_EQ(RunInChild([&] { return CheckAndMark(HostArenaMapping::OpenByFd(fd)); }), 0);
  EXPECT_EQ(data[0], 0xEE);
}

TEST(HostArenaTest, WorkerSeesFramesTheDaemonAssigned) {
  CacheOptions options;
  options.geometry = {.layers = 2,
                      .query_heads = 4,
                      .kv_groups = 2,
                      .head_dim = 8,
                      .page_size = 4,
                      .element_bytes = 2};
  options.capacity_bytes = 64 * FrameBytes(options.geometry, FrameLayout::kGroup);
  options.name = "worker";
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto state, CacheState::Create(options));
  ASSERT_TRUE(state->OpenSequence("s", 0).ok());
  ENTROKV_ASSERT_OK_AND_ASSIGN(AppendResult appended, state->AppendTokens("s", 6));
  const int64_t frame_bytes = state->Stats().frame_bytes;
  // The "worker" (child) writes each assigned frame through its own mapping.
  const std::string name = state->arena().name;
  ASSERT_EQ(RunInChild([&] {
              auto mapping = HostArenaMapping::OpenByName(name);
              if (!mapping.ok()) return 2;
              for (const FrameAssignment& a : appended.new_frames) {
                std::memset(static_cast<char*>((*mapping)->data()) + a.frame * frame_bytes,
                            1 + a.layer * 2 + a.group, frame_bytes);
              }
              return 0;
            }),
            0);
  for (const FrameAssignment& a : appended.new_frames) {
    const auto* frame = static_cast<uint8_t*>(state->FrameAddress(a.frame));
    EXPECT_EQ(frame[0], 1 + a.layer * 2 + a.group);
    EXPECT_EQ(frame[frame_bytes - 1], 1 + a.layer * 2 + a.group);
  }
}

TEST(HostArenaTest, NameIsGoneAfterTheArena) {
  std::string name;
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("gone", 4096));
    name = arena->info().name;
    EXPECT_TRUE(HostArenaMapping::OpenByName(name).ok());
  }
  EXPECT_THAT(HostArenaMapping::OpenByName(name),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(name)));
}

// What a crashed process with this pid (or a process with the same pid in another pid
// namespace) leaves under the names the arena would generate next.
TEST(HostArenaTest, TakenGeneratedNamesAreSkippedAndLeftAlone) {
  std::string first;
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("taken", 4096));
    first = arena->info().name;
  }
  const size_t dot = first.rfind('.');
  const std::string prefix = first.substr(0, dot + 1);
  const int64_t n = std::stoll(first.substr(dot + 1));
  std::vector<std::string> squatted;
  const absl::Cleanup unlink_squatters = [&] {
    for (const std::string& name : squatted) shm_unlink(name.c_str());
  };
  for (int64_t i = n + 1; i <= n + 2; ++i) {
    squatted.push_back(absl::StrCat(prefix, i));
    const int fd = shm_open(squatted.back().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << squatted.back();
    close(fd);
  }
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("taken", 4096));
    EXPECT_EQ(arena->info().name, absl::StrCat(prefix, n + 3));
    // An exact name is the caller's choice: taken, it is an error, not a different name.
    EXPECT_THAT(CreateHostArena("taken", 4096, {.name = squatted[0]}),
                StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(squatted[0])));
  }
  for (const std::string& name : squatted) {
    struct stat st {};
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    ASSERT_GE(fd, 0) << name << " was removed";
    EXPECT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, 0) << name << " was written";
    close(fd);
  }
}

std::string UniqueName(absl::string_view what) {
  static int counter = 0;
  return absl::StrCat("/entrokv-arena-test-", what, "-", getpid(), "-", counter++);
}

// Two owners of one arena would hand out the same frames: while one process (or arena object)
// holds it, attaching it again is refused; once it is gone, the kept name attaches.
TEST(HostArenaTest, AnArenaInUseIsNotAttachedAgain) {
  const std::string name = UniqueName("held");
  const absl::Cleanup unlink_name = [&] { shm_unlink(name.c_str()); };
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(
        auto held, CreateHostArena("held", kBytes, {.name = name, .keep_name = true}));
    EXPECT_THAT(CreateHostArena("held", kBytes, {.name = name, .attach = true}),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("another running process")));
    // Another process cannot either.
    EXPECT_EQ(
        RunInChild([&] {
          return CreateHostArena("held", kBytes, {.name = name, .attach = true}).status().code() ==
                         absl::StatusCode::kUnavailable
                     ? 0
                     : 1;
        }),
        0);
  }
  EXPECT_TRUE(
      CreateHostArena("held", kBytes, {.name = name, .attach = true, .keep_name = true}).ok());
}

// The object says what it is: its trailer, whatever its name or link. A worker's segment of the
// same size does not, and a mapping shows only the frames.
TEST(HostArenaTest, TheTrailerTellsAnArenaFromASegment) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("trailer", kBytes));
  struct stat st {};
  ASSERT_EQ(fstat(arena->info().fd, &st), 0);
  EXPECT_EQ(st.st_size, kBytes + kHostArenaTrailerBytes);
  EXPECT_EQ(HostArenaBytes(arena->info().fd, st.st_size), kBytes);
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto mapping, HostArenaMapping::OpenByName(arena->info().name));
  EXPECT_EQ(mapping->bytes(), kBytes);

  const std::string segment = UniqueName("segment");
  const absl::Cleanup unlink_segment = [&] { shm_unlink(segment.c_str()); };
  const int fd = shm_open(segment.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes + kHostArenaTrailerBytes), 0);
  EXPECT_EQ(HostArenaBytes(fd, kBytes + kHostArenaTrailerBytes), -1);
  close(fd);
  // An object of the pool's size without the trailer (what an older daemon left) is no arena.
  EXPECT_THAT(CreateHostArena("trailer", kBytes, {.name = segment, .attach = true}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("trailer")));
}

// tmpfs commits a page when it is first touched; a page first touched after /dev/shm filled up
// kills the process with SIGBUS. The arena's pages are reserved when it is made.
TEST(HostArenaTest, TheArenasMemoryIsReservedWhenItIsMade) {
  ENTROKV_ASSERT_OK_AND_ASSIGN(auto arena, CreateHostArena("reserved", kBytes));
  struct stat st {};
  ASSERT_EQ(fstat(arena->info().fd, &st), 0);
  EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, kBytes + kHostArenaTrailerBytes);
}

// An arena handed to another user (while its daemon was down) is not attached.
TEST(HostArenaTest, AnArenaOfAnotherUserIsNotAttached) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give an arena to another uid";
  const std::string name = UniqueName("foreign");
  const absl::Cleanup unlink_name = [&] { shm_unlink(name.c_str()); };
  {
    ENTROKV_ASSERT_OK_AND_ASSIGN(
        auto arena, CreateHostArena("foreign", kBytes, {.name = name, .keep_name = true}));
    ASSERT_EQ(fchown(arena->info().fd, 65534, 65534), 0);
  }
  EXPECT_THAT(CreateHostArena("foreign", kBytes, {.name = name, .attach = true}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("owned by uid 65534")));
}

TEST(HostArenaTest, RejectsBadInput) {
  EXPECT_THAT(CreateHostArena("x", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
  EXPECT_THAT(HostArenaMapping::OpenByFd(-1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fd")));
}

}  // namespace
}  // namespace entrokv
