# entrokvd's start-up line, read by the scripts that start a daemon (deploy/demo.sh,
# deploy/docker/build_test.sh inside the image). Once it serves, the daemon prints one line on
# stdout and flushes it (service/server.h, Server::ListeningLine):
#   entrokvd listening on HOST:PORT metrics on HOST:PORT      (or: ... metrics off)
# Source this file; POSIX sh and sed only, so that the image's /bin/sh runs it too.

# entrokvd_address FILE grpc|metrics: the address from the start-up line in FILE (the daemon's
# stdout). Prints nothing and returns 1 while the line is not there, or for metrics that are off.
entrokvd_address() {
  case "$2" in
    grpc) _entrokvd_take='s/^entrokvd listening on ([^ ]+) metrics .*$/\1/p' ;;
    metrics) _entrokvd_take='s/^entrokvd listening on [^ ]+ metrics on ([^ ]+)$/\1/p' ;;
    *) echo "entrokvd_address: grpc or metrics, not '$2'" >&2; return 2 ;;
  esac
  _entrokvd_line='^entrokvd listening on [^ ]+ metrics (on [^ ]+|off)$'
  _entrokvd_value=$(sed -n -E "/${_entrokvd_line}/{${_entrokvd_take};q}" "$1" 2>/dev/null)
  [ -n "$_entrokvd_value" ] || return 1
  printf '%s\n' "$_entrokvd_value"
}

# entrokvd_wait FILE PID [TRIES]: waits until the start-up line is in FILE, checking every 0.1 s
# up to TRIES times (100 by default); returns 1 when process PID exits first or time runs out.
entrokvd_wait() {
  _entrokvd_tries=${3:-100}
  while [ "$_entrokvd_tries" -gt 0 ]; do
    entrokvd_address "$1" grpc >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
    _entrokvd_tries=$((_entrokvd_tries - 1))
  done
  return 1
}
