// How entrokvd names its host arenas in /dev/shm, so that the arenas of a daemon that died
// (kill -9, OOM) never pile up there, while those a --state_dir daemon keeps for its restart
// are left alone.
//
// Every name is "/entrokv.<stem>.<model>.<start>-<n>", <stem> naming one daemon instance and
// <start> this process's start, so that a name is never reused for a different arena:
//  - "e<pid>-<time>": a daemon without --state_dir. It holds an flock on the object
//    "/entrokv.<stem>.lock" for its whole life; the kernel drops the lock when the process dies,
//    however it dies. At start-up every daemon removes the arenas of each stem whose lock it can
//    take: that daemon is dead. (flock on the object itself, not a pid check: pids are reused,
//    and a pid means nothing across the pid namespaces of containers sharing /dev/shm.)
//  - "d<instance>": a daemon with --state_dir, <instance> fixed when the state was created. It
//    holds the flock of "/entrokv.<stem>.lock" too, but nobody else removes its arenas;
//    when it restarts it attaches those its journal names and removes the rest of its own. The
//    lock keeps a second daemon off the same instance: one started on a copy of a running
//    daemon's --state_dir (a restored backup, a volume snapshot) would attach the arenas of the
//    first and hand out the same frames to a second owner.
// Every arena also holds an flock on its own object (core/pool/arena.h), and no arena whose lock
// is held is ever removed.
// Names of other forms (older versions, other programs) are never touched.
#ifndef ENTROKV_SERVICE_ARENA_NAMES_H_
#define ENTROKV_SERVICE_ARENA_NAMES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv::service {

// Where POSIX shared-memory objects appear as files (Linux).
inline constexpr char kShmDirectory[] = "/dev/shm";

class ArenaNamer {
 public:
  // A --state_dir daemon's names: they outlive the process (kept on exit, attached again).
  // Takes the instance's lock object: FAILED_PRECONDITION when another running process holds
  // it, INTERNAL when it cannot be made.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ArenaNamer>> ForState(
      absl::string_view instance);
  // A daemon without --state_dir: takes its lock object. INTERNAL when it cannot be made.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ArenaNamer>> ForProcess();
  // Releases and removes the lock object (the arenas are gone by then).
  ~ArenaNamer();
  ArenaNamer(const ArenaNamer&) = delete;
  ArenaNamer& operator=(const ArenaNamer&) = delete;

  // A fresh name for one of the model's arenas.
  [[nodiscard]] std::string Next(absl::string_view model_id);
  // True for a --state_dir daemon: its arenas keep their names when the process ends.
  [[nodiscard]] bool durable() const { return durable_; }
  [[nodiscard]] const std::string& stem() const { return stem_; }
  // This instance's arenas (names as shm_open takes them) not in `in_use` and held by no
  // process, removed; how many.
  int RemoveUnused(const absl::flat_hash_set<std::string>& in_use) const;

 private:
  ArenaNamer(std::string stem, int lock_fd, bool durable);

  const std::string stem_;
  const std::string start_;
  const int lock_fd_;
  const bool durable_;
  std::atomic<int64_t> counter_{0};
};

// Removes the arenas (and lock objects) of daemons without --state_dir that are no longer
// running, and the lock objects (only) of --state_dir instances no daemon holds; returns how
// many objects went. Objects of other users are left alone.
int RemoveDeadDaemonArenas();

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_ARENA_NAMES_H_
