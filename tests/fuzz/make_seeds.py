#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into corpus/<target>/ (replayed by ctest).

Run from anywhere with the repository's protoc on PATH: python3 tests/fuzz/make_seeds.py.
Each seed is small and named after what it holds; the formats are those documented at the
top of each <target>_fuzzer.cc. regress-<what> files reproduce a bug that was fixed (each has a
unit test naming it too); reproducers that libFuzzer writes are kept under that name as they are.
"""
import os
import pathlib
import struct
import subprocess

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
CORPUS = HERE / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


# ---- statistic: dtype selector (0 f32, 1 f16, 2 bf16), query_heads - 1, values -----------------
def statistic_seeds():
    f32 = np.linspace(0.0, 1.0, 4 * 8, dtype="<f4")
    write("statistic", "f32-4x8-valid", bytes([0, 3]) + f32.tobytes())
    f16 = np.array([0.0, 6e-8, 6.1e-5, 1.0, 65504.0, 0.5, 2.0, 3.0], dtype="<f2")
    write("statistic", "f16-2x4-subnormal-max", bytes([1, 1]) + f16.tobytes())
    bf16 = (np.array([1.0, 2.0, np.nan, 4.0], dtype="<f4").view("<u4") >> 16).astype("<u2")
    write("statistic", "bf16-1x4-nan", bytes([2, 0]) + bf16.tobytes())
    write("statistic", "f32-negative", bytes([0, 0]) + np.array([1.0, -0.5], "<f4").tobytes())
    write("statistic", "f16-inf", bytes([1, 0]) + np.array([1.0, np.inf], "<f2").tobytes())
    write("statistic", "f32-ragged-tail", bytes([0, 1]) + f32.tobytes()[:27])
    write("statistic", "short", bytes([2]))


# ---- npy: a whole .npy file ---------------------------------------------------------------------
def npy_file(descr, shape, data, version=1, fortran="False"):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    prefix = 10 if version == 1 else 12
    header += " " * ((64 - (prefix + len(header) + 1) % 64) % 64) + "\n"
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header.encode() + data


def npy_seeds():
    write("npy", "f4-2x3-valid", npy_file("<f4", (2, 3), np.arange(6, dtype="<f4").tobytes()))
    write("npy", "f2-2x2x2-valid", npy_file("<f2", (2, 2, 2), np.ones(8, "<f2").tobytes()))
    write("npy", "u2-1d-valid", npy_file("<u2", (4,), np.arange(4, dtype="<u2").tobytes()))
    write("npy", "v2-header", npy_file("<f4", (1,), b"\0\0\x80\x3f", version=2))
    write("npy", "fortran", npy_file("<f4", (1, 1), b"\0\0\0\0", fortran="True"))
    write("npy", "big-endian", npy_file(">f4", (1,), b"\0\0\0\0"))
    write("npy", "short-data", npy_file("<f4", (2, 2), b"\0" * 12))
    write("npy", "zero-dim", npy_file("<f4", (0, 5), b""))
    write("npy", "bad-magic", b"\x93NUMPZ\x01\x00\x00\x00")
    write("npy", "truncated-header", npy_file("<f4", (1,), b"\0\0\0\0")[:40])
    # 4 * 2**62 elements wrapped to 0: an empty file passed as a huge array (core/io/npy_test.cc).
    write("npy", "regress-shape-overflow", npy_file("<f4", (4, 2**62), b""))


# ---- shm: selector, offset u64, length u64, [name] ----------------------------------------------
REGULAR, EMPTY, FIFO, FOLDER, LINK, ARENA_TRAILER, ARENA_INODE, MISSING, RAW = range(9)


def shm(selector, offset, length, name=b""):
    return bytes([selector]) + struct.pack("<QQ", offset, length) + name


def shm_seeds():
    write("shm", "regular-whole", shm(REGULAR, 0, 4096))
    write("shm", "regular-tail", shm(REGULAR, 4000, 96))
    write("shm", "regular-end-empty", shm(REGULAR, 4096, 0))
    write("shm", "regular-past-end", shm(REGULAR, 4000, 97))
    write("shm", "regular-offset-wraps", shm(REGULAR, 2**64 - 1, 2))
    write("shm", "empty", shm(EMPTY, 0, 0))
    write("shm", "fifo", shm(FIFO, 0, 0))
    write("shm", "folder", shm(FOLDER, 0, 0))
    write("shm", "symlink", shm(LINK, 0, 16))
    write("shm", "arena-trailer", shm(ARENA_TRAILER, 0, 16))
    write("shm", "arena-inode", shm(ARENA_INODE, 0, 16))
    write("shm", "missing", shm(MISSING, 0, 16))
    write("shm", "raw-no-prefix", shm(RAW, 0, 4, b"/dev/zero"))
    write("shm", "raw-dotdot", shm(RAW, 0, 4, b"/entrokv/../../etc/passwd"))
    write("shm", "raw-long", shm(RAW, 0, 4, b"/entrokv" + b"x" * 300))


# ---- recovery: records, each u16-length key then u16-length value -------------------------------
def lp(s):
    return struct.pack(">I", len(s)) + s


def record(key, value):
    return struct.pack("<H", len(key)) + key + struct.pack("<H", len(value)) + value


def model_value(model_id, geometry, layout=0, backend=0, capacity=2048 * 128, arena=b"$arena"):
    out = b"\x01" + lp(model_id)
    for field in geometry:
        out += struct.pack("<Q", field)
    return out + bytes([layout, backend]) + struct.pack("<Q", capacity) + lp(arena)


GEOMETRY = (2, 4, 2, 8, 4, 2)  # layers, query_heads, kv_groups, head_dim, page_size, bytes


def recovery_journal(length=10, frames=None, **model):
    """A model "m" with one sequence "s" of `length` tokens, as the daemon journals it."""
    layers, query_heads, kv_groups, _, page_size, _ = model.get("geometry", GEOMETRY)
    out = record(b"F", b"entrokv-state-1") + record(b"I", b"0123-abcd")
    out += record(b"M" + lp(b"m"), model_value(b"m", model.pop("geometry", GEOMETRY), **model))
    out += record(b"S" + lp(b"m") + lp(b"s"), struct.pack("<q", length))
    pages = (length + page_size - 1) // page_size
    next_frame = 0
    for layer in range(layers):
        for chunk in range((pages + 63) // 64):
            in_chunk = min(64, pages - chunk * 64)
            ids = []
            for _ in range(kv_groups * in_chunk):
                ids.append(next_frame if frames is None else frames)
                next_frame += 1
            key = b"T" + lp(b"m") + lp(b"s") + struct.pack(">II", layer, chunk)
            out += record(key, struct.pack("<%dI" % len(ids), *ids))
    weights = struct.pack("<4d", 0.25, 0.25, 0.25, 0.25)
    out += record(b"W" + lp(b"m") + lp(b"s") + struct.pack(">I", 0), weights)
    return out


def recovery_seeds():
    write("recovery", "one-sequence", recovery_journal())
    write("recovery", "one-sequence-cuda-lost", recovery_journal(backend=1))
    write("recovery", "one-sequence-layer-layout", recovery_journal(layout=1))
    write("recovery", "lost-record",
          recovery_journal() + record(b"L" + lp(b"m") + lp(b"gone"), b"its arena died"))
    write("recovery", "frame-outside-pool", recovery_journal(frames=99999))
    write("recovery", "frame-shared-by-layers", recovery_journal(frames=7))
    write("recovery", "empty-sequence", recovery_journal(length=0))
    write("recovery", "sequence-without-model",
          record(b"S" + lp(b"x") + lp(b"s"), struct.pack("<q", 3)))
    write("recovery", "bad-key-kind", record(b"Z", b""))
    write("recovery", "truncated-model", record(b"M" + lp(b"m"), b"\x01\x00\x00"))
    # Regressions (store/store_test.cc, service/model_registry_test.cc): a length whose page
    # count overflowed; a geometry no RegisterModel makes, whose tables were allocated before any
    # check; two capacities whose sum overflowed past the --pool_capacity_bytes check.
    model = record(b"M" + lp(b"m"), model_value(b"m", GEOMETRY))
    write("recovery", "regress-length-overflow",
          model + record(b"S" + lp(b"m") + lp(b"s"), struct.pack("<q", 2**63 - 1)))
    write("recovery", "regress-huge-geometry",
          record(b"M" + lp(b"m"), model_value(b"m", (2**31 - 1, 4, 2, 8, 4, 2)))
          + record(b"S" + lp(b"m") + lp(b"s"), struct.pack("<q", 0)))
    write("recovery", "regress-capacity-overflow",
          record(b"M" + lp(b"a"), model_value(b"a", GEOMETRY, backend=1, capacity=2**62 + 2))
          + record(b"M" + lp(b"b"), model_value(b"b", GEOMETRY, backend=1, capacity=2**62 + 2)))


# ---- request: selector, u16-length serialized request -------------------------------------------
RPCS = ["RegisterModelRequest", "GetModelRequest", "ListModelsRequest", "OpenSequenceRequest",
        "AppendTokensRequest", "DecideRequest", "DecideLayerRequest", "CloseSequenceRequest",
        "GetPoolStatsRequest", "ListSequencesRequest", "UnregisterModelRequest",
        "TruncateSequenceRequest", "SwapOutSequenceRequest", "ResumeSequenceRequest"]


def encode(message, text):
    return subprocess.run(
        ["protoc", "-I", str(REPO / "proto"), "--encode=entrokv.v1." + message,
         "entrokv/v1/cache_manager.proto"],
        input=text.encode(), capture_output=True, check=True).stdout


def request(message, text):
    data = encode(message, text)
    return bytes([RPCS.index(message)]) + struct.pack("<H", len(data)) + data


# The target's model "m": 4 query heads, sequence "s" of 10 tokens (3 pages of 4 tokens).
STAT_F32 = "".join("\\%03o" % b for b in np.full(40, 0.25, "<f4").tobytes())


def decide_text(layer_stat, budget="pages_per_group: 2", policy=""):
    return ('model_id: "m" sequence_id: "s" layers { layer: 0 %s } budget { %s } policy { %s }'
            % (layer_stat, budget, policy))


def acc_stat(tokens):
    """A chunk of a chunked prefill: ACCUMULATED column sums over `tokens` keys, accumulated."""
    data = "".join("\\%03o" % b for b in np.full(4 * tokens, 0.5, "<f4").tobytes())
    return ('statistic { dtype: DTYPE_FLOAT32 query_heads: 4 tokens: %d '
            'kind: STATISTIC_KIND_ACCUMULATED data: "%s" } accumulate: true' % (tokens, data))


def request_seeds():
    bytes_stat = 'statistic { dtype: DTYPE_FLOAT32 query_heads: 4 tokens: 10 data: "%s" }' % STAT_F32
    shm_stat = ('statistic { dtype: DTYPE_FLOAT32 query_heads: 4 tokens: 10 shared_memory '
                '{ segment: "$stat" offset_bytes: 64 length_bytes: 160 } }')
    seeds = {
        "register-second-model": [("RegisterModelRequest",
                                   'model_id: "m2" geometry { layers: 1 query_heads: 2 kv_groups: 1 '
                                   'head_dim: 4 page_size: 8 element_bytes: 2 } capacity_bytes: 65536')],
        "register-bad-geometry": [("RegisterModelRequest",
                                   'model_id: "m3" geometry { layers: 1 query_heads: 3 kv_groups: 2 '
                                   'head_dim: 4 page_size: 8 element_bytes: 2 }')],
        "register-tiny-frames": [("RegisterModelRequest",
                                  'model_id: "m4" geometry { layers: 4096 query_heads: 4096 '
                                  'kv_groups: 4096 head_dim: 1 page_size: 1 element_bytes: 1 } '
                                  'capacity_bytes: 1048576')],
        "get-list-stats": [("GetModelRequest", 'model_id: "m"'), ("ListModelsRequest", ""),
                           ("GetPoolStatsRequest", 'model_id: "m"'),
                           ("ListSequencesRequest", 'model_id: "m" include_block_tables: true')],
        "open-append-close": [("OpenSequenceRequest",
                               'model_id: "m" sequence_id: "t" initial_tokens: 20'),
                              ("AppendTokensRequest", 'model_id: "m" sequence_id: "t" tokens: 5'),
                              ("CloseSequenceRequest", 'model_id: "m" sequence_id: "t"')],
        "fork": [("OpenSequenceRequest", 'model_id: "m" sequence_id: "f" initial_tokens: 3 '
                  'parent_sequence_id: "s" prefix_pages: 2')],
        "fork-huge-prefix": [("OpenSequenceRequest", 'model_id: "m" sequence_id: "f" '
                              'parent_sequence_id: "s" prefix_pages: 9223372036854775807')],
        "open-too-many-tokens": [("OpenSequenceRequest",
                                  'model_id: "m" sequence_id: "t" initial_tokens: 9223372036854775807')],
        "append-bad-id": [("AppendTokensRequest", 'model_id: "m" sequence_id: "s s" tokens: 1')],
        "decide-bytes": [("DecideRequest", decide_text(bytes_stat))],
        "decide-shm": [("DecideRequest", decide_text(shm_stat))],
        "decide-fraction-pyramid": [("DecideRequest",
                                     decide_text(bytes_stat, 'fraction: 0.5 allocator: "pyramid"'))],
        "decide-fraction-mass": [("DecideRequest", decide_text(
            bytes_stat, 'fraction: 0.5 allocator: "mass" layer_floor: 0.25'))],
        "decide-token-slots-max": [("DecideRequest",
                                    decide_text(bytes_stat, "token_slots: 9223372036854775807"))],
        "decide-sink-max": [("DecideRequest", decide_text(
            bytes_stat, policy="sink_tokens: 2147483647 protect_sink_pages: true "
                               "protect_recent_pages: 2147483647"))],
        "decide-wrong-tokens": [("DecideRequest", decide_text(
            bytes_stat.replace("tokens: 10", "tokens: 11")))],
        "decide-streaming-no-stat": [("DecideRequest",
                                      decide_text("", policy='name: "streaming"'))],
        "decide-then-cached": [("DecideRequest", decide_text(bytes_stat)),
                               ("DecideRequest", decide_text("", "pages_per_group: 1")
                                .replace('budget', 'use_cached_weights: true budget'))],
        "decide-layer": [("DecideLayerRequest",
                          'model_id: "m" sequence_id: "s" layer { layer: 1 %s } '
                          'budget { pages_per_group: 1 } policy { name: "snapkv" }' % bytes_stat)],
        "truncate": [("AppendTokensRequest", 'model_id: "m" sequence_id: "s" tokens: 6'),
                     ("TruncateSequenceRequest", 'model_id: "m" sequence_id: "s" tokens: 7'),
                     ("ListSequencesRequest", 'model_id: "m" include_block_tables: true')],
        "truncate-past-length": [("TruncateSequenceRequest",
                                  'model_id: "m" sequence_id: "s" tokens: 11')],
        "truncate-zero": [("TruncateSequenceRequest", 'model_id: "m" sequence_id: "s"')],
        "truncate-fork-tail": [("OpenSequenceRequest", 'model_id: "m" sequence_id: "f" '
                                'parent_sequence_id: "s" prefix_pages: 3'),
                               ("TruncateSequenceRequest",
                                'model_id: "m" sequence_id: "f" tokens: 1'),
                               ("AppendTokensRequest", 'model_id: "m" sequence_id: "f" tokens: 3')],
        "decide-chunks": [("DecideRequest", decide_text(acc_stat(10))),
                          ("AppendTokensRequest", 'model_id: "m" sequence_id: "s" tokens: 4'),
                          ("DecideRequest", decide_text(acc_stat(14))),
                          ("TruncateSequenceRequest", 'model_id: "m" sequence_id: "s" tokens: 5'),
                          ("DecideRequest", decide_text(acc_stat(9)))],
        "decide-chunk-wrong-kind": [("DecideRequest", decide_text(
            acc_stat(10).replace(" kind: STATISTIC_KIND_ACCUMULATED", "")))],
        "decide-chunk-wrong-tokens": [("DecideRequest", decide_text(acc_stat(11)))],
        "decide-degraded": [("DecideRequest", decide_text(bytes_stat).replace(
            'budget', 'degrade_on_deadline: true answer_within_ms: 1 budget'))],
        "decide-answer-within-negative": [("DecideRequest", decide_text(bytes_stat).replace(
            'budget', 'answer_within_ms: -1 budget'))],
        "swap-resume": [("SwapOutSequenceRequest", 'model_id: "m" sequence_id: "s"'),
                        ("TruncateSequenceRequest", 'model_id: "m" sequence_id: "s" tokens: 1'),
                        ("SwapOutSequenceRequest", 'model_id: "m" sequence_id: "s"'),
                        ("ResumeSequenceRequest", 'model_id: "m" sequence_id: "s"'),
                        ("ResumeSequenceRequest", 'model_id: "m" sequence_id: "s"'),
                        ("TruncateSequenceRequest", 'model_id: "m" sequence_id: "s" tokens: 2')],
        "decide-auto-lifecycle": [
            ("DecideRequest", decide_text(acc_stat(10), "auto_budget { floor_fraction: 0.5 }")),
            ("DecideRequest", decide_text(bytes_stat, "auto_budget { floor_fraction: 0.5 }")
             .replace('budget', 'degrade_on_deadline: true budget', 1)),
            ("DecideRequest", decide_text(bytes_stat, "auto_budget { floor_fraction: 0.5 }")),
            ("TruncateSequenceRequest", 'model_id: "m" sequence_id: "s" tokens: 5'),
            ("AppendTokensRequest", 'model_id: "m" sequence_id: "s" tokens: 5')],
        "unregister-refused": [("UnregisterModelRequest", 'model_id: "m"')],
        "unregister-forced": [("UnregisterModelRequest", 'model_id: "m" force: true'),
                              ("GetModelRequest", 'model_id: "m"')],
    }
    for name, requests in seeds.items():
        write("request", name, b"".join(request(message, text) for message, text in requests))
    write("request", "unparsable", bytes([5, 3, 0, 0xff, 0xff, 0xff]))


if __name__ == "__main__":
    statistic_seeds()
    npy_seeds()
    shm_seeds()
    recovery_seeds()
    request_seeds()
    for target in sorted(os.listdir(CORPUS)):
        print(target, len(os.listdir(CORPUS / target)), "seeds")
