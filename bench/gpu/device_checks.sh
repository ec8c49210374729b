#!/usr/bin/env bash
# The GPU checks, run once on a GPU machine (docs/testing.md, "On a GPU"): the gpu-labelled tests,
# compute-sanitizer's memcheck and racecheck over the CUDA scorer, the scoring benchmark against
# PyTorch, and the CUDA worker's checks. Every step has its own time limit and the script goes on
# after a failure, so one run reports everything; it exits non-zero if any step failed.
#
# Needs, from the project root: .devrun/ (the binaries below with their libraries: entrokvd entrokv
# cuda_device_test cuda_scorer_test pool_cuda_test service_gpu_test device_buffer_gpu_test
# device_buffer_exporter), build/client/python (the generated Python client), python3 with
# torch and cupy.
# Usage: bash bench/gpu/device_checks.sh OUT_DIR
set -uo pipefail
out=${1:?usage: device_checks.sh OUT_DIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
bin=.devrun/bin
log=$out/device_checks.log
failed=()
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "==== $name (limit ${limit} s)" | tee -a "$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "==== $name: rc $rc in $((SECONDS - start)) s" | tee -a "$log"
  ((rc == 0)) || failed+=("$name")
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } >>"$log" 2>&1
for test in cuda_device_test pool_cuda_test cuda_scorer_test service_gpu_test; do
  step "$test" 60 "$bin/$test" --gtest_brief=1
  if ((${#failed[@]})) && [ "${failed[-1]}" = "$test" ] && command -v cuda-gdb >/dev/null; then
    # A crash's host and device stack, for the log.
    timeout -k 5 120 cuda-gdb -batch -ex run -ex bt -ex "info cuda kernels" \
      --args "$bin/$test" >>"$log" 2>&1
  fi
done
step scoring-bench 170 python3 bench/gpu/peer_torch_gpu.py \
  --runner "$bin/entrokv bench" --out "$out/gpu_peer_torch.json"
if [ -f bench/gpu/worker_checks.sh ]; then
  step worker-checks 160 bash bench/gpu/worker_checks.sh "$out"
fi
# The sanitizers over the kernels: memcheck over every scorer test (fewer random trials), racecheck
# over the random trials (odd shapes, both selection paths, every policy and dtype), the bad
# values and the pages longer than a tile; last, as the slowest.
step memcheck 90 env ENTROKV_GPU_TRIALS=60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/cuda_scorer_test" --gtest_brief=1
step racecheck 60 env ENTROKV_GPU_TRIALS=8 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bin/cuda_scorer_test" --gtest_brief=1 \
  --gtest_filter='CudaScorerTest.Matches*:CudaScorerTest.BadValues*:CudaScorerTest.PagesLonger*'
# Each kernel's time at the Llama-3-70B shape (T = 128K, bf16), the whole model and one layer,
# without flushing the caches between kernels (the pooling is meant to find its chunk in L2).
if command -v ncu >/dev/null; then
  step kernel-times 150 ncu --clock-control none --cache-control none --print-summary per-kernel \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
    "$bin/entrokv" bench core --scorer cuda --layers 80 --query-heads 64 --kv-heads 8 \
    --tokens 131072 --dtype bf16 --runs 1 --json
  sed -n '/==== kernel-times (limit/,$p' "$log" >"$out/gpu_ncu_llama70b.txt"
fi
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" | tee -a "$log"
  exit 1
fi
echo "all device checks passed" | tee -a "$log"
