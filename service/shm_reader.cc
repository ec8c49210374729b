#include "service/shm_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace entrokv::service {

ShmMapping::~ShmMapping() {
  if (bytes_ > 0) ::munmap(const_cast<void*>(data_), static_cast<size_t>(bytes_));
}

absl::StatusOr<ShmRegion> ShmReader::Read(absl::string_view field, absl::string_view name,
                                          uint64_t offset, uint64_t length) {
  if (!absl::StartsWith(name, "/entrokv") || name.size() > 255 ||
      absl::StrContains(name.substr(1), "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".segment: '", name, "' must start with /entrokv and contain no other '/'"));
  }
  const std::string key(name);
  const int fd = ::shm_open(key.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat(field, ".segment: cannot open '", name, "': ", std::strerror(errno)));
  }
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    return absl::NotFoundError(absl::StrCat(field, ".segment: cannot stat '", name, "'"));
  }
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  if (offset > size || length > size - offset) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", offset, " + ",
                                                   length, ") is outside segment '", name, "' of ",
                                                   size, " bytes"));
  }
  std::shared_ptr<const ShmMapping> mapping;
  {
    absl::MutexLock lock(&mu_);
    auto it = mappings_.find(key);
    if (it != mappings_.end() && it->second->inode() == info.st_ino &&
        static_cast<uint64_t>(it->second->bytes()) == size) {
      mapping = it->second;
    }
  }
  if (mapping == nullptr) {
    void* data = size == 0 ? nullptr : ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      ::close(fd);
      return absl::NotFoundError(
          absl::StrCat(field, ".segment: cannot map '", name, "': ", std::strerror(errno)));
    }
    mapping = std::make_shared<const ShmMapping>(data, static_cast<int64_t>(size), info.st_ino);
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(mappings_.size()) >= max_segments_ && !mappings_.contains(key)) {
      mappings_.erase(mappings_.begin());  // any victim: holders keep theirs alive
    }
    mappings_[key] = mapping;
  }
  ::close(fd);
  ShmRegion region;
  region.data = static_cast<const char*>(mapping->data()) + offset;
  region.mapping = std::move(mapping);
  return region;
}

}  // namespace entrokv::service
