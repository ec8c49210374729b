#!/usr/bin/python3
"""An example inference-worker loop against entrokvd: register, prefill with per-layer
eviction through DecideStream, decode with appends, close.

Run with the built package on the path:
  PYTHONPATH=build/client/python /usr/bin/python3 client/python/examples/worker_loop.py \
      --server 127.0.0.1:50051
"""

import argparse

import numpy as np

import entrokv

LAYERS, QUERY_HEADS, KV_GROUPS, HEAD_DIM, PAGE = 4, 8, 2, 64, 16


def attention_rows(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """Stand-in for the last query row of prefill attention: [query_heads, tokens]."""
    logits = rng.normal(size=(QUERY_HEADS, tokens)).astype(np.float32) * 2
    rows = np.exp(logits - logits.max(axis=1, keepdims=True))
    return rows / rows.sum(axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    with entrokv.Client(args.server) as client:
        try:
            client.register_model("example", layers=LAYERS, query_heads=QUERY_HEADS,
                                  kv_groups=KV_GROUPS, head_dim=HEAD_DIM, page_size=PAGE,
                                  capacity_bytes=64 << 20)
        except entrokv.AlreadyExistsError:
            pass  # registered by an earlier run
        client.open_sequence("example", "request-1", initial_tokens=args.tokens)
        # Prefill: one statistic per layer as the layers run; keep 25% of each sequence.
        layer_stats = ((layer, attention_rows(rng, args.tokens)) for layer in range(LAYERS))
        for decision in client.decide_stream("example", "request-1", layer_stats, fraction=0.25):
            kept = [len(group.kept_pages) for group in decision.groups]
            print(f"layer {decision.layer}: kept {kept} pages per group, freed "
                  f"{len(decision.freed_frames)} frames, weights "
                  f"{np.round(decision.groups[0].weights, 3)}")
        # Decode: the sequence grows; new tokens get frames.
        for _ in range(32):
            client.append_tokens("example", "request-1", 1)
        stats = client.pool_stats("example")
        print(f"pool: {stats.used_frames} used + {stats.free_frames} free = "
              f"{stats.capacity_frames} frames")
        client.close_sequence("example", "request-1")


if __name__ == "__main__":
    main()
