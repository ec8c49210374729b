// SyncMark: the journal's high-water mark, kept beside it in a file of its own: the number of
// the last journal write known to be on disk. Every journal write carries its number (records.h,
// kWriteKey); a journal that comes back ending before the mark lost writes that had been synced
// (a log file truncated, zeroed or deleted), which LevelDB's recovery would otherwise drop
// without a word, taking them for the torn tail of a crash.
//
// The file holds two 64-byte slots: [magic 16][write 8][unix nanos 8][checksum 8][zeros 24].
// Each Record goes to the other slot than the last one and is fdatasync'd before it returns; a
// read takes the valid slot with the higher write. A write torn by a crash damages one slot and
// leaves the one before it, a lower bound that stays true.
#ifndef ENTROKV_STORE_SYNC_MARK_H_
#define ENTROKV_STORE_SYNC_MARK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace entrokv::store {

// Not thread-safe: StateStore serializes every call.
class SyncMark {
 public:
  struct Value {
    int64_t write = 0;       // journal writes 1..write are on disk
    int64_t unix_nanos = 0;  // when that was recorded
  };

  // Makes `path` holding write 0, synced with its directory. INTERNAL with errno text.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SyncMark>> Create(const std::string& path);
  // Opens `path` and reads it. NOT_FOUND when there is no such file; DATA_LOSS naming the path
  // when neither slot is valid.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SyncMark>> Open(const std::string& path);
  ~SyncMark();
  SyncMark(const SyncMark&) = delete;
  SyncMark& operator=(const SyncMark&) = delete;

  [[nodiscard]] const Value& value() const { return value_; }
  [[nodiscard]] const std::string& path() const { return path_; }

  // Records `write` (> value().write) durably in the next slot.
  [[nodiscard]] absl::Status Record(int64_t write);
  // Sets the mark to `write`, lower or higher, in both slots (a rollback the operator accepted).
  [[nodiscard]] absl::Status Reset(int64_t write);

 private:
  SyncMark(std::string path, int fd, Value value, int next_slot)
      : path_(std::move(path)), fd_(fd), value_(value), next_slot_(next_slot) {}
  [[nodiscard]] absl::Status WriteSlot(int slot, const Value& value);
  [[nodiscard]] absl::Status SyncFile();

  const std::string path_;
  const int fd_;
  Value value_;
  int next_slot_;
};

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_SYNC_MARK_H_
