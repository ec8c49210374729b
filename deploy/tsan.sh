#!/usr/bin/env bash
# core/ tests under ThreadSanitizer (docs/reliability.md, "Sanitizers"), called by `deploy/local.sh tsan`.
#
# Debian's Abseil is not built with TSan, and absl::Mutex tells TSan about its locking only when
# Abseil itself is compiled with -fsanitize=thread: against Debian's build every access guarded
# by an absl::Mutex would read as a race. So Debian's own Abseil source package (the same
# 20220623 release, with Debian's patches) is fetched into .tsan-absl/ (kept between runs) and
# built inside build-tsan with core/ (ENTROKV_ABSL_SOURCE_DIR: only the Abseil libraries core/
# links are compiled, all with TSan). core/ uses no gRPC, protobuf or Prometheus; those are not
# TSan-built either. docs/decisions.md "Sanitizers and fuzzing" says why this way.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${1:-$(nproc)}"
cache="$PWD/.tsan-absl"

abseil_source() {
  find "$cache/src" -mindepth 1 -maxdepth 1 -type d -name 'abseil*' 2>/dev/null | head -n 1 || true
}

source_dir="$(abseil_source)"
if [ -z "$source_dir" ] || [ ! -f "$source_dir/CMakeLists.txt" ]; then
  echo "== TSan: fetching Debian's Abseil source package into .tsan-absl"
  rm -rf "$cache"
  mkdir -p "$cache/src" "$cache/lists/partial"
  # A deb-src entry of our own on the machine's Debian mirror, so the machine's apt
  # configuration stays untouched and the repository names no host.
  mirror="$(bash deploy/debian_mirror.sh)"
  echo "deb-src $mirror bookworm main" >"$cache/sources.list"
  apt_options=(-o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$cache/lists" -o Debug::NoDropPrivs=true)
  # Without the source this stage cannot run, and a stage that did not run must not look like
  # one that passed: it fails, naming what it could not fetch.
  if ! { apt-get "${apt_options[@]}" -qq update &&
         (cd "$cache/src" && apt-get "${apt_options[@]}" -qq source abseil >/dev/null); }; then
    echo "== TSan: FAILED: Debian's Abseil source package could not be fetched from $mirror" \
      "(deb-src bookworm main; above)" >&2
    rm -rf "$cache"
    exit 1
  fi
  source_dir="$(abseil_source)"
fi

echo "== TSan: configuring and building core/ and the Abseil it links in build-tsan (${jobs} jobs)"
# -O1 -g1: TSan's advice (-O1 or more), line tables for its reports, and a faster CI stage.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DENTROKV_CORE_ONLY=ON \
  -DENTROKV_CUDA=OFF -DENTROKV_BUILD_BENCH=OFF -DENTROKV_SANITIZE=thread -DENTROKV_WERROR=ON \
  -DENTROKV_ABSL_SOURCE_DIR="$source_dir" ${ENTROKV_CMAKE_ARGS:-} >/dev/null
ninja -C build-tsan -j "$jobs" core/all
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/deploy/tsan.supp}"
exec ctest --test-dir build-tsan/core --output-on-failure -j "$jobs" --timeout 1200
