#!/usr/bin/python3
"""One decision end to end on a GPU, by where the statistic is: the time from a statistic ready
in the worker's GPU memory to the Decide call returned (its frames freed), when it is sent as
bytes (copied to the host, then in the request), through shared memory (copied to the host into
a segment the daemon reads) or as a device buffer (the daemon maps the worker's allocation once
and copies it to its host itself). Every layer of the model is decided in one Decide, on a fresh
sequence each repetition (its opening and closing are not timed). Writes JSON with the GPU's
name; the median and the spread of `--repeats` decisions per (source, tokens).

  PYTHONPATH=build/client/python python3 bench/gpu/decision_latency.py \\
      --server 127.0.0.1:50051 --out decision_latency.json
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time

import numpy as np

import entrokv
from entrokv.v1 import types_pb2 as types

GEOMETRY = dict(layers=8, query_heads=32, kv_groups=8, head_dim=128, page_size=16)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--tokens", default="2048,8192,32768")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--backend", choices=("cuda", "host"), default="cuda",
                        help="the pool's arena (the statistic's path is the same for both)")
    parser.add_argument("--device", default="cuda",
                        help="cpu: a dry run of the script without a GPU (bytes and "
                             "shared_memory only; not a measurement)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    sizes = [int(t) for t in args.tokens.split(",") if t]
    layers, heads = GEOMETRY["layers"], GEOMETRY["query_heads"]
    frame_bytes = 2 * GEOMETRY["page_size"] * GEOMETRY["head_dim"] * 2  # f16 K and V
    frames_needed = layers * GEOMETRY["kv_groups"] * -(-max(sizes) // GEOMETRY["page_size"])
    result = {"gpu": torch.cuda.get_device_name() if on_gpu else "none (dry run on the CPU)",
              "torch": torch.__version__,
              "geometry": GEOMETRY, "fraction": args.fraction, "repeats": args.repeats,
              "backend": args.backend,
              "what": "Decide of every layer; from the statistic ready on the GPU "
                      "(torch.cuda.synchronize) to the call returned with frames freed",
              "runs": []}
    segment_name = f"/entrokv-bench-{os.getpid()}"
    fd = os.open(f"/dev/shm/{segment_name[1:]}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    largest = layers * heads * max(sizes) * 4
    os.ftruncate(fd, largest)
    segment = mmap.mmap(fd, largest)
    os.close(fd)
    client = entrokv.Client(args.server, timeout_s=120)
    model = f"bench-{os.getpid()}"
    try:
        client.register_model(model, capacity_bytes=(frames_needed + 64) * frame_bytes,
                              element_bytes=2, backend=args.backend, **GEOMETRY)
        for tokens in sizes:
            stats = torch.rand((layers, heads, tokens), device=device, dtype=torch.float32)
            stats /= stats.sum(dim=2, keepdim=True)
            exported = entrokv.DeviceBuffer(stats) if on_gpu else None
            shm_view = np.ndarray((layers, heads, tokens), np.float32, buffer=segment)
            length = heads * tokens * 4

            def as_bytes():
                return stats.cpu().numpy()

            def as_shm():
                shm_view[...] = stats.cpu().numpy()
                return [types.Statistic(
                    dtype=types.DTYPE_FLOAT32, query_heads=heads, tokens=tokens,
                    shared_memory=types.SharedMemoryRegion(segment=segment_name,
                                                           offset_bytes=layer * length,
                                                           length_bytes=length))
                    for layer in range(layers)]

            def as_device():
                return [exported.statistic(stats[layer], sync=False) for layer in range(layers)]

            sources = [("bytes", as_bytes), ("shared_memory", as_shm)]
            if on_gpu:
                sources.append(("device_buffer", as_device))
            for source, build in sources:
                times, freed = [], 0
                for repeat in range(args.repeats + 1):  # the first is a warm-up, not counted
                    sequence = f"{source}-{tokens}-{repeat}"
                    client.open_sequence(model, sequence, tokens)
                    sync()
                    start = time.perf_counter()
                    decisions = client.decide(model, sequence, build(), fraction=args.fraction,
                                              policy="page_entrokv")
                    elapsed = time.perf_counter() - start
                    client.close_sequence(model, sequence)
                    if repeat:
                        times.append(elapsed * 1e3)
                        freed = sum(len(d.freed_frames) for d in decisions)
                result["runs"].append({
                    "source": source, "tokens": tokens, "statistic_bytes": layers * length,
                    "median_ms": round(statistics.median(times), 3),
                    "min_ms": round(min(times), 3), "max_ms": round(max(times), 3),
                    "freed_frames": freed})
                print(f"{source:<14} {tokens:>7} tokens  median {statistics.median(times):8.2f} ms"
                      f"  (min {min(times):.2f}, max {max(times):.2f}), {freed} frames freed",
                      flush=True)
    finally:
        try:
            client.unregister_model(model, force=True)
        except entrokv.EntrokvError:
            pass
        client.close()
        segment.close()
        os.unlink(f"/dev/shm/{segment_name[1:]}")
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
