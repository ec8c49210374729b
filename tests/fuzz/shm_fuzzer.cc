// The shared-memory reference checks as the daemon runs them (ShmReader::Open, then the held
// segment's CheckRange and Read): segment name, kind of file,
// owner, arena refusal, and the [offset, offset + length) range, against segments this target
// makes once per process: a regular one of known bytes, an empty one, a FIFO, a folder, a
// symbolic link, a host arena (its trailer says so) under a name no arena has, one that
// ShmReader::Access says is an arena, and a name that does not exist. Input: segment selector,
// offset (u64), length (u64); for selector values past the fixed segments, the rest of the input is
// the name itself. Not covered here: a segment changing while it is read (that is a race, tested in
// tests/service and service/shm_reader_test.cc).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"
#include "service/shm_reader.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_input.h"

namespace entrokv::fuzz {
namespace {

constexpr uint64_t kSegmentBytes = 4096;

uint8_t PatternByte(uint64_t at) { return static_cast<uint8_t>((at * 7 + 3) % 251); }

enum Kind : uint8_t {
  kRegular,
  kEmpty,
  kFifo,
  kFolder,
  kLink,
  kArenaTrailer,
  kArenaInode,
  kMissing,
  kKinds
};

struct Segments {
  std::string names[kKinds];
  dev_t arena_dev = 0;
  ino_t arena_ino = 0;
};

void MakeSegment(const std::string& name, uint64_t bytes, bool pattern) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
  if (pattern) {
    std::string contents(bytes, '\0');
    for (uint64_t i = 0; i < bytes; ++i) contents[i] = static_cast<char>(PatternByte(i));
    if (::pwrite(fd, contents.data(), bytes, 0) != static_cast<ssize_t>(bytes)) std::abort();
  }
  ::close(fd);
}

const Segments& TheSegments() {
  static const Segments* segments = [] {
    auto* s = new Segments;
    const std::string base = absl::StrCat("/entrokv_fuzz_shm.", ::getpid());
    s->names[kRegular] = base + ".regular";
    s->names[kEmpty] = base + ".empty";
    s->names[kFifo] = base + ".fifo";
    s->names[kFolder] = base + ".folder";
    s->names[kLink] = base + ".link";
    s->names[kArenaTrailer] = base + ".trailer";
    s->names[kArenaInode] = base + ".arena";
    s->names[kMissing] = base + ".missing";
    MakeSegment(s->names[kRegular], kSegmentBytes, true);
    MakeSegment(s->names[kEmpty], 0, false);
    // A real arena's object, left behind as a stopped --state_dir daemon leaves it.
    if (!CreateHostArena("fuzz", kSegmentBytes,
                         {.name = s->names[kArenaTrailer], .keep_name = true})
             .ok()) {
      std::abort();
    }
    MakeSegment(s->names[kArenaInode], kSegmentBytes, true);
    const std::string dir = "/dev/shm";
    if (::mkfifo((dir + s->names[kFifo]).c_str(), 0600) != 0 ||
        ::mkdir((dir + s->names[kFolder]).c_str(), 0700) != 0 ||
        ::symlink((dir + s->names[kRegular]).c_str(), (dir + s->names[kLink]).c_str()) != 0) {
      std::abort();
    }
    struct stat info;
    if (::stat((dir + s->names[kArenaInode]).c_str(), &info) != 0) std::abort();
    s->arena_dev = info.st_dev;
    s->arena_ino = info.st_ino;
    std::atexit([] {
      const Segments& s = TheSegments();
      for (const Kind kind : {kRegular, kEmpty, kArenaTrailer, kArenaInode}) {
        ::shm_unlink(s.names[kind].c_str());
      }
      ::unlink(("/dev/shm" + s.names[kFifo]).c_str());
      ::unlink(("/dev/shm" + s.names[kLink]).c_str());
      ::rmdir(("/dev/shm" + s.names[kFolder]).c_str());
    });
    return s;
  }();
  return *segments;
}

absl::StatusCode Expected(Kind kind, uint64_t offset, uint64_t length) {
  const auto range = [&](uint64_t size) {
    return offset <= size && length <= size - offset ? absl::StatusCode::kOk
                                                     : absl::StatusCode::kInvalidArgument;
  };
  switch (kind) {
    case kRegular:
      return range(kSegmentBytes);
    case kEmpty:
      return range(0);
    case kFifo:
    case kFolder:
      return absl::StatusCode::kInvalidArgument;
    case kLink:  // shm_open does not follow links
    case kMissing:
      return absl::StatusCode::kNotFound;
    case kArenaTrailer:
    case kArenaInode:
      return absl::StatusCode::kPermissionDenied;
    case kKinds:
      break;
  }
  std::abort();
}

}  // namespace
}  // namespace entrokv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace entrokv;
  using fuzz::Kind;
  const fuzz::Segments& segments = fuzz::TheSegments();
  const service::ShmReader reader(
      service::ShmReader::Access{.allowed_uids = {}, .is_arena = [&segments](dev_t dev, ino_t ino) {
                                   return dev == segments.arena_dev && ino == segments.arena_ino;
                                 }});
  fuzz::FuzzInput input(data, size);
  const uint8_t selector = input.TakeByte();
  const uint64_t offset = input.TakeLe(8);
  const uint64_t length = input.TakeLe(8);
  const bool raw = selector >= fuzz::kKinds;
  const std::string name = raw ? input.TakeRest() : segments.names[selector];
  constexpr absl::string_view kField = "statistic.shared_memory";
  absl::StatusOr<service::ShmSegment> segment = reader.Open(kField, name);
  const absl::Status checked =
      segment.ok() ? segment->CheckRange(kField, offset, length) : segment.status();

  if (raw) {
    const bool well_formed = absl::StartsWith(name, "/entrokv") && name.size() <= 255 &&
                             !absl::StrContains(name.substr(1), "/");
    if (!well_formed) {
      FUZZ_CHECK(checked.code() == absl::StatusCode::kInvalidArgument, checked.ToString());
    }
  } else {
    FUZZ_CHECK(checked.code() == fuzz::Expected(static_cast<Kind>(selector), offset, length),
               absl::StrCat(name, " [", offset, ", +", length, "): ", checked.ToString()));
  }
  if (!checked.ok()) {
    FUZZ_CHECK(absl::StrContains(checked.message(), "statistic.shared_memory"),
               "the error does not name the field: " + checked.ToString());
    return 0;
  }
  if (raw && length > (size_t{1} << 20)) return 0;  // someone else's segment: don't copy much
  std::vector<char> copied(length);
  const absl::Status copy = segment->Read(kField, offset, length, copied.data());
  FUZZ_CHECK(copy.ok(), copy.ToString());
  if (!raw) {
    for (uint64_t i = 0; i < length; ++i) {
      FUZZ_CHECK(static_cast<uint8_t>(copied[i]) == fuzz::PatternByte(offset + i),
                 absl::StrCat("byte ", offset + i));
    }
  }
  return 0;
}
