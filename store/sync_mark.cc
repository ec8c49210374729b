#include "store/sync_mark.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace entrokv::store {
namespace {

constexpr int kSlotBytes = 64;
constexpr char kMagic[16] = "entrokv-mark-1";  // 14 characters, zero-padded to 16

absl::Status Failed(const std::string& path, absl::string_view call) {
  return absl::InternalError(
      absl::StrCat("--state_dir: sync mark ", path, ": ", call, ": ", std::strerror(errno)));
}

// FNV-1a over the slot's first 32 bytes: enough to tell a torn or flipped slot from a written
// one (the mark guards against accidents and damage, not against a forger who can write the
// journal too).
uint64_t Checksum(const unsigned char* bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (int i = 0; i < 32; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

void PutLe64(unsigned char* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
}

uint64_t GetLe64(const unsigned char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

// The slot's value, or false when it is not a valid slot.
bool ParseSlot(const unsigned char* slot, SyncMark::Value* value) {
  if (std::memcmp(slot, kMagic, sizeof(kMagic)) != 0) return false;
  if (GetLe64(slot + 32) != Checksum(slot)) return false;
  value->write = static_cast<int64_t>(GetLe64(slot + 16));
  value->unix_nanos = static_cast<int64_t>(GetLe64(slot + 24));
  return value->write >= 0;
}

int64_t NowNanos() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec * int64_t{1000000000} + now.tv_nsec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SyncMark>> SyncMark::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Failed(path, "open");
  std::unique_ptr<SyncMark> mark(new SyncMark(path, fd, Value{}, 0));
  RETURN_IF_ERROR(mark->Reset(0));
  // The file's name must survive a machine crash too: sync the directory that holds it.
  const std::string dir = path.substr(0, path.rfind('/') + 1);
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Failed(dir, "open");
  const bool synced = ::fsync(dir_fd) == 0;
  ::close(dir_fd);
  if (!synced) return Failed(dir, "fsync");
  return mark;
}

absl::StatusOr<std::unique_ptr<SyncMark>> SyncMark::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("--state_dir: sync mark ", path, " is missing"));
    }
    return Failed(path, "open");
  }
  unsigned char slots[2 * kSlotBytes] = {};
  const ssize_t got = ::pread(fd, slots, sizeof(slots), 0);
  Value best;
  int best_slot = -1;
  for (int slot = 0; slot < 2 && got >= (slot + 1) * kSlotBytes; ++slot) {
    Value value;
    if (ParseSlot(slots + slot * kSlotBytes, &value) &&
        (best_slot < 0 || value.write > best.write)) {
      best = value;
      best_slot = slot;
    }
  }
  if (best_slot < 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("--state_dir: sync mark ", path,
                                            " is damaged (no valid slot in its ", got, " bytes)"));
  }
  return std::unique_ptr<SyncMark>(new SyncMark(path, fd, best, 1 - best_slot));
}

SyncMark::~SyncMark() { ::close(fd_); }

absl::Status SyncMark::WriteSlot(int slot, const Value& value) {
  unsigned char bytes[kSlotBytes] = {};
  std::memcpy(bytes, kMagic, sizeof(kMagic));
  PutLe64(bytes + 16, static_cast<uint64_t>(value.write));
  PutLe64(bytes + 24, static_cast<uint64_t>(value.unix_nanos));
  PutLe64(bytes + 32, Checksum(bytes));
  if (::pwrite(fd_, bytes, sizeof(bytes), static_cast<off_t>(slot) * kSlotBytes) !=
      static_cast<ssize_t>(sizeof(bytes))) {
    return Failed(path_, "pwrite");
  }
  return absl::OkStatus();
}

absl::Status SyncMark::SyncFile() {
  if (::fdatasync(fd_) != 0) return Failed(path_, "fdatasync");
  return absl::OkStatus();
}

absl::Status SyncMark::Record(int64_t write) {
  const Value value{.write = write, .unix_nanos = NowNanos()};
  RETURN_IF_ERROR(WriteSlot(next_slot_, value));
  RETURN_IF_ERROR(SyncFile());
  value_ = value;
  next_slot_ = 1 - next_slot_;
  return absl::OkStatus();
}

absl::Status SyncMark::Reset(int64_t write) {
  const Value value{.write = write, .unix_nanos = NowNanos()};
  RETURN_IF_ERROR(WriteSlot(0, value));
  RETURN_IF_ERROR(WriteSlot(1, value));
  RETURN_IF_ERROR(SyncFile());
  value_ = value;
  next_slot_ = 0;
  return absl::OkStatus();
}

}  // namespace entrokv::store
