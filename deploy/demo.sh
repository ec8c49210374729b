#!/usr/bin/env bash
# The main job on a built tree: starts entrokvd on its embedded defaults (host shared-memory
# pool, no GPU), replays simulated Qwen2.5-1.5B prefills through it with four policies, prints
# the comparison, replays them again into a pool in vLLM's frame layout (a frame holds every KV
# head of a layer; layer-scope selection there), runs the small GQA model of eval/model through
# the same daemon when its weights are committed (its KV cache is the daemon's pool), shows a
# slice of /metrics, and stops the daemon cleanly.
set -euo pipefail
build="${1:-build}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=deploy/entrokvd_line.sh
. "$repo/deploy/entrokvd_line.sh"
model_prompts="${ENTROKV_DEMO_MODEL_PROMPTS:-8}"
serve_requests="${ENTROKV_DEMO_SERVE_REQUESTS:-12}"
tokens="${ENTROKV_DEMO_TOKENS:-8192}"
sequences="${ENTROKV_DEMO_SEQUENCES:-4}"
work="$(mktemp -d)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting entrokvd (host pool, loopback, ports chosen by the kernel)"
# 2 GiB of arena address space for the two pools (host shared memory is touched only when used).
"$build/service/entrokvd" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
  --pool_capacity_bytes 2147483648 >"$work/entrokvd.out" 2>"$work/entrokvd.err" &
daemon_pid=$!
entrokvd_wait "$work/entrokvd.out" "$daemon_pid" ||
  { echo "entrokvd did not start:" >&2; cat "$work/entrokvd.err" >&2; exit 1; }
server="$(entrokvd_address "$work/entrokvd.out" grpc)"
metrics="$(entrokvd_address "$work/entrokvd.out" metrics)"
echo "   $(cat "$work/entrokvd.out")"

echo "== entrokv replay: ${sequences} concurrent sequences x ${tokens} tokens, 20% budget"
"$build/client/cli/entrokv" replay --server "$server" --model qwen2.5-1.5b \
  --tokens "$tokens" --budget 0.2 --sequences "$sequences" --concurrency "$sequences" \
  --policy page_entrokv,mean,head_independent,streaming

echo "== the same prefills in the layer frame layout (vLLM: a frame holds every KV head of a layer)"
"$build/client/cli/entrokv" replay --server "$server" --model qwen2.5-1.5b \
  --model-id qwen2.5-1.5b-layer --frame-layout layer \
  --tokens "$tokens" --budget 0.2 --sequences "$sequences" --concurrency "$sequences" \
  --policy page_entrokv,head_independent

weights="$repo/eval/model/weights.npz"
if [ -f "$weights" ]; then
  echo "== a real model: eval/model's small GQA model (6 layers, 8 query heads, 2 KV heads) whose"
  echo "   KV cache is this daemon's pool: K/V written into its shared-memory frames, decisions"
  echo "   per layer, answers decoded greedily from the kept pages only. Single-needle and variable-"
  echo "   tracking prompts here; all four tasks in docs/evaluation/. Policies: page_entrokv, snapkv"
  echo "   and the default (the question's pages first, then those expected attention from the"
  echo "   pool's keys favours; pyramid layer allocator: entrokv.default_policy)"
  PYTHONPATH="$build/client/python${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 \
    "$repo/eval/model/pool_worker.py" --server "$server" --weights "$weights" \
    --entrokv "$build/client/cli/entrokv" \
    --prompts "$model_prompts" --length 1024 --tasks single_needle,variable_tracking \
    --policies page_entrokv,snapkv,mean+winexpcoverfwdsink50+pyramid --ratio 0.75
  echo "== serving under pool pressure: the same model behind a continuous-batching loop (time in"
  echo "   decode steps) whose pool holds 25% of the offered KV. fcfs and recompute keep every page,"
  echo "   fixed keeps 25% of each prompt, manager leaves the budgets to entrokvd (admission, quotas"
  echo "   where pages are worth least, preemption); the full report is docs/evaluation/pressure"
  PYTHONPATH="$build/client/python${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 \
    "$repo/eval/model/serve.py" --server "$server" --weights "$weights" \
    --entrokv "$build/client/cli/entrokv" --requests "$serve_requests" --lengths 1024 \
    --shares 0.25 --strategies fcfs,recompute,fixed,manager --short
else
  echo "== (no eval/model/weights.npz in this checkout: the real-model run is skipped)"
fi

echo "== metrics are at http://${metrics}/metrics; a few of them:"
curl -fsS "http://${metrics}/metrics" |
  grep -E '^entrokv_(pool_frames|decisions_total|union_overhead_ratio_(sum|count)|layer_scope_frames_saved_total)' |
  grep -v ' 0$' | awk 'NR <= 16'

echo "== stopping entrokvd (SIGTERM, graceful drain)"
kill -TERM "$daemon_pid"
# `wait pid && echo` would not stop the script under set -e: the exit code is checked itself.
code=0
wait "$daemon_pid" || code=$?
daemon_pid=""
if [ "$code" -ne 0 ]; then
  echo "   entrokvd exited with code $code:" >&2
  cat "$work/entrokvd.err" >&2
  exit 1
fi
echo "   entrokvd exited cleanly"
