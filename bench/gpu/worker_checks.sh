#!/usr/bin/env bash
# The device_buffer statistic source and the CUDA pool worker on a GPU machine, in one
# bounded run (under 150 s; every step has a timeout; the daemon is killed on exit).
#
# Needs, from the repository root:
#   .devrun/bin/entrokvd                 the daemon (a CUDA build)
#   .devrun/bin/entrokv                  the CLI (the policy registry: `entrokv policies --json`)
#   .devrun/bin/device_buffer_gpu_test   the daemon mapping a worker's allocation (ctest label gpu)
#   .devrun/bin/device_buffer_exporter   the worker process that test starts
#   .devrun/lib/                         their libraries (shared/tools/device-bundle.sh)
#   build/client/python/                 the generated Python client (carried: it is ignored)
#   python3 with torch (CUDA), cupy, grpcio, numpy, protobuf ($PYTHON names another)
#
# Usage: bash bench/gpu/worker_checks.sh OUT_DIR
# Writes at most 4 files into OUT_DIR:
#   worker_checks.log          every step's output, the GPU, the daemon's stderr, the verdicts
#   device_buffer_gpu_test.txt the GPU tests' output
#   cuda_worker_check.json     CUDA worker vs host worker: answers, kept pages/frames, poison
#   decision_latency.json      one decision end to end: bytes vs shared_memory vs device_buffer
# Exit status: 0 when every step passed, else the number of steps that failed.
set -u
out=${1:?usage: worker_checks.sh OUT_DIR}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bin=$root/.devrun/bin
log=$out/worker_checks.log
export LD_LIBRARY_PATH=$root/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$root/build/client/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
failed=0
daemon_pid=
daemon_dir=$(mktemp -d)
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$daemon_pid" 2>/dev/null
  fi
  if [ -f "$daemon_dir/stderr" ]; then
    { echo "== entrokvd stderr (last 40 lines)"; tail -n 40 "$daemon_dir/stderr"; } >>"$log"
  fi
  rm -rf "$daemon_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Seconds a step may take: its own limit, cut to what is left of the 135 s the steps have (the
# kill grace and the daemon's stop keep the whole run under 150 s).
within() {
  local left=$((135 - SECONDS))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}
step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs it, counts a failure
  local name=$1 limit; limit=$(within "$2"); shift 2
  echo "== $name (timeout ${limit}s): $*" | tee -a "$log"
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$log"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  return 0
}

: >"$log"
echo "== $(date -u +%FT%TZ) worker_checks on $(hostname)" >>"$log"
timeout 5 nvidia-smi -L >>"$log" 2>&1

# The generated _pb2 files come from protoc 3.21. A protobuf runtime that refuses them (a newer
# major version) is retried with the pure-Python implementation, which accepts them.
versions="import entrokv.device, torch, cupy, grpc, google.protobuf as p; print('torch', \
torch.__version__, 'cupy', cupy.__version__, 'protobuf', p.__version__, 'grpcio', \
grpc.__version__, torch.cuda.get_device_name())"
if ! timeout 25 "$python" -c "$versions" >>"$log" 2>&1; then
  echo "== the client did not import; trying the pure-Python protobuf" >>"$log"
  export PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
  timeout 20 "$python" -c "$versions" >>"$log" 2>&1 || failed=$((failed + 1))
fi

# 1. The daemon maps a worker's allocation (in-process daemon, exporter processes): ~10 s.
ENTROKV_DEVICE_BUFFER_EXPORTER=$bin/device_buffer_exporter \
  timeout -k 5 "$(within 30)" "$bin/device_buffer_gpu_test" >"$out/device_buffer_gpu_test.txt" 2>&1
rc=$?
echo "== device_buffer_gpu_test: exit $rc" | tee -a "$log"
tail -n 5 "$out/device_buffer_gpu_test.txt" >>"$log"
if grep -q "SKIPPED" "$out/device_buffer_gpu_test.txt"; then
  echo "== device_buffer_gpu_test SKIPPED tests (no usable device?): counted as a failure" >>"$log"
  failed=$((failed + 1))
elif [ "$rc" -ne 0 ]; then
  failed=$((failed + 1))
fi

# 2. A daemon whose default backend is cuda, on kernel-chosen ports.
"$bin/entrokvd" --backend=cuda --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --pool_capacity_bytes=4294967296 >"$daemon_dir/stdout" 2>"$daemon_dir/stderr" &
daemon_pid=$!
address=
for _ in $(seq 1 30); do
  address=$(sed -n 's/^entrokvd listening on \([^ ]*\).*/\1/p' "$daemon_dir/stdout" | head -n 1)
  [ -n "$address" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.5
done
if [ -z "$address" ]; then
  echo "== entrokvd did not start" | tee -a "$log"
  exit $((failed + 1))
fi
echo "== entrokvd --backend=cuda at $address" | tee -a "$log"

# 3. The CUDA worker against the host worker on the same prompts, poisoned frames on the GPU.
step cuda_worker_check 60 "$python" eval/model/cuda_worker_check.py --server "$address" \
  --entrokv "$bin/entrokv" --weights eval/model/weights.npz --prompts 4 --length 512 \
  --policies none,page_entrokv,h2o --ratio 0.75 --out "$out/cuda_worker_check.json"

# 4. One decision end to end by statistic source.
step decision_latency 40 "$python" bench/gpu/decision_latency.py --server "$address" \
  --tokens 2048,8192,32768 --repeats 5 --out "$out/decision_latency.json"

echo "== done: $failed step(s) failed, ${SECONDS} s" | tee -a "$log"
exit "$failed"
