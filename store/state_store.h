// StateStore: the daemon's durable state under --state_dir, kept in LevelDB (its log makes each
// write atomic and survives a killed process; docs/decisions.md "Crash safety" says why LevelDB).
#ifndef ENTROKV_STORE_STATE_STORE_H_
#define ENTROKV_STORE_STATE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "leveldb/db.h"
#include "leveldb/write_batch.h"

namespace entrokv::store {

// Thread-safe. Writes reach the operating system before Write returns (a killed daemon loses
// none of them); a background thread makes them durable on disk every `sync_interval` (a
// machine crash loses at most that much). sync_interval == 0 syncs every write instead.
class StateStore {
 public:
  // Opens the store in `state_dir`/journal, creating it when `state_dir` holds none. DATA_LOSS
  // naming --state_dir when the store is there but damaged (LevelDB's checksums, a missing or
  // foreign format marker): its contents are never trusted then. UNAVAILABLE when another
  // process holds it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StateStore>> Open(
      const std::string& state_dir, absl::Duration sync_interval);
  // Syncs once more and closes.
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Applies `batch` atomically. sync: durable on disk before returning, whatever the interval.
  [[nodiscard]] absl::Status Write(leveldb::WriteBatch& batch, bool sync = false);
  // Makes every earlier write durable on disk now.
  [[nodiscard]] absl::Status Sync();
  // Calls visit(key, value) for every record whose key starts with `prefix`, in key order,
  // checking every block's checksum. DATA_LOSS naming --state_dir on a damaged block.
  [[nodiscard]] absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& visit) const;
  // Deletes every record whose key starts with one of `prefixes`, atomically.
  [[nodiscard]] absl::Status DeletePrefixes(const std::vector<std::string>& prefixes);

  // This state's identity, fixed when the store was created: it names the host arenas the
  // daemon keeps for it, so a restart finds them and nobody else's.
  [[nodiscard]] const std::string& instance() const { return instance_; }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  StateStore(std::string path, std::unique_ptr<leveldb::DB> db, std::string instance,
             absl::Duration sync_interval);
  void SyncLoop();

  const std::string path_;
  const std::unique_ptr<leveldb::DB> db_;
  const std::string instance_;
  const absl::Duration sync_interval_;
  absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;  // written since the last sync
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread syncer_;
};

}  // namespace entrokv::store

#endif  // ENTROKV_STORE_STATE_STORE_H_
