#!/usr/bin/env bash
# Sets up entrokv on a Debian 12 machine and runs it: `demo` (the main job) or `test` (every
# test). Installs what is missing with apt-get, configures and builds in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  demo|test|build) ;;
  *) echo "usage: bash deploy/local.sh demo|test|build" >&2; exit 2 ;;
esac

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
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
# The deploy tests render the Kubernetes manifests with `kubectl kustomize`. Debian 12 packages
# kubectl as kubernetes-client; a kubectl that is already there (another vendor's package) is
# kept, since the two cannot be installed together.
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

jobs="$(nproc)"
targets=()
[ "$mode" = demo ] && targets=(entrokvd entrokv)  # the main job needs only the two binaries
echo "== configuring and building ${targets[*]:-everything} (${jobs} jobs)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${ENTROKV_CMAKE_ARGS:-} >/dev/null
ninja -C build -j "$jobs" "${targets[@]}"

case "$mode" in
  demo) exec bash deploy/demo.sh build ;;
  test) exec ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600 ;;
  build) ;;
esac
