#!/usr/bin/env bash
# Builds the container image (deploy/docker/Dockerfile) without any registry and checks it:
#   1. debootstrap makes a clean Debian 12 root, imported as a local base image;
#   2. buildah builds the Dockerfile from that base (--pull=never), which runs the project's
#      install script and `cmake --install` in the build stage;
#   3. the image is inspected (entrypoint, numeric non-root user, only the two binaries) and
#      run: entrokvd starts as that user and `entrokv status` from the image reports it healthy.
# A full build from scratch (33 minutes on the shared 2-core machine), so it is not part of the
# default test run: configure with -DENTROKV_IMAGE_TEST=ON and run `ctest -L image`, or run this
# script. ENTROKV_IMAGE_REUSE=1 checks an image of the same tag built before instead of
# rebuilding it.
# Needs root (debootstrap), and apt access to the machine's Debian mirror for the base and the
# build.
# buildah runs with --isolation chroot: the OCI runtime (crun) cannot create containers in
# sandboxes with hybrid cgroups, chroot isolation needs none.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The machine's own Debian mirror (its apt sources), unless ENTROKV_DEBIAN_MIRROR names another.
mirror="${ENTROKV_DEBIAN_MIRROR:-$(bash deploy/debian_mirror.sh)}"
tag="${ENTROKV_IMAGE_TAG:-localhost/entrokv:test}"
base="localhost/entrokv-test/debian:bookworm"
work="$(mktemp -d)"
containers=()
cleanup() {
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null ||
    { echo "build_test: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done

start=$(date +%s)
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  echo "== debootstrap: Debian 12 (bookworm, minbase) from $mirror"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb
  ctr=$(buildah from scratch)
  containers+=("$ctr")
  mnt=$(buildah mount "$ctr")
  cp -a "$work/rootfs/." "$mnt/"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
  buildah commit -q "$ctr" "$base" >/dev/null
  echo "   base image $base made in $(($(date +%s) - start)) s"
fi

if [ "${ENTROKV_IMAGE_REUSE:-0}" = 1 ] && buildah inspect --type image "$tag" >/dev/null 2>&1; then
  echo "== reusing $tag (ENTROKV_IMAGE_REUSE=1)"
else
  echo "== buildah build (CPU variant) from $base"
  build_start=$(date +%s)
  buildah build --isolation chroot --pull=never --layers=false \
    --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" \
    -f deploy/docker/Dockerfile -t "$tag" . >"$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; exit 1; }
  grep -E "collected [0-9]+ libraries" "$work/build.log" | sed 's/^/   /'
  echo "   image built in $(($(date +%s) - build_start)) s"
fi

echo "== inspecting $tag"
entrypoint=$(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$tag")
user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$tag")
[ "$entrypoint" = '[entrokvd]' ] || { echo "entrypoint is $entrypoint" >&2; exit 1; }
[[ "$user" =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] ||
  { echo "user '$user' is not numeric non-root" >&2; exit 1; }
ctr=$(buildah from --pull=never "$tag")
containers+=("$ctr")
mnt=$(buildah mount "$ctr")
binaries=$(ls "$mnt/opt/entrokv/bin" | tr '\n' ' ')
[ "$binaries" = "entrokv entrokvd " ] || { echo "image binaries: $binaries" >&2; exit 1; }
echo "   entrypoint $entrypoint, user $user, /opt/entrokv/bin: $binaries"
size=$(du -sh "$mnt/opt/entrokv" | cut -f1)
echo "   /opt/entrokv: $size ($(ls "$mnt/opt/entrokv/lib" | wc -l) libraries)"
buildah umount "$ctr" >/dev/null

echo "== running the image: entrokvd as $user, entrokv status from the image, SIGTERM"
# One shell inside the container starts the daemon on a kernel-chosen loopback port, asks it for
# its health with the image's own CLI, and stops it: the exit code is the daemon's. The image's
# /bin/sh reads the start-up line with the same function as demo.sh (deploy/entrokvd_line.sh).
# The container's /dev/shm is 64 MiB (buildah's default, as Docker's), which the default 1 GiB
# pool does not fit (entrokvd refuses to start then): a 16 MiB pool.
buildah run --isolation chroot --user "$user" "$ctr" -- sh -c "$(cat deploy/entrokvd_line.sh)"'
  entrokvd --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --pool_capacity_bytes=16777216 \
    >/tmp/daemon.out 2>&1 &
  pid=$!
  entrokvd_wait /tmp/daemon.out "$pid" 200 || { cat /tmp/daemon.out; exit 1; }
  server=$(entrokvd_address /tmp/daemon.out grpc)
  entrokv status --server "$server" || exit 1
  kill -TERM "$pid"
  wait "$pid"' | sed 's/^/   /'
echo "image test passed in $(($(date +%s) - start)) s: $tag"
