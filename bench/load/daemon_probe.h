// What the load generator learns about entrokvd outside gRPC: which process serves a port, its
// memory, whether it still runs, and its /metrics page. Linux only (/proc).
#ifndef ENTROKV_BENCH_LOAD_DAEMON_PROBE_H_
#define ENTROKV_BENCH_LOAD_DAEMON_PROBE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace entrokv::bench {

// The process listening on TCP `port` (IPv4 or IPv6, any address): the owner of the socket
// inode /proc/net/tcp{,6} lists in LISTEN state. 0 when none is found (or not visible to us).
[[nodiscard]] pid_t FindListeningPid(int port);

// A "kB" line of /proc/<pid>/status ("VmRSS", "VmHWM"), in KiB; -1 when unreadable.
[[nodiscard]] int64_t ReadStatusKb(pid_t pid, const std::string& field);

// True while `pid` exists and is not a zombie.
[[nodiscard]] bool ProcessAlive(pid_t pid);

// GET http://127.0.0.1:<port><path> (tests/support/http_get.h); the body, or "" on any failure
// or a status other than 200. Waits at most `timeout_ms` per socket operation.
[[nodiscard]] std::string HttpGet(int port, const std::string& path, int timeout_ms = 2000);

}  // namespace entrokv::bench

#endif  // ENTROKV_BENCH_LOAD_DAEMON_PROBE_H_
