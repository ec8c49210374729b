"""The pool-backed worker's speed against its peer, the plain numpy forward, on the same prompts.

    PYTHONPATH=build/client/python OPENBLAS_NUM_THREADS=1 /usr/bin/python3 \\
        bench/model/pool_worker_speed.py --weights eval/model/weights.npz \\
        --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
        > bench/results/pool_worker_speed.txt

Per prompt length, medians over `--prompts` prompts of each task: the plain forward, the
pool-backed prefill (K/V written into entrokvd's frames, statistics sent per layer), their
ratio; then per fork (page_entrokv and mean at ratio 0.75) the decode time per answer token
and the whole cycle (fork, decisions on DecideStream, greedy decode to EOS or 16 tokens, close).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "eval", "model"))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
import tasks  # noqa: E402
import entrokv  # noqa: E402  (client/python; PYTHONPATH=<build>/client/python)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--entrokvd", default="entrokvd")
    ap.add_argument("--entrokv", default="entrokv", help="the CLI: the policy registry")
    ap.add_argument("--prompts", type=int, default=2, help="per task and length")
    ap.add_argument("--seed", type=int, default=99)
    args = ap.parse_args()

    model = numpy_model.Model.load(args.weights)
    daemon = pool_worker.LocalDaemon(args.entrokvd)
    worker = pool_worker.PoolWorker(entrokv.Client(daemon.address), model,
                                    policy_registry.load(args.entrokv))
    policies = [pool_worker.Policy("page_entrokv", ratio=0.75),
                pool_worker.Policy("mean", ratio=0.75)]
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; "
          f"{model.config.layers} layers; {time.strftime('%Y-%m-%d')}")
    try:
        for length in (1024, 2048):
            forward, prefill, decode, cycle = [], [], [], []
            for task in tasks.TASKS:
                for example in tasks.examples(task, length, args.prompts, args.seed):
                    start = time.perf_counter()
                    model.forward(example.prompt)
                    forward.append(time.perf_counter() - start)
                    results = worker.run_forked(example, policies, max_new=16)
                    prefill.append(results[0].prefill_ms / 1e3)
                    decode += [r.decode_ms / r.decode_tokens for r in results if r.decode_tokens]
                    cycle += [r.cycle_ms for r in results]
            m = statistics.median
            print(f"T={length}: plain forward {m(forward):.2f} s, pool-backed prefill "
                  f"{m(prefill):.2f} s (ratio {m(prefill) / m(forward):.2f}); decode "
                  f"{m(decode):.1f} ms/token; fork cycle {m(cycle):.0f} ms "
                  f"({len(forward)} prompts, {len(cycle)} forks)", flush=True)
    finally:
        worker.close(unregister=True)
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
