#!/usr/bin/env bash
# The main job on a built tree: a generated attention statistic with a retrieval needle, scored
# offline by `entrokv select` with Page-EntroKV, raw-entropy weights (no sink isolation) and mean pooling.
set -euo pipefail
build="${1:-build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 - "$work/stats.npy" <<'PY'
import sys
import numpy as np
# One layer of a GQA model with 2 KV groups of 4 query heads, T = 4096 tokens. Group 0 holds a
# sink head, two diffuse heads and a retrieval head focused on a needle at token 1500.
rng = np.random.default_rng(7)
heads, tokens = 8, 4096
stats = rng.random((heads, tokens)).astype(np.float32)
stats[0, :4] = 400.0                      # sink head: most mass on the first tokens
stats[3, :] *= 0.001; stats[3, 1500] = 60  # retrieval head
stats[4:, -256:] *= 8                     # group 1: local heads
stats /= stats.sum(axis=1, keepdims=True)
np.save(sys.argv[1], stats)
PY

for policy in page_entrokv raw_entropy mean; do
  echo "== entrokv select --policy $policy (needle at token 1500 = page 93, 16 of 256 pages kept)"
  "$build/client/cli/entrokv" select --stats "$work/stats.npy" --kv-heads 2 --page-size 16 \
    --pages 16 --policy "$policy" --format table
  "$build/client/cli/entrokv" select --stats "$work/stats.npy" --kv-heads 2 --page-size 16 \
    --pages 16 --policy "$policy" --format json |
    /usr/bin/python3 -c 'import json,sys; g=json.load(sys.stdin)["layers"][0]["groups"][0]; print("   group 0 keeps the needle page 93:", 93 in g["kept_pages"])'
done
