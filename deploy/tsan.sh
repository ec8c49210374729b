#!/usr/bin/env bash
# core/ tests under ThreadSanitizer (RELIABILITY R13), called by `deploy/local.sh tsan`.
#
# Debian's Abseil is not built with TSan, and absl::Mutex tells TSan about its locking only when
# Abseil itself is compiled with -fsanitize=thread: against Debian's build every access guarded
# by an absl::Mutex would read as a race. So Abseil is built here from Debian's own source
# package (the same 20220623 release, with Debian's patches and its C++17 setting) with TSan,
# into .tsan-absl/ (kept between runs), and core/ (which uses no gRPC, protobuf or Prometheus;
# those are not TSan-built either) is built against it in build-tsan. docs/decisions.md
# "Sanitizers and fuzzing" says why this way.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${1:-$(nproc)}"
cache="$PWD/.tsan-absl"
prefix="$cache/install"
flags="-fsanitize=thread -g -O1"

if [ ! -f "$prefix/lib/cmake/absl/abslConfig.cmake" ]; then
  echo "== TSan: building Abseil from Debian's source package into .tsan-absl (${jobs} jobs)"
  rm -rf "$cache"
  mkdir -p "$cache/src" "$cache/lists/partial"
  # A deb-src entry of our own, so the machine's apt configuration stays untouched.
  echo "deb-src http://deb.debian.org/debian bookworm main" >"$cache/sources.list"
  apt_options=(-o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$cache/lists" -o Debug::NoDropPrivs=true)
  apt-get "${apt_options[@]}" -qq update
  (cd "$cache/src" && apt-get "${apt_options[@]}" -qq source abseil >/dev/null)
  source_dir="$(find "$cache/src" -mindepth 1 -maxdepth 1 -type d -name 'abseil*' | head -n 1)"
  cmake -S "$source_dir" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=OFF -DBUILD_TESTING=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
  ninja -C "$cache/build" -j "$jobs" install >/dev/null
fi

echo "== TSan: configuring and building core/ in build-tsan (${jobs} jobs)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENTROKV_CORE_ONLY=ON \
  -DENTROKV_CUDA=OFF -DENTROKV_BUILD_BENCH=OFF -DENTROKV_SANITIZE=thread \
  -Dabsl_DIR="$prefix/lib/cmake/absl" ${ENTROKV_CMAKE_ARGS:-} >/dev/null
ninja -C build-tsan -j "$jobs" core/all
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
exec ctest --test-dir build-tsan/core --output-on-failure -j "$jobs" --timeout 1200
