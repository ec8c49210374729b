#include "service/shm_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"

namespace entrokv::service {
absl::Status ShmReader::Open(absl::string_view field, absl::string_view name, uint64_t offset,
                             uint64_t length, int* fd) const {
  *fd = -1;
  if (!absl::StartsWith(name, "/entrokv") || name.size() > 255 ||
      absl::StrContains(name.substr(1), "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ".segment: must start with /entrokv, contain no other '/' and be at "
                     "most 255 characters"));
  }
  const std::string key(name);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int opened = ::shm_open(key.c_str(), O_RDONLY | O_NONBLOCK, 0);
  if (opened < 0) {
    return absl::NotFoundError(
        absl::StrCat(field, ".segment: cannot open '", name, "': ", std::strerror(errno)));
  }
  struct stat info;
  if (::fstat(opened, &info) != 0) {
    ::close(opened);
    return absl::NotFoundError(absl::StrCat(field, ".segment: cannot stat '", name, "'"));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(opened);
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".segment: '", name, "' is not a regular shared-memory file"));
  }
  if (info.st_uid != ::geteuid() &&
      std::find(access_.allowed_uids.begin(), access_.allowed_uids.end(), info.st_uid) ==
          access_.allowed_uids.end()) {
    ::close(opened);
    return absl::PermissionDeniedError(
        absl::StrCat(field, ".segment: '", name, "' belongs to uid ", info.st_uid,
                     ", not the daemon's; --allowed_shm_uids lists the users it may read"));
  }
  // By what it is, not by its name: any daemon's arena ends with the arena trailer (a link or a
  // new name changes neither), and this daemon's own are known by device and inode.
  if (HostArenaBytes(opened, info.st_size) > 0 ||
      (access_.is_arena && access_.is_arena(info.st_dev, info.st_ino))) {
    ::close(opened);
    return absl::PermissionDeniedError(absl::StrCat(
        field, ".segment: '", name, "' is a pool arena, not a statistic; arenas are never read"));
  }
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  if (offset > size || length > size - offset) {
    ::close(opened);
    return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", offset, " + ",
                                                   length, ") is outside segment '", name, "' of ",
                                                   size, " bytes"));
  }
  *fd = opened;
  return absl::OkStatus();
}

absl::Status ShmReader::Check(absl::string_view field, absl::string_view name, uint64_t offset,
                              uint64_t length) const {
  int fd = -1;
  const absl::Status status = Open(field, name, offset, length, &fd);
  if (fd >= 0) ::close(fd);
  return status;
}

absl::Status ShmReader::Copy(absl::string_view field, absl::string_view name, uint64_t offset,
                             uint64_t length, std::vector<char>* out) const {
  int fd = -1;
  if (absl::Status status = Open(field, name, offset, length, &fd); !status.ok()) return status;
  out->resize(length);
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n =
        ::pread(fd, out->data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file: the segment shrank after the size check
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (done < length) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": segment '", name, "' shrank below [", offset, ", ", offset, " + ",
                     length, ") while it was read; workers must not shrink a segment in use"));
  }
  return absl::OkStatus();
}

}  // namespace entrokv::service
