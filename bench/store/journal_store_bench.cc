// The cost of one journal write on the decision path, for the embedded stores considered for
// --state_dir (docs/decisions.md, "Crash safety"): LevelDB and SQLite in WAL mode. Each write
// overwrites one of 1,000 keys (the journal keeps state, not a log: a sequence's records are
// rewritten in place), with a value of value_bytes (256 B: a sequence's length or one layer's
// head weights; 2 KiB: one 64-page block-table chunk of 8 groups). Modes: 0 = no sync per write
// (the process-crash-safe mode the daemon uses, a background thread syncs in batches),
// 1 = fsync every write. The directory is the one in ENTROKV_BENCH_DIR (default /tmp): run it on
// the disk --state_dir would use.
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "core/pool/cache_state.h"
#include "leveldb/db.h"
#include "leveldb/write_batch.h"
#include "store/model_journal.h"
#include "store/state_store.h"

namespace {

constexpr int kKeys = 1000;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("ENTROKV_BENCH_DIR");
  const std::string dir =
      absl::StrCat(base != nullptr ? base : "/tmp", "/entrokv_store_bench.", name, ".", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Key(int i) { return absl::StrCat("t/model/seq", i % 37, "/", i); }

void BM_LevelDbWrite(benchmark::State& state) {
  const auto value_bytes = static_cast<size_t>(state.range(0));
  const bool sync = state.range(1) != 0;
  const std::string dir = FreshDir("leveldb");
  leveldb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  leveldb::DB* raw = nullptr;
  if (!leveldb::DB::Open(options, dir, &raw).ok()) {
    state.SkipWithError("leveldb open failed");
    return;
  }
  std::unique_ptr<leveldb::DB> db(raw);
  leveldb::WriteOptions write_options;
  write_options.sync = sync;
  std::string value(value_bytes, '\x5a');
  int i = 0;
  for (auto _ : state) {
    value[i % value_bytes] = static_cast<char>(i);
    leveldb::WriteBatch batch;
    batch.Put(Key(i % kKeys), value);
    if (!db->Write(write_options, &batch).ok()) state.SkipWithError("leveldb write failed");
    ++i;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * value_bytes));
  db.reset();
  std::filesystem::remove_all(dir);
}

void BM_SqliteWalWrite(benchmark::State& state) {
  const auto value_bytes = static_cast<size_t>(state.range(0));
  const bool sync = state.range(1) != 0;
  const std::string dir = FreshDir("sqlite");
  sqlite3* db = nullptr;
  if (sqlite3_open((dir + "/state.db").c_str(), &db) != SQLITE_OK) {
    state.SkipWithError("sqlite open failed");
    return;
  }
  // WAL: a commit appends to the log; NORMAL syncs only at checkpoints (the batched mode),
  // FULL syncs every commit.
  const std::string pragmas =
      absl::StrCat("PRAGMA journal_mode=WAL; PRAGMA synchronous=", sync ? "FULL" : "NORMAL",
                   "; CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID;");
  if (sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
    state.SkipWithError("sqlite setup failed");
    sqlite3_close(db);
    return;
  }
  sqlite3_stmt* put = nullptr;
  sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)", -1, &put, nullptr);
  std::string value(value_bytes, '\x5a');
  int i = 0;
  for (auto _ : state) {
    value[i % value_bytes] = static_cast<char>(i);
    const std::string key = Key(i % kKeys);
    sqlite3_bind_text(put, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
    sqlite3_bind_blob(put, 2, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
    if (sqlite3_step(put) != SQLITE_DONE) state.SkipWithError("sqlite write failed");
    sqlite3_reset(put);
    ++i;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * value_bytes));
  sqlite3_finalize(put);
  sqlite3_close(db);
  std::filesystem::remove_all(dir);
}

// The decision path itself: CacheState::ApplyDecision on one layer of a Qwen2.5-1.5B-shaped
// sequence (2 KV groups, T = 32768, 2048 pages) keeping 20% of the pages, with the journal
// (mode 1) and without (mode 0). The first decision on a layer evicts 80% of its pages, the
// journal's worst case: every 64-page chunk of the layer is rewritten.
void BM_ApplyDecision(benchmark::State& state) {
  const bool journaled = state.range(0) != 0;
  entrokv::CacheOptions options;
  options.geometry = {.layers = 28,
                      .query_heads = 12,
                      .kv_groups = 2,
                      .head_dim = 8,
                      .page_size = 16,
                      .element_bytes = 2};
  options.capacity_bytes = int64_t{2} * 28 * 2 * 2048 *
                           entrokv::FrameBytes(options.geometry, entrokv::FrameLayout::kGroup);
  options.name = "journal_bench";
  auto cache = entrokv::CacheState::Create(options);
  if (!cache.ok()) {
    state.SkipWithError("cache");
    return;
  }
  const std::string dir = FreshDir("decide");
  std::unique_ptr<entrokv::store::StateStore> store;
  std::unique_ptr<entrokv::store::ModelJournal> journal;
  if (journaled) {
    store = *entrokv::store::StateStore::Open(dir, absl::Milliseconds(100));
    journal = std::make_unique<entrokv::store::ModelJournal>(store.get(), "m", options.geometry);
    (*cache)->SetJournal(journal.get());
  }
  std::vector<std::vector<int32_t>> kept(2);
  for (int32_t page = 0; page < 2048; page += 5) {
    kept[0].push_back(page);
    kept[1].push_back(page);
  }
  int layer = 28;
  int sequence = 0;
  for (auto _ : state) {
    if (layer == 28) {  // a fresh sequence: every layer can be decided once more
      state.PauseTiming();
      if (sequence > 0) (void)(*cache)->CloseSequence(absl::StrCat("s", sequence - 1));
      if (!(*cache)->OpenSequence(absl::StrCat("s", sequence++), 32768).ok()) std::abort();
      layer = 0;
      state.ResumeTiming();
    }
    if (!(*cache)->ApplyDecision(absl::StrCat("s", sequence - 1), layer++, 32768, kept).ok()) {
      std::abort();
    }
  }
  (*cache)->SetJournal(nullptr);
  journal.reset();
  store.reset();
  std::filesystem::remove_all(dir);
}

BENCHMARK(BM_ApplyDecision)->Arg(0)->Arg(1)->ArgName("journal");

BENCHMARK(BM_LevelDbWrite)->ArgsProduct({{256, 2048}, {0, 1}})->ArgNames({"value_bytes", "sync"});
BENCHMARK(BM_SqliteWalWrite)->ArgsProduct({{256, 2048}, {0, 1}})->ArgNames({"value_bytes", "sync"});

}  // namespace
