#!/usr/bin/python3
"""What a keys statistic (and a keys mix) costs a decision: the daemon reading and scoring the
keys in its own frames against the same decision with the statistic sent as bytes (for a keys
mix: the bytes sent as well, averaged with the keys' scores or ordered by page with them by the
cover rule), through a private entrokvd
on loopback, at one shape. Each round decides every setting in turn on a fresh fork of one
sequence whose frames hold random keys (so every setting sees the same machine and the same
pages), with the policy `mean` and a fixed budget. Writes the runs as JSON lines and a markdown
table of medians and the ratio to bytes within each round:

  PYTHONPATH=build/client/python /usr/bin/python3 bench/service/key_statistic_cost.py \\
      --entrokvd build/service/entrokvd --jsonl bench/results/keys/cost.jsonl \\
      --table bench/results/keys/cost.md
"""

import argparse
import json
import mmap
import os
import statistics
import sys
import time

import numpy as np

import entrokv

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "eval",
                                "model"))
import pool_worker  # noqa: E402  (LocalDaemon)

DTYPES = {"f16": np.float16, "f32": np.float32}


def fill_keys(pool, tables, page_size, head_dim, dtype, seed):
    """Random keys in every frame's K block (V left as it is)."""
    rng = np.random.default_rng(seed)
    frame_bytes = pool.frame_bytes
    fd = os.open(os.path.join("/dev/shm", pool.arena_name.lstrip("/")), os.O_RDWR)
    try:
        arena = mmap.mmap(fd, pool.capacity_bytes)
    finally:
        os.close(fd)
    keys = rng.standard_normal((page_size, head_dim)).astype(dtype).tobytes()
    for table in tables:
        for frame in table.frames:
            start = int(frame) * frame_bytes
            arena[start:start + len(keys)] = keys
    arena.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entrokvd", required=True)
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--query-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f16")
    parser.add_argument("--keep", type=float, default=0.2, help="share of pages kept")
    args = parser.parse_args()

    page_size, dtype = 16, DTYPES[args.dtype]
    element = np.dtype(dtype).itemsize
    pages = -(-args.tokens // page_size)
    frames = 2 * args.layers * args.kv_heads * pages  # the sequence and one fork's copies
    frame_bytes = 2 * page_size * args.head_dim * element
    daemon = pool_worker.LocalDaemon(
        args.entrokvd, f"--pool_capacity_bytes={frames * frame_bytes}",
        f"--max_message_bytes="
        f"{args.layers * args.query_heads * (args.tokens + args.head_dim ** 2) * 4 + (1 << 20)}")
    rows = []
    try:
        with entrokv.Client(daemon.address, timeout_s=600) as client:
            pool = client.register_model(
                "bench", layers=args.layers, query_heads=args.query_heads,
                kv_groups=args.kv_heads, head_dim=args.head_dim, page_size=page_size,
                element_bytes=element, capacity_bytes=frames * frame_bytes)
            client.open_sequence("bench", "s", initial_tokens=args.tokens)
            tables = [t for s in client.list_sequences("bench", block_tables=True)
                      for t in s.block_tables]
            fill_keys(pool, tables, page_size, args.head_dim, dtype, 1)
            stats = np.random.default_rng(2).random(
                (args.layers, args.query_heads, args.tokens), dtype=np.float32)
            # Query statistics of the expected-attention score: a mean and a covariance per head.
            rng = np.random.default_rng(3)
            mean = rng.standard_normal((args.query_heads, args.head_dim)).astype(np.float32)
            factor = rng.standard_normal((args.query_heads, args.head_dim, args.head_dim))
            covariance = (factor @ factor.transpose(0, 2, 1) / args.head_dim).astype(np.float32)
            settings = {
                "bytes (float32 statistic)": lambda: stats,
                "keys keydiff": lambda: [entrokv.key_statistic(
                    args.query_heads, args.tokens, "keydiff", args.dtype)] * args.layers,
                "keys norm": lambda: [entrokv.key_statistic(
                    args.query_heads, args.tokens, "norm", args.dtype)] * args.layers,
                "keys expected attention, mean": lambda: [entrokv.key_statistic(
                    args.query_heads, args.tokens, "expected_attention", args.dtype,
                    query_mean=mean)] * args.layers,
                "keys expected attention, mean and covariance": lambda: [entrokv.key_statistic(
                    args.query_heads, args.tokens, "expected_attention", args.dtype,
                    query_mean=mean, query_covariance=covariance)] * args.layers,
                # The covariance as a factor of rank head_dim / 4 (query_covariance_factor).
                "keys expected attention, mean and a covariance of rank d/4": lambda: [
                    entrokv.key_statistic(
                        args.query_heads, args.tokens, "expected_attention", args.dtype,
                        query_mean=mean,
                        query_covariance_factor=factor[:, :args.head_dim // 4] / args.head_dim)]
                * args.layers,
                # A keys mix: the float32 statistic sent, averaged with the keys' scores.
                "bytes mixed with expected attention, mean": lambda: [
                    entrokv.mixed_statistic(stats[layer], entrokv.key_statistic(
                        args.query_heads, args.tokens, "expected_attention", args.dtype,
                        query_mean=mean)) for layer in range(args.layers)],
                "bytes mixed with expected attention, mean and covariance": lambda: [
                    entrokv.mixed_statistic(stats[layer], entrokv.key_statistic(
                        args.query_heads, args.tokens, "expected_attention", args.dtype,
                        query_mean=mean, query_covariance=covariance))
                    for layer in range(args.layers)],
                # The cover rule: the same two, ordered by page instead of averaged.
                "bytes covered, then filled by expected attention, mean": lambda: [
                    entrokv.mixed_statistic(stats[layer], entrokv.key_statistic(
                        args.query_heads, args.tokens, "expected_attention", args.dtype,
                        query_mean=mean), rule="cover") for layer in range(args.layers)],
                "bytes covered, then filled by expected attention, mean and covariance":
                    lambda: [entrokv.mixed_statistic(stats[layer], entrokv.key_statistic(
                        args.query_heads, args.tokens, "expected_attention", args.dtype,
                        query_mean=mean, query_covariance=covariance), rule="cover")
                        for layer in range(args.layers)],
                # The question's rows pooled forward (cover_question_forward): with the
                # covariance and the sink pages ranked (cover_rank_sinks), the question-in
                # default (entrokv.default_statistic).
                "bytes covered pooled forward, then filled by expected attention, mean":
                    lambda: [entrokv.mixed_statistic(stats[layer], entrokv.key_statistic(
                        args.query_heads, args.tokens, "expected_attention", args.dtype,
                        query_mean=mean), rule="cover", cover_question_forward=True)
                        for layer in range(args.layers)],
                "the question-in default (the above, the sink pages ranked, with the covariance)":
                    lambda: [entrokv.default_statistic(args.query_heads, args.tokens, mean,
                                                       covariance, question_rows=stats[layer],
                                                       dtype=args.dtype)
                             for layer in range(args.layers)],
            }
            keep = max(1, int(args.keep * pages))
            for round_index in range(args.rounds):
                for name, make in settings.items():
                    # A fork shares every page and copies nothing: each decision sees the same
                    # frames, and evicting from it leaves the parent whole.
                    client.open_sequence("bench", "f", parent="s", prefix_pages=pages)
                    statistic = make()
                    start = time.perf_counter()
                    client.decide("bench", "f", statistic, pages=keep, policy="mean",
                                  scope="group")
                    ms = (time.perf_counter() - start) * 1e3
                    client.close_sequence("bench", "f")
                    row = dict(round=round_index, setting=name, ms=ms, layers=args.layers,
                               query_heads=args.query_heads, kv_heads=args.kv_heads,
                               head_dim=args.head_dim, tokens=args.tokens, dtype=args.dtype)
                    rows.append(row)
                    print(f"round {round_index}: {name}: {ms:.1f} ms", flush=True)
    finally:
        daemon.stop()
    os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
    with open(args.jsonl, "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    base = {r["round"]: r["ms"] for r in rows if r["setting"] == "bytes (float32 statistic)"}
    lines = [f"One Decide of {args.layers} layers x {args.query_heads} query heads / "
             f"{args.kv_heads} KV heads x head_dim {args.head_dim}, T = {args.tokens}, keys in "
             f"{args.dtype}, policy mean, {keep} of {pages} pages kept per (layer, group), "
             f"through entrokvd on loopback, wall time of the call; median over {args.rounds} "
             "rounds, each setting on a fresh fork in every round.", "",
             "| statistic | median ms | ms per layer | x bytes (median of per-round ratios) |",
             "|---|---|---|---|"]
    for name in settings:
        mine = [r for r in rows if r["setting"] == name]
        median = statistics.median(r["ms"] for r in mine)
        ratio = statistics.median(r["ms"] / base[r["round"]] for r in mine)
        lines.append(f"| {name} | {median:.1f} | {median / args.layers:.1f} | {ratio:.2f} |")
    with open(args.table, "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
