#!/usr/bin/env python3
"""A markdown table of two entrokv_loadgen --json_out reports: per RPC, p50 and p99 of each.

Usage: compare_runs.py BEFORE.json AFTER.json
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        before = json.load(f)
    with open(sys.argv[2]) as f:
        after = json.load(f)
    print("| figure | before | after |")
    print("|---|---|---|")
    for name, key in (("requests", "requests"), ("wrong answers", "wrong_answers"),
                      ("crashes", "crashes"), ("unavailable", "unavailable"),
                      ("leaked frames", "leaked_frames")):
        print(f"| {name} | {before[key]:,} | {after[key]:,} |")
    print(f"| requests per second | {before['requests'] / before['seconds']:,.0f} | "
          f"{after['requests'] / after['seconds']:,.0f} |")
    print(f"| daemon RSS at most, MiB | {before['rss_kb']['max'] / 1024:.1f} | "
          f"{after['rss_kb']['max'] / 1024:.1f} |")
    print()
    print("| rpc | calls before | after | p50 ms before | after | p99 ms before | after |")
    print("|---|---|---|---|---|---|---|")
    for rpc in sorted(set(before["latency"]) | set(after["latency"])):
        b = before["latency"].get(rpc, {})
        a = after["latency"].get(rpc, {})
        print(f"| {rpc} | {b.get('calls', 0):,} | {a.get('calls', 0):,} | "
              f"{b.get('p50_ms', float('nan')):.3f} | {a.get('p50_ms', float('nan')):.3f} | "
              f"{b.get('p99_ms', float('nan')):.3f} | {a.get('p99_ms', float('nan')):.3f} |")


if __name__ == "__main__":
    main()
