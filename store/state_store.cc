#include "store/state_store.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
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

// Reading back what an opened store holds: LevelDB opened its files, so a record it cannot
// read is damage (a table file cut short reports an I/O error, not a checksum mismatch).
absl::Status ReadStatus(const std::string& path, const leveldb::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return Damaged(path, status.ToString());
}

std::string NewInstance() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return absl::StrCat(absl::Hex(now.tv_sec * int64_t{1000000000} + now.tv_nsec), "-", getpid());
}

std::string Timestamp(int64_t unix_nanos) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixNanos(unix_nanos),
                          absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& state_dir,
                                                             const OpenOptions& open) {
  const std::string path = absl::StrCat(state_dir, "/journal");
  const std::string mark_path = absl::StrCat(state_dir, "/journal.mark");
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
  int64_t last_write = 0;
  std::unique_ptr<SyncMark> mark;
  std::optional<Rollback> rollback;
  if (!exists) {
    instance = NewInstance();
    leveldb::WriteBatch batch;
    batch.Put(kFormatKey, kFormatValue);
    batch.Put(kInstanceKey, instance);
    batch.Put(kWriteKey, EncodeInt64(0));
    leveldb::WriteOptions write;
    write.sync = true;
    RETURN_IF_ERROR(FromLevelDb(path, db->Write(write, &batch)));
    ASSIGN_OR_RETURN(mark, SyncMark::Create(mark_path));
  } else {
    const leveldb::Status got = db->Get(read, kFormatKey, &format);
    if (got.IsNotFound()) return Damaged(path, "no format marker");
    RETURN_IF_ERROR(ReadStatus(path, got));
    if (format != kFormatValue) {
      return Damaged(path, absl::StrCat("format \"", format.substr(0, 40), "\", expected \"",
                                        kFormatValue, "\""));
    }
    const leveldb::Status named = db->Get(read, kInstanceKey, &instance);
    if (named.IsNotFound() || !ValidInstance(instance)) return Damaged(path, "no instance name");
    RETURN_IF_ERROR(ReadStatus(path, named));
    std::string counted;
    const leveldb::Status numbered = db->Get(read, kWriteKey, &counted);
    if (!numbered.IsNotFound()) {  // absent in journals written before writes were numbered
      RETURN_IF_ERROR(ReadStatus(path, numbered));
      absl::StatusOr<int64_t> value = DecodeInt64(counted);
      if (!value.ok() || *value < 0) return Damaged(path, "a bad write number");
      last_write = *value;
    }
    // What the journal lost, in words; empty when it holds every write the mark says synced.
    std::string lost;
    SyncMark::Value marked;
    absl::StatusOr<std::unique_ptr<SyncMark>> found = SyncMark::Open(mark_path);
    if (found.ok()) {
      mark = *std::move(found);
      marked = mark->value();
      if (last_write < marked.write) {
        lost = absl::StrCat("it ends at write ", last_write, ", but write ", marked.write,
                            " had been synced to disk (", Timestamp(marked.unix_nanos), "): the ",
                            marked.write - last_write,
                            " changes after it, each acknowledged to a client, are missing (a "
                            "log file cut short, zeroed or deleted?)");
      }
    } else if (absl::IsNotFound(found.status()) && last_write == 0) {
      // Written before writes were numbered, or never written since it was made.
      ASSIGN_OR_RETURN(mark, SyncMark::Create(mark_path));
    } else if (absl::IsNotFound(found.status()) || absl::IsDataLoss(found.status())) {
      lost = absl::StrCat(found.status().message(), ", so nothing shows whether all ", last_write,
                          " writes the journal holds are all it had");
    } else {
      return found.status();
    }
    if (!lost.empty()) {
      if (!open.accept_loss) {
        return absl::DataLossError(absl::StrCat(
            "--state_dir: the journal in ", path, " has lost synced writes: ", lost,
            ". Refusing to roll back silently: restore ", state_dir,
            " from a copy, or start with --state_accept_loss to continue from the state it "
            "still holds"));
      }
      rollback = Rollback{.journal_write = last_write,
                          .mark_write = marked.write,
                          .mark_unix_nanos = marked.unix_nanos,
                          .reason = std::move(lost)};
      if (mark == nullptr) {
        ASSIGN_OR_RETURN(mark, SyncMark::Create(mark_path));
      }
      RETURN_IF_ERROR(mark->Reset(last_write));
    }
  }
  std::unique_ptr<StateStore> store(new StateStore(
      path, std::move(db), std::move(instance), std::move(mark), last_write, open.sync_interval));
  store->rolled_back_ = std::move(rollback);
  return store;
}

StateStore::StateStore(std::string path, std::unique_ptr<leveldb::DB> db, std::string instance,
                       std::unique_ptr<SyncMark> mark, int64_t last_write,
                       absl::Duration sync_interval)
    : path_(std::move(path)),
      db_(std::move(db)),
      instance_(std::move(instance)),
      sync_interval_(sync_interval),
      last_write_(last_write),
      mark_(std::move(mark)) {
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

int64_t StateStore::last_write() const {
  absl::MutexLock lock(&write_mu_);
  return last_write_;
}

int64_t StateStore::synced_write() const {
  absl::MutexLock lock(&sync_mu_);
  return mark_->value().write;
}

absl::Status StateStore::Write(leveldb::WriteBatch& batch, bool sync) {
  leveldb::WriteOptions options;
  options.sync = sync || sync_interval_ <= absl::ZeroDuration();
  int64_t write = 0;
  {
    absl::MutexLock lock(&write_mu_);
    write = last_write_ + 1;
    batch.Put(kWriteKey, EncodeInt64(write));
    RETURN_IF_ERROR(FromLevelDb(path_, db_->Write(options, &batch)));
    last_write_ = write;
  }
  return options.sync ? MarkDurable(write) : absl::OkStatus();
}

absl::Status StateStore::MarkDurable(int64_t write) {
  absl::MutexLock lock(&sync_mu_);
  if (write <= mark_->value().write) return absl::OkStatus();
  return mark_->Record(write);
}

absl::Status StateStore::Sync() {
  const int64_t write = last_write();
  if (write <= synced_write()) return absl::OkStatus();
  // A synced write makes every earlier one durable too (one log, written in order); `write`
  // was applied before it.
  leveldb::WriteBatch empty;
  leveldb::WriteOptions options;
  options.sync = true;
  RETURN_IF_ERROR(FromLevelDb(path_, db_->Write(options, &empty)));
  return MarkDurable(write);
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
    // A failed sync is tried again at the next tick; the mark stays where it was, which is
    // still true.
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
  return ReadStatus(path_, it->status());
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
