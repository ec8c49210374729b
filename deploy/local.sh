#!/usr/bin/env bash
# Sets up entrokv on a Debian 12 machine and runs it: `demo` (the main job) or `test` (every
# test). Installs what is missing with apt-get, configures and builds in ./build as a plain
# Release build (-O3: the build type a user or a packager tries first, and the one where g++ 12
# warns most), with warnings as errors (-DENTROKV_WERROR=ON: Debian 12's g++ builds the project
# warning-free).
# CI's further stages (docs/testing.md), each in its own build folder:
#   format    the C++ files against .clang-format (deploy/format.sh --check), no build
#   sanitize  every test under ASan+UBSan, built by clang with its thread-safety analysis
#             (build-asan; deploy/thread_safety.py checks that it covers every unit)
#   fuzz      the libFuzzer targets (clang), each run for ENTROKV_FUZZ_SECONDS (build-fuzz)
#   tsan      core/ tests under TSan, against Abseil built with TSan from Debian's source
#             (build-tsan; the Abseil build is cached in .tsan-absl)
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  demo|test|build|format|sanitize|fuzz|tsan) ;;
  *)
    echo "usage: bash deploy/local.sh demo|test|build|format|sanitize|fuzz|tsan" >&2
    exit 2
    ;;
esac

# Installs with apt-get whichever of the named packages are missing.
install_missing() {
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
  done
  # The deploy tests render the Kubernetes manifests with `kubectl kustomize`. Debian 12
  # packages kubectl as kubernetes-client; a kubectl that is already there (another vendor's
  # package) is kept, since the two cannot be installed together.
  [ "$mode" = format ] || command -v kubectl >/dev/null || missing+=(kubernetes-client)
  ((${#missing[@]})) || return 0
  echo "== installing ${missing[*]}"
  local sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# The format check needs nothing but clang-format: no build.
if [ "$mode" = format ]; then
  install_missing clang-format-14 git
  exec bash deploy/format.sh --check
fi

packages=(
  g++ cmake ninja-build git curl pkg-config ca-certificates
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-grpcio python3-protobuf python3-matplotlib
  libopenblas0-pthread  # numpy's BLAS: the small model's forward is 5-10x slower on the reference one
  nlohmann-json3-dev python3-pip python3-setuptools libssl-dev
  prometheus openssl
  libleveldb-dev libsnappy-dev libsqlite3-dev
  yamllint python3-yaml
)
# Only the tests need PyTorch (eval/model's training code is checked against the numpy model).
[ "$mode" = test ] && packages+=(python3-torch)
# Only the fuzz stage needs clang and libFuzzer, and the sanitized build clang.
[ "$mode" = fuzz ] && packages+=(clang-14 libfuzzer-14-dev)
[ "$mode" = sanitize ] && packages+=(clang-14)
# The tsan stage builds Abseil from Debian's source package.
[ "$mode" = tsan ] && packages+=(dpkg-dev)
install_missing "${packages[@]}"

jobs="$(nproc)"
case "$mode" in
  sanitize)
    echo "== ASan+UBSan, thread-safety analysis: clang builds all in build-asan (${jobs} jobs)"
    # CUDA off: nvcc takes no sanitizer flags, and the GPU tests skip anyway.
    # -O1 -g1: the sanitizers' advice (-O1 keeps reports exact), line tables for their stack
    # traces, and less compile time on CI's 2 cores.
    # clang: its -Wthread-safety (the project's warnings under clang) checks the lock
    # annotations in the same compile, and it builds this faster than g++ (docs/testing.md).
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENTROKV_CUDA=OFF \
      -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DENTROKV_SANITIZE=address,undefined -DENTROKV_WERROR=ON ${ENTROKV_CMAKE_ARGS:-} >/dev/null
    python3 deploy/thread_safety.py build-asan
    ninja -C build-asan -j "$jobs"
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    exec ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 1200
    ;;
  fuzz)
    echo "== libFuzzer: configuring and building the fuzz targets in build-fuzz (${jobs} jobs)"
    cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_COMPILER=clang++-14 -DENTROKV_CUDA=OFF -DENTROKV_WERROR=OFF \
      -DENTROKV_FUZZ=ON -DENTROKV_SANITIZE=address,undefined -DENTROKV_BUILD_TESTS=OFF \
      -DENTROKV_BUILD_BENCH=OFF ${ENTROKV_CMAKE_ARGS:-} >/dev/null
    ninja -C build-fuzz -j "$jobs" fuzzers
    exec bash tests/fuzz/run.sh build-fuzz "${ENTROKV_FUZZ_SECONDS:-45}"
    ;;
  tsan)
    exec bash deploy/tsan.sh "$jobs"
    ;;
esac
targets=()
# The main job needs the two binaries and the Python client (eval/model's worker imports it).
[ "$mode" = demo ] && targets=(entrokvd entrokv entrokv_python)
echo "== configuring and building ${targets[*]:-everything} (${jobs} jobs)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DENTROKV_WERROR=ON \
  ${ENTROKV_CMAKE_ARGS:-} >/dev/null
ninja -C build -j "$jobs" "${targets[@]}"

case "$mode" in
  demo) exec bash deploy/demo.sh build ;;
  test)
    # python3-torch is installed above: eval/model's PyTorch checks must run, not skip.
    export ENTROKV_REQUIRE_TORCH=1
    exec ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600 ;;
  build) ;;
esac
