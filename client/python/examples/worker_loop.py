#!/usr/bin/python3
"""One request's whole lifecycle against entrokvd, step by step as docs/integrating.md walks it:
register the model, open the sequence, a chunked prefill that decides after every chunk (the
daemon keeps the running sums), decode with decisions on cached head weights and a deadline,
speculative drafts rolled back with a truncation, close. Fail-open: a decision the daemon cannot
give in time leaves the cache as it is, and the request goes on.

The attention statistics are stand-ins (random, of the right shapes and kinds); an engine
computes them from its attention kernel and writes the K/V of the frames each call names.

Run with the built package on the path:
  PYTHONPATH=build/client/python /usr/bin/python3 client/python/examples/worker_loop.py \
      --server 127.0.0.1:50051
"""

import argparse

import numpy as np

import entrokv

LAYERS, QUERY_HEADS, KV_GROUPS, HEAD_DIM, PAGE = 4, 8, 2, 64, 16
MODEL, SEQUENCE = "example", "request-1"


def chunk_column_sums(rng: np.random.Generator, start: int, end: int) -> np.ndarray:
    """Stand-in for one chunk's ACCUMULATED statistic, every layer: the attention of the
    chunk's queries (tokens start..end-1) summed over those queries, for every key so far:
    [layers, query_heads, end]. A key inside the chunk is seen only by the queries after it."""
    sums = rng.random((LAYERS, QUERY_HEADS, end), dtype=np.float32) * (end - start) / end
    inside = np.arange(start, end)
    sums[:, :, start:] *= (end - inside) / (end - start)
    return sums


def last_row(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """Stand-in for the newest query's attention row, every layer: [layers, query_heads,
    tokens], each row summing to 1."""
    logits = rng.normal(size=(LAYERS, QUERY_HEADS, tokens)).astype(np.float32) * 2
    rows = np.exp(logits - logits.max(axis=2, keepdims=True))
    return rows / rows.sum(axis=2, keepdims=True)


def report(step: str, decisions) -> None:
    if decisions is None:  # fail-open: no decision in time; the cache stays as it is
        print(f"{step}: no decision, the cache stays as it is")
        return
    kept = sorted({len(group.kept_pages) for d in decisions for group in d.groups})
    freed = sum(len(d.freed_frames) for d in decisions)
    degraded = sum(d.degraded for d in decisions)
    print(f"{step}: {len(decisions)} layers kept {kept} pages per group of "
          f"{decisions[0].page_count}, freed {freed} frames"
          f"{f', {degraded} layers degraded' if degraded else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--tokens", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk, tokens")
    parser.add_argument("--keep", type=int, default=16, help="pages each (layer, group) keeps")
    parser.add_argument("--decode", type=int, default=24, help="decode steps")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    # Fail-open decisions (try_decide) wait at most decision_timeout_s; the calls the worker
    # cannot do without (its frames) wait for a restarting daemon (wait_for_ready).
    with entrokv.Client(args.server, decision_timeout_s=0.5, wait_for_ready=True) as client:
        # 1. Register the model's pool once (an earlier run may have).
        try:
            client.register_model(MODEL, layers=LAYERS, query_heads=QUERY_HEADS,
                                  kv_groups=KV_GROUPS, head_dim=HEAD_DIM, page_size=PAGE,
                                  capacity_bytes=64 << 20)
        except entrokv.AlreadyExistsError:
            pass
        # 2. Open the request's sequence (parent=... would share a cached prefix instead).
        client.open_sequence(MODEL, SEQUENCE)

        # 3. Chunked prefill: each chunk's tokens get frames (AppendTokens), the engine runs
        # the chunk, and the chunk's column sums are decided on; the daemon adds them to the
        # running sums it keeps, so evicting early keeps the pool small during a long prompt.
        for start in range(0, args.tokens, args.chunk):
            end = min(start + args.chunk, args.tokens)
            client.append_tokens_frames(MODEL, SEQUENCE, end - start)  # K/V go to these frames
            decisions = client.try_decide(MODEL, SEQUENCE, chunk_column_sums(rng, start, end),
                                          pages=args.keep, policy="page_entrokv",
                                          kind="accumulated", accumulate=True)
            report(f"prefill chunk {start}-{end}", decisions)

        # 4. Decode: one token at a time; every 8th step a decision on the newest row, the
        # heads pooled with the weights the prefill's decision cached, within 50 ms (a layer
        # that cannot be scored in time is decided by position, flagged degraded).
        # 5. Speculative decoding: every 6th step 4 drafts are appended and verified, and the
        # rejected ones are rolled back (TruncateSequence).
        length = args.tokens
        for step in range(1, args.decode + 1):
            if step % 6 == 0:
                drafts, accepted = 4, int(rng.integers(0, 5))
                client.append_tokens_frames(MODEL, SEQUENCE, drafts)
                if accepted < drafts:
                    length, freed = client.truncate_sequence(MODEL, SEQUENCE, drafts - accepted)
                    print(f"decode step {step}: {accepted} of {drafts} drafts accepted, "
                          f"truncated to {length} tokens, {freed} frames freed")
                else:
                    length += drafts
            length = client.append_tokens(MODEL, SEQUENCE, 1)
            if step % 8 == 0:
                decisions = client.try_decide(MODEL, SEQUENCE, last_row(rng, length),
                                              pages=args.keep, policy="page_entrokv",
                                              use_cached_weights=True,
                                              degrade_on_deadline=True, answer_within_ms=50)
                report(f"decode step {step}", decisions)

        stats = client.pool_stats(MODEL)
        print(f"pool: {stats.used_frames} used + {stats.free_frames} free = "
              f"{stats.capacity_frames} frames")
        # 6. Close: every frame the sequence held goes back to the pool.
        print(f"closed: {client.close_sequence(MODEL, SEQUENCE)} frames released; "
              f"decisions gone without: {sum(client.no_decisions.values())}")


if __name__ == "__main__":
    main()
