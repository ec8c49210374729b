// State recovery from the --state_dir journal: records decoded from fuzzed bytes go through
// store::LoadRecords (what LoadState runs over LevelDB's records), and every model it accepts is
// rebuilt as the daemon does at start-up (ModelRegistry::Recover: arenas, Restore, MarkLost). A
// damaged journal must be refused (DATA_LOSS) or restored consistently: never a crash, an overflow
// or an allocation beyond what its records describe.
//
// Input: records, each a u16-length-prefixed key then a u16-length-prefixed value; sorted by
// key, later duplicates win (as in LevelDB). Keys and values are the store's own encodings
// (store/records.h).
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/pool/arena.h"
#include "core/pool/cache_state.h"
#include "service/arena_names.h"
#include "service/metrics.h"
#include "service/model_registry.h"
#include "store/recovery.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace entrokv;
  fuzz::FuzzInput input(data, size);
  std::map<std::string, std::string> records;
  while (input.remaining() > 0) {
    std::string key = input.TakeLengthPrefixed();
    records[std::move(key)] = input.TakeLengthPrefixed();
  }
  absl::StatusOr<std::vector<store::RecoveredModel>> models =
      store::LoadRecords("fuzz", [&records](const store::RecordVisitor& visit) {
        for (const auto& [key, value] : records) {
          if (absl::Status status = visit(key, value); !status.ok()) return status;
        }
        return absl::OkStatus();
      });
  if (!models.ok()) {
    FUZZ_CHECK(models.status().code() == absl::StatusCode::kDataLoss, models.status().ToString());
    return 0;
  }
  // Rebuilt as entrokvd does at start-up, under a small --pool_capacity_bytes (the arenas are
  // real memory) and a namer of this process's own, whose arenas go with each input.
  static const std::string instance = absl::StrCat("f", getpid());
  absl::StatusOr<std::unique_ptr<service::ArenaNamer>> locked =
      service::ArenaNamer::ForState(instance);
  FUZZ_CHECK(locked.ok(), locked.status().ToString());
  std::unique_ptr<service::ArenaNamer> namer = *std::move(locked);
  {
    service::ServiceMetrics metrics;
    service::ModelRegistry registry(/*capacity_bytes=*/int64_t{1} << 20, /*max_models=*/16,
                                    /*max_bookkeeping_bytes=*/0, CacheLimits{}, &metrics);
    registry.UseArenaNames(namer.get());
    // A host model whose arena_name is "$arena" finds its arena there (a fresh one of exactly
    // its size, as a restart finds the arena it left): its sequences are then restored, not
    // marked lost. Seed inputs are files, so they cannot name a real arena (the name carries
    // the process id).
    for (store::RecoveredModel& recovered : *models) {
      store::ModelRecord& record = recovered.model;
      if (record.arena_names != std::vector<std::string>{"$arena"} ||
          record.backend != Backend::kHost || record.capacity_bytes <= 0 ||
          record.capacity_bytes > (int64_t{1} << 20)) {
        continue;
      }
      // The arena's frames are whole frames of the capacity, as the pool sizes them.
      const int64_t frame_bytes = FrameBytes(record.geometry, record.layout);
      if (frame_bytes <= 0 || record.capacity_bytes < frame_bytes) continue;
      const std::string name = namer->Next(record.model_id);
      absl::StatusOr<std::unique_ptr<MemoryArena>> arena =
          CreateHostArena(name, record.capacity_bytes / frame_bytes * frame_bytes,
                          {.name = name, .keep_name = true});
      if (arena.ok()) record.arena_names = {name};  // else an id no name can hold: it stays missing
    }
    const absl::Status recovered = registry.Recover(*std::move(models));
    if (recovered.ok()) {
      for (const std::shared_ptr<service::Model>& model : registry.All()) {
        const absl::Status invariants = model->state().CheckInvariants();
        FUZZ_CHECK(invariants.ok(), invariants.ToString());
        const PoolStats stats = model->state().Stats();
        FUZZ_CHECK(stats.used_frames + stats.free_frames == stats.capacity_frames,
                   absl::StrCat(stats.used_frames, " + ", stats.free_frames,
                                " != ", stats.capacity_frames));
      }
    }
  }
  namer->RemoveUnused({});
  return 0;
}
