#include "service/shm_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"

namespace entrokv::service {

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
    size_ = other.size_;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ShmSegment::CheckRange(absl::string_view field, uint64_t offset,
                                    uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", offset, " + ",
                                                   length, ") is outside segment '", name_, "' of ",
                                                   size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ShmSegment::Read(absl::string_view field, uint64_t offset, uint64_t length,
                              char* out) const {
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd_, out + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file: the segment shrank after the size check
    done += static_cast<uint64_t>(n);
  }
  if (done < length) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": segment '", name_, "' shrank below [", offset, ", ", offset, " + ",
                     length, ") while it was read; workers must not shrink a segment in use"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShmSegment> ShmReader::Open(absl::string_view field, absl::string_view name) const {
  if (!absl::StartsWith(name, "/entrokv") || name.size() > 255 ||
      absl::StrContains(name.substr(1), "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ".segment: must start with /entrokv, contain no other '/' and be at "
                     "most 255 characters"));
  }
  std::string key(name);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int opened = ::shm_open(key.c_str(), O_RDONLY | O_NONBLOCK, 0);
  if (opened < 0) {
    return absl::NotFoundError(
        absl::StrCat(field, ".segment: cannot open '", name, "': ", std::strerror(errno)));
  }
  // Owns the descriptor from here: every refusal below closes it.
  ShmSegment segment(opened, std::move(key), 0);
  struct stat info;
  if (::fstat(opened, &info) != 0) {
    return absl::NotFoundError(absl::StrCat(field, ".segment: cannot stat '", name, "'"));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".segment: '", name, "' is not a regular shared-memory file"));
  }
  if (info.st_uid != ::geteuid() &&
      std::find(access_.allowed_uids.begin(), access_.allowed_uids.end(), info.st_uid) ==
          access_.allowed_uids.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ".segment: '", name, "' belongs to uid ", info.st_uid,
                     ", not the daemon's; --allowed_shm_uids lists the users it may read"));
  }
  // By what it is, not by its name: any daemon's arena ends with the arena trailer (a link or a
  // new name changes neither), and this daemon's own are known by device and inode.
  if (HostArenaBytes(opened, info.st_size) > 0 ||
      (access_.is_arena && access_.is_arena(info.st_dev, info.st_ino))) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ".segment: '", name, "' is a pool arena, not a statistic; arenas are never read"));
  }
  segment.size_ = static_cast<uint64_t>(info.st_size);
  return segment;
}

}  // namespace entrokv::service
