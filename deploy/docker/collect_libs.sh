#!/usr/bin/env bash
# Copies the shared libraries that PREFIX/bin/* load into PREFIX/lib, except the C library
# family that every base image has (glibc must match the base's loader, so it is not copied).
# Used by the image's build stage so that the runtime stage needs only PREFIX.
set -euo pipefail
prefix="$1"
mkdir -p "$prefix/lib"
ldd "$prefix"/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$prefix/lib/"; done
# Fails the build when anything is still unresolved with only PREFIX/lib added.
if LD_LIBRARY_PATH="$prefix/lib" ldd "$prefix"/bin/* | grep -q "not found"; then
  LD_LIBRARY_PATH="$prefix/lib" ldd "$prefix"/bin/* | grep "not found" >&2
  exit 1
fi
echo "collected $(ls "$prefix/lib" | wc -l) libraries into $prefix/lib"
