#!/usr/bin/python3
"""The CUDA pool worker against the host one, on a GPU: the same prompts, policies and budget
through one entrokvd (started with --backend=cuda, or any daemon with a GPU: each worker names
its pool's backend). For every prompt and policy it checks that the CUDA worker (PyTorch on the
GPU, K/V in the daemon's CUDA frames, statistics sent as device buffers) gives the same greedy
answer and keeps the same pages of every (layer, group) and as many frames as the host worker
(numpy, shared-memory arena, statistics as bytes), with every frame no sequence names filled
with NaN on the GPU after each of its decisions (the poisoned-frame check: an answer that read
one would be NaN or differ). Writes a JSON summary; exit 0 when everything matched.

  PYTHONPATH=build/client/python python3 eval/model/cuda_worker_check.py \\
      --server 127.0.0.1:50051 --entrokv entrokv --weights eval/model/weights.npz --out check.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
import tasks  # noqa: E402

import entrokv  # noqa: E402


def kept_pages(decisions) -> list:
    """[layer][group] -> sorted kept pages, from the LayerDecision records."""
    return [[sorted(int(p) for p in g.kept_pages) for g in d.groups]
            for d in sorted(decisions, key=lambda d: d.layer)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--entrokv", default="entrokv", help="the CLI (the policy registry)")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--tasks", default="single_needle,variable_tracking")
    parser.add_argument("--policies", default="none,page_entrokv,h2o")
    parser.add_argument("--ratio", type=float, default=0.75)
    parser.add_argument("--frame-layout", choices=("group", "layer"), default="group")
    parser.add_argument("--capacity-frames", type=int, default=4096)
    parser.add_argument("--out", required=True, help="JSON summary")
    args = parser.parse_args(argv)

    import torch  # noqa: F401 -- the CUDA worker's; imported here so a missing one says so
    import pool_worker_cuda

    registry = policy_registry.load(args.entrokv)
    chosen = pool_worker.parse_policies(args.policies, args.ratio)
    model = numpy_model.Model.load(args.weights)
    task_list = [t for t in args.tasks.split(",") if t]
    per_task = -(-args.prompts // len(task_list))
    examples = [e for t in task_list for e in tasks.examples(t, args.length, per_task, 0)]
    examples = examples[:args.prompts]
    summary = {"gpu": torch.cuda.get_device_name(), "prompts": len(examples),
               "length": args.length, "policies": [p.label() for p in chosen],
               "ratio": args.ratio, "frame_layout": args.frame_layout, "runs": []}
    failures = 0
    started = time.perf_counter()
    with entrokv.Client(args.server, timeout_s=60) as client:
        common = dict(frame_layout=args.frame_layout, capacity_frames=args.capacity_frames)
        host = pool_worker.PoolWorker(client, model, registry, model_id="check-host", **common)
        gpu = pool_worker_cuda.CudaPoolWorker(client, model, registry, model_id="check-cuda",
                                              **common)
        try:
            for example in examples:
                for policy in chosen:
                    poisoned = []

                    def poison(kv, decisions):
                        used = {int(f) for s in client.list_sequences(gpu.model_id,
                                                                      block_tables=True)
                                for t in s.block_tables for f in t.frames if f >= 0}
                        free = sorted(set(range(gpu.pool.capacity_frames)) - used)
                        gpu.arena.poison(free)
                        poisoned.append(len(free))

                    on_host = host.run_prompt(example, policy)
                    on_gpu = gpu.run_prompt(example, policy, on_decided=poison)
                    same_answer = on_host.answer == on_gpu.answer
                    same_pages = kept_pages(on_host.decisions) == kept_pages(on_gpu.decisions)
                    same_frames = on_host.kept_frames == on_gpu.kept_frames
                    finite = bool(np.all(np.isfinite(on_gpu.logits)))
                    poison_ran = policy.name == "none" or (poisoned and poisoned[0] > 0)
                    ok = same_answer and same_pages and same_frames and finite and poison_ran
                    failures += not ok
                    summary["runs"].append({
                        "task": example.task, "policy": policy.label(), "ok": ok,
                        "same_answer": same_answer, "same_kept_pages": same_pages,
                        "kept_frames_host": on_host.kept_frames,
                        "kept_frames_cuda": on_gpu.kept_frames,
                        "correct_host": on_host.correct, "correct_cuda": on_gpu.correct,
                        "poisoned_frames": poisoned[0] if poisoned else 0,
                        "logits_finite": finite,
                        "max_logit_difference": float(np.max(np.abs(
                            on_host.logits[:1] - on_gpu.logits[:1]))),
                        "prefill_ms_host": round(on_host.prefill_ms, 1),
                        "prefill_ms_cuda": round(on_gpu.prefill_ms, 1)})
                    with open(args.out, "w") as out:  # so far: a run cut short leaves these
                        json.dump(summary, out, indent=1)
                    print(f"{example.task:<18} {policy.label():<20} answer "
                          f"{'same' if same_answer else 'DIFFERS'}, kept pages "
                          f"{'same' if same_pages else 'DIFFER'}, frames {on_host.kept_frames}/"
                          f"{on_gpu.kept_frames}, poisoned {poisoned[0] if poisoned else 0}",
                          flush=True)
            stats = client.pool_stats(gpu.model_id)
            summary["cuda_pool_after"] = {"used_frames": stats.used_frames,
                                          "free_frames": stats.free_frames}
            failures += stats.used_frames != 0
        finally:
            host.close(unregister=True)
            gpu.close(unregister=True)
    summary["failures"] = failures
    summary["seconds"] = round(time.perf_counter() - started, 1)
    with open(args.out, "w") as out:
        json.dump(summary, out, indent=1)
    print(f"{len(summary['runs'])} runs, {failures} failed, {summary['seconds']} s")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
