#include "store/state_store.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"
#include "store/records.h"

namespace entrokv::store {
namespace {

absl::Status Damaged(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "--state_dir: the journal in ", path, " is damaged (", what,
      "); refusing to trust it. Move it away to start empty, or restore it from a copy"));
}

absl::Status FromLevelDb(const std::string& path, const leveldb::Status& status) {
  if (status.ok()) return absl::OkStatus();
  if (status.IsCorruption()) return Damaged(path, status.ToString());
  return absl::UnavailableError(
      absl::StrCat("--state_dir: the journal in ", path, ": ", status.ToString()));
}

std::string NewInstance() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return absl::StrCat(absl::Hex(now.tv_sec * int64_t{1000000000} + now.tv_nsec), "-", getpid());
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& state_dir,
                                                             absl::Duration sync_interval) {
  const std::string path = absl::StrCat(state_dir, "/journal");
  struct stat info {};
  const bool exists = ::stat(path.c_str(), &info) == 0;
  if (exists && !S_ISDIR(info.st_mode)) return Damaged(path, "not a directory");
  leveldb::Options options;
  // A store that is missing is made; one that is there must open exactly as it was written:
  // no silent re-creation over a lost CURRENT file, and every log record's checksum checked.
  options.create_if_missing = !exists;
  options.error_if_exists = !exists;
  options.paranoid_checks = true;
  // A larger memtable than the 4 MiB default: block tables are rewritten in place, so most
  // flushed data is already dead; fewer flushes mean fewer level-0 files to stall writes on.
  options.write_buffer_size = 32 << 20;
  leveldb::DB* raw = nullptr;
  const leveldb::Status opened = leveldb::DB::Open(options, path, &raw);
  if (!opened.ok()) {
    if (exists && (opened.IsCorruption() || opened.IsInvalidArgument())) {
      return Damaged(path, opened.ToString());
    }
    return FromLevelDb(path, opened);
  }
  std::unique_ptr<leveldb::DB> db(raw);
  leveldb::ReadOptions read;
  read.verify_checksums = true;
  std::string format;
  std::string instance;
  if (!exists) {
    instance = NewInstance();
    leveldb::WriteBatch batch;
    batch.Put(kFormatKey, kFormatValue);
    batch.Put(kInstanceKey, instance);
    leveldb::WriteOptions write;
    write.sync = true;
    RETURN_IF_ERROR(FromLevelDb(path, db->Write(write, &batch)));
  } else {
    const leveldb::Status got = db->Get(read, kFormatKey, &format);
    if (got.IsNotFound()) return Damaged(path, "no format marker");
    RETURN_IF_ERROR(FromLevelDb(path, got));
    if (format != kFormatValue) {
      return Damaged(path, absl::StrCat("format \"", format.substr(0, 40), "\", expected \"",
                                        kFormatValue, "\""));
    }
    const leveldb::Status named = db->Get(read, kInstanceKey, &instance);
    if (named.IsNotFound() || !ValidInstance(instance)) return Damaged(path, "no instance name");
    RETURN_IF_ERROR(FromLevelDb(path, named));
  }
  return std::unique_ptr<StateStore>(
      new StateStore(path, std::move(db), std::move(instance), sync_interval));
}

StateStore::StateStore(std::string path, std::unique_ptr<leveldb::DB> db, std::string instance,
                       absl::Duration sync_interval)
    : path_(std::move(path)),
      db_(std::move(db)),
      instance_(std::move(instance)),
      sync_interval_(sync_interval) {
  if (sync_interval_ > absl::ZeroDuration()) syncer_ = std::thread([this] { SyncLoop(); });
}

StateStore::~StateStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (syncer_.joinable()) syncer_.join();
  Sync().IgnoreError();
}

absl::Status StateStore::Write(leveldb::WriteBatch& batch, bool sync) {
  leveldb::WriteOptions options;
  options.sync = sync || sync_interval_ <= absl::ZeroDuration();
  RETURN_IF_ERROR(FromLevelDb(path_, db_->Write(options, &batch)));
  if (!options.sync) {
    absl::MutexLock lock(&mu_);
    dirty_ = true;
  }
  return absl::OkStatus();
}

absl::Status StateStore::Sync() {
  {
    absl::MutexLock lock(&mu_);
    if (!dirty_) return absl::OkStatus();
    dirty_ = false;
  }
  // A synced write makes every earlier one durable too (one log, written in order).
  leveldb::WriteBatch empty;
  leveldb::WriteOptions options;
  options.sync = true;
  return FromLevelDb(path_, db_->Write(options, &empty));
}

void StateStore::SyncLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time wake = absl::Now() + sync_interval_;
    while (!stopping_ && absl::Now() < wake) {
      mu_.AwaitWithDeadline(absl::Condition(&stopping_), wake);
    }
    if (stopping_) break;
    mu_.Unlock();
    // A failed sync shows again at the next write, which stops the daemon (ModelJournal).
    Sync().IgnoreError();
    mu_.Lock();
  }
}

absl::Status StateStore::Scan(
    absl::string_view prefix,
    const std::function<absl::Status(absl::string_view, absl::string_view)>& visit) const {
  leveldb::ReadOptions read;
  read.verify_checksums = true;
  read.fill_cache = false;
  std::unique_ptr<leveldb::Iterator> it(db_->NewIterator(read));
  for (it->Seek(leveldb::Slice(prefix.data(), prefix.size())); it->Valid(); it->Next()) {
    const absl::string_view key(it->key().data(), it->key().size());
    if (!absl::StartsWith(key, prefix)) break;
    RETURN_IF_ERROR(visit(key, absl::string_view(it->value().data(), it->value().size())));
  }
  return FromLevelDb(path_, it->status());
}

absl::Status StateStore::DeletePrefixes(const std::vector<std::string>& prefixes) {
  leveldb::WriteBatch batch;
  for (const std::string& prefix : prefixes) {
    RETURN_IF_ERROR(Scan(prefix, [&batch](absl::string_view key, absl::string_view) {
      batch.Delete(leveldb::Slice(key.data(), key.size()));
      return absl::OkStatus();
    }));
  }
  return Write(batch);
}

}  // namespace entrokv::store
