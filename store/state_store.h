// StateStore: the daemon's durable state under --state_dir, kept in LevelDB (its log makes each
// write atomic and survives a killed process; docs/decisions.md "Crash safety" says why LevelDB),
// and the sync mark beside it (sync_mark.h) that keeps a shortened journal from being served.
#ifndef ENTROKV_STORE_STATE_STORE_H_
#define ENTROKV_STORE_STATE_STORE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "leveldb/db.h"
#include "leveldb/write_batch.h"
#include "store/sync_mark.h"

namespace entrokv::store {

// Thread-safe. Writes reach the operating system before Write returns (a killed daemon loses
// none of them); a background thread makes them durable on disk every `sync_interval` (a
// machine crash loses at most that much). sync_interval == 0 syncs every write instead.
//
// Every write is numbered (records.h, kWriteKey) and, once a sync has made it durable, the
// number goes to the sync mark (DIR/journal.mark). Open compares the two: a journal ending
// before the mark lost synced writes and is refused, never served silently.
class StateStore {
 public:
  struct OpenOptions {
    absl::Duration sync_interval = absl::Milliseconds(100);
    // Accept a journal that lost synced writes (--state_accept_loss): it opens at the state it
    // still holds, rolled_back() says what was lost, and the mark is set back to match.
    bool accept_loss = false;
  };
  // What a journal opened with accept_loss had lost.
  struct Rollback {
    int64_t journal_write = 0;    // the last write the journal still holds
    int64_t mark_write = 0;       // the last write that had been synced (0: the mark was lost)
    int64_t mark_unix_nanos = 0;  // when that was recorded
    std::string reason;           // what was found, in words
  };

  // Opens the store in `state_dir`/journal, creating it (and its sync mark) when `state_dir`
  // holds none. DATA_LOSS naming --state_dir when the store is there but damaged (LevelDB's
  // checksums, a record LevelDB cannot read back, a missing or foreign format marker, a damaged
  // sync mark) or ends before its sync mark (unless options.accept_loss); its contents are never
  // trusted then. UNAVAILABLE when another process holds it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StateStore>> Open(
      const std::string& state_dir, const OpenOptions& options);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StateStore>> Open(
      const std::string& state_dir, absl::Duration sync_interval) {
    return Open(state_dir, OpenOptions{.sync_interval = sync_interval});
  }
  // Syncs once more and closes.
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Applies `batch` atomically, numbered: the batch also sets kWriteKey to the write's number.
  // sync: durable on disk (and in the sync mark) before returning, whatever the interval.
  [[nodiscard]] absl::Status Write(leveldb::WriteBatch& batch, bool sync = false);
  // Makes every earlier write durable on disk now, and records it in the sync mark.
  [[nodiscard]] absl::Status Sync();
  // Calls visit(key, value) for every record whose key starts with `prefix`, in key order,
  // checking every block's checksum. DATA_LOSS naming --state_dir on a damaged block or one
  // LevelDB cannot read back (a table file cut short).
  [[nodiscard]] absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& visit) const;
  // Deletes every record whose key starts with one of `prefixes`, atomically.
  [[nodiscard]] absl::Status DeletePrefixes(const std::vector<std::string>& prefixes);

  // This state's identity, fixed when the store was created: it names the host arenas the
  // daemon keeps for it, so a restart finds them and nobody else's.
  [[nodiscard]] const std::string& instance() const { return instance_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  // Set when Open accepted a journal that had lost synced writes (OpenOptions::accept_loss).
  [[nodiscard]] const std::optional<Rollback>& rolled_back() const { return rolled_back_; }
  // The number of the last write applied, and of the last one the sync mark records.
  [[nodiscard]] int64_t last_write() const;
  [[nodiscard]] int64_t synced_write() const;

 private:
  StateStore(std::string path, std::unique_ptr<leveldb::DB> db, std::string instance,
             std::unique_ptr<SyncMark> mark, int64_t last_write, absl::Duration sync_interval);
  void SyncLoop();
  // Records `write` in the sync mark if it is beyond it. REQUIRES: writes 1..write are durable.
  [[nodiscard]] absl::Status MarkDurable(int64_t write);

  const std::string path_;
  const std::unique_ptr<leveldb::DB> db_;
  const std::string instance_;
  const absl::Duration sync_interval_;
  std::optional<Rollback> rolled_back_;
  // Numbering and applying a write happen under one lock, so the numbers follow the log's order.
  mutable absl::Mutex write_mu_;
  int64_t last_write_ ABSL_GUARDED_BY(write_mu_) = 0;
  mutable absl::Mutex sync_mu_;  // taken after write_mu_ is released, never while holding it
  const std::unique_ptr<SyncMark> mark_ ABSL_PT_GUARDED_BY(sync_mu_);
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread syncer_;
};

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_STATE_STORE_H_
