#!/usr/bin/env bash
# The project's C++ files against .clang-format, with Debian 12's clang-format-14.
#   bash deploy/format.sh --check   lists every file clang-format would change, fails if any
#   bash deploy/format.sh --fix     rewrites those files in place
# Files: the C++ sources and headers git tracks (.h, .cc, .cu, .cuh), so build folders and
# generated protobuf code are never touched; outside a git checkout, the same extensions under
# the repository minus build*/ folders.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  --check|--fix) ;;
  *) echo "usage: bash deploy/format.sh --check|--fix" >&2; exit 2 ;;
esac
clang_format="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$clang_format" >/dev/null; then
  echo "format: $clang_format not found (Debian: apt-get install clang-format-14)" >&2
  exit 2
fi

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.h' '*.cc' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . \( -path './build*' -o -path './.git' \) -prune -o -type f \
    \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||' | sort)
fi

# One clang-format per file, two at a time per core: a file is flagged when
# `clang-format --dry-run --Werror` would change it (or cannot read it).
flagged=()
mapfile -t flagged < <(printf '%s\0' "${files[@]}" |
  xargs -0 -P "$(($(nproc) * 2))" -n 1 sh -c \
    '"$0" --style=file --dry-run --Werror "$1" >/dev/null 2>&1 || printf "%s\n" "$1"' \
    "$clang_format" | sort)

if [ "$mode" = --fix ]; then
  for file in "${flagged[@]}"; do
    "$clang_format" --style=file -i "$file"
    echo "formatted $file"
  done
  echo "format: ${#flagged[@]} of ${#files[@]} files rewritten"
  exit 0
fi
if ((${#flagged[@]})); then
  for file in "${flagged[@]}"; do
    echo "== $file"
    "$clang_format" --style=file "$file" | diff -u --label "$file" --label "$file (formatted)" \
      "$file" - || true
  done
  echo "format: ${#flagged[@]} of ${#files[@]} files differ from .clang-format" \
    "(bash deploy/format.sh --fix rewrites them)" >&2
  exit 1
fi
echo "format: all ${#files[@]} files match .clang-format"
