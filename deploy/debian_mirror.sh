#!/usr/bin/env bash
# Prints the Debian archive this machine's apt uses (the first `URIs:` of a deb822 source, or the
# first `deb` line of a one-line list, skipping the security archive), so that scripts which need
# the archive themselves (deploy/tsan.sh, deploy/docker/build_test.sh) use the machine's mirror
# and the repository names no host. Exits 1 with a message when apt has no Debian source.
set -euo pipefail
shopt -s nullglob
mirror=""
for file in /etc/apt/sources.list.d/*.sources; do
  mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$file")
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ]; then
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    mirror=$(awk '$1 == "deb" && $0 !~ /security/ {
      for (i = 2; i <= NF; ++i) if ($i ~ /^[a-z+]+:\/\//) {print $i; exit}
    }' "$file")
    [ -n "$mirror" ] && break
  done
fi
[ -n "$mirror" ] || { echo "debian_mirror.sh: no Debian archive in apt's sources (/etc/apt)" >&2; exit 1; }
echo "${mirror%/}"
