#!/usr/bin/env bash
# The installed C++ client from outside the tree: installs BUILD's `development` component into
# a temporary prefix, configures and builds tests/install/consumer against it (find_package,
# entrokv::client), and runs it against a real entrokvd on a free loopback port.
# Usage: consume.sh BUILD ENTROKVD [CMAKE_ARG...]   (the extra arguments go to the consumer's
# configure: its compiler, launcher and sanitizer flags, the same as BUILD's; tests/install).
set -euo pipefail
build="${1:?usage: consume.sh BUILD ENTROKVD [CMAKE_ARG...]}"
entrokvd="${2:?usage: consume.sh BUILD ENTROKVD [CMAKE_ARG...]}"
shift 2
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill -KILL "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

echo "== cmake --install $build --component development --prefix <tmp>/prefix"
cmake --install "$build" --component development --prefix "$work/prefix" >"$work/install.log" ||
  { cat "$work/install.log"; exit 1; }
# The package holds the client's libraries, headers and CMake files, and no binary.
if [ -e "$work/prefix/bin" ]; then
  echo "consume.sh: the development component installed binaries:" "$work/prefix/bin"/* >&2
  exit 1
fi

echo "== configuring and building the consumer against the prefix"
cmake -S "$here/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" "$@" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build"

port="$(/usr/bin/python3 -c \
  'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$entrokvd" --listen="127.0.0.1:$port" --metrics_listen= >"$work/entrokvd.out" \
  2>"$work/entrokvd.err" &
daemon=$!
echo "== consumer 127.0.0.1:$port"
if ! "$work/build/consumer" "127.0.0.1:$port"; then
  echo "-- entrokvd's stderr:" >&2
  cat "$work/entrokvd.err" >&2
  exit 1
fi
kill -TERM "$daemon"
code=0
wait "$daemon" || code=$?
daemon=""
if [ "$code" -ne 0 ]; then
  echo "consume.sh: entrokvd exited with $code after SIGTERM" >&2
  cat "$work/entrokvd.err" >&2
  exit 1
fi
