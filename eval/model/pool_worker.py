#!/usr/bin/python3
"""A worker whose KV cache is entrokvd's page pool: the small GQA model served through the daemon.

The worker registers the model, opens a sequence per prompt and writes every layer's K and V of
every token into the frames of the daemon's host arena that the sequence's block tables name (the
arena mapped by its shared-memory name, numpy views of its frames). During prefill it measures
each layer's attention statistic (docs/architecture.md §3.1) and sends it with DecideStream; from then on
each (layer, group) attends only to the pages its block table still names, read from the pool.
Evicted frames are back on the daemon's free list and other sequences reuse them: the tests
poison them to prove the worker never reads them. Decoding is greedy, one AppendTokens per token.

The forward pass is numpy_model's; this module only supplies its KV cache (`PoolKV`, the
`write`/`read` interface) and the conversation with the daemon.

A frame of the GROUP layout is [K: B x head_dim][V: B x head_dim] of one KV head of one layer; a
LAYER-layout frame is kv_groups such slices back to back (core/pool/geometry.h). Elements are
float32 by default (element_bytes 4), so that with no eviction the pool-backed model computes
exactly what the plain model computes; float16 halves the pool.

Run the main job's demonstration with the client package on the path (the CLI names the
statistic each policy scores, `entrokv policies`):
  PYTHONPATH=build/client/python /usr/bin/python3 eval/model/pool_worker.py \\
      --server 127.0.0.1:50051 --entrokv build/client/cli/entrokv \\
      --weights eval/model/weights.npz --prompts 8 --policies page_entrokv,mean --ratio 0.75
"""
from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import dataclasses
import itertools
import mmap
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import tasks  # noqa: E402

import entrokv  # noqa: E402  (client/python; PYTHONPATH=<build>/client/python)

ELEMENTS = {"f32": np.float32, "f16": np.float16}
KINDS = ("last_row", "window_mean", "accumulated")
# Statistics the daemon computes itself from the keys in the pool's frames (no question, no
# attention rows sent; core/scoring/key_scores.h): kind -> the key score.
# keys_expected: expected attention, from the statistics of this worker's prompt queries
# (numpy_model.query_moments) sent with the request; keys_expected_mean with their mean alone;
# keys_expected_window from those of the observation window's queries alone (the last rows, as
# snapkv's window statistic).
KEY_KINDS = {"keys_keydiff": "keydiff", "keys_norm": "norm",
             "keys_expected": "expected_attention", "keys_expected_window": "expected_attention",
             "keys_expected_mean": "expected_attention"}
# keys_expected_r<p>: expected attention with a low-rank covariance, the factor of its p largest
# directions (query_covariance_factor: p x head_dim per token and head, not head_dim^2).
LOW_RANKS = (4, 8, 16)
KEY_KINDS.update({f"keys_expected_r{p}": "expected_attention" for p in LOW_RANKS})
# keys_expected_w<a>l2w<b>, an experiment of this worker's: expected attention computed here (as
# the daemon scores it: expected_attention), each head's row max-pooled over b tokens on layer 2
# and over a tokens on the other layers, sent as rows to a policy with no neighbourhood of its
# own; w3l2w3 is the question-excluded default's scoring done by the worker.
LAYER_WIDTHS = {"keys_expected_w3l2w3": (3, 3), "keys_expected_w3l2w5": (3, 5),
                "keys_expected_w5l2w3": (5, 3)}
KEY_KINDS.update({kind: "expected_attention" for kind in LAYER_WIDTHS})
# window_expected_k<w>: window_expected with w% of the mix on the keys' row (50 otherwise).
MIXED_KEY_WEIGHTS = (25, 75)
# window_expected_cover<c>: the question's pages first, until they hold c% of its mass, then the
# keys' (the daemon's cover rule, KEYS_MIX_RULE_COVER, with its default kernels: 7 and 3).
# window_expected_cover<c>q<k>: the same with the question's rows max-pooled over k tokens (k in
# COVER_QUESTION_KERNELS, half the mass), so that a page beside the question's tokens ranks with
# them. window_expected_coverfwd<w>: half the mass, the question's rows max-pooled forward
# (cover_question_forward), each token over itself and the w - 1 tokens before it, so that the
# tokens after one the question attends to (what follows a key) rank with it, and none before.
COVER_MASSES = (25, 50, 65, 80)
COVER_QUESTION_KERNELS = (15, 31)
COVER_FORWARD_WIDTHS = (7, 11)
# window_expected_cover<c>fwd7: the question's rows pooled forward over 7 tokens, c% of the mass.
COVER_FORWARD_MASSES = (65, 80)
# window_expected_coverfwdsink<c>: pooled forward over 7, c% of the mass, the sink pages ranked
# among the question's pages (cover_rank_sinks: their sink tokens' mass left out of the share).
COVER_FORWARD_SINK_MASSES = (5, 10, 15, 25, 35, 50)
# window_expected_coversink<c>: the same pooled centred, c% of the mass (an experiment of this
# worker's before the daemon had cover_rank_sinks).
COVER_SINK_MASSES = (25, 35, 40, 50)
# Each cover kind's (cover_mass in %, cover_question_kernel, cover_question_forward,
# cover_rank_sinks).
COVER = ({f"window_expected_cover{c}": (c, 7, False, False) for c in COVER_MASSES}
         | {f"window_expected_cover50q{k}": (50, k, False, False) for k in COVER_QUESTION_KERNELS}
         | {f"window_expected_coverfwd{w}": (50, w, True, False) for w in COVER_FORWARD_WIDTHS}
         | {f"window_expected_cover{c}fwd7": (c, 7, True, False) for c in COVER_FORWARD_MASSES}
         | {f"window_expected_coverfwdsink{c}": (c, 7, True, True)
            for c in COVER_FORWARD_SINK_MASSES}
         | {f"window_expected_coversink{c}": (c, 7, False, True) for c in COVER_SINK_MASSES})
# window_expected_covermix<w>, an experiment of this worker's: the cover rule with the first
# pages ranked by the average mix (the question's rows and expected attention, half and half,
# max-pooled over w tokens) instead of the question's rows alone; still until they hold half the
# question's mass, then expected attention's order.
COVER_MIX_WIDTHS = (3, 7)
# window_expected_coverfill<w>, an experiment of this worker's: the cover rule pooled forward
# over 7 tokens (window_expected_coverfwd7), with the rest of the quota filled in the average
# mix's order (max-pooled over w tokens) instead of expected attention's alone, so that the pages
# of needles the question attends to, past its first half of mass, still rank first.
COVER_FILL_WIDTHS = (3, 7)
# window_expected_coverhead<fwd|mid>7, an experiment of this worker's: the cover rule with each
# head's question row max-pooled over 7 tokens (forward, or centred) before the group's mean is
# taken, as snapkv pools, instead of the mean pooled; half the mass, then expected attention's
# order over 3 tokens.
COVER_HEAD_POOLS = {"window_expected_coverheadfwd7": True, "window_expected_coverheadmid7": False}
# window_expected_coverfwdsink50<only|skip>2[g0], an experiment of this worker's: the default
# rule (window_expected_coverfwdsink50) with the question's rows sent only on layer 2 (only2),
# on every layer but layer 2 (skip2), or only to layer 2's first KV group (only2g0). Elsewhere
# the rows are zeros, the cover holds no question mass, and the rule keeps expected attention
# alone's order: which layers' question pages variable tracking pays for, and which the
# retrieval tasks need (docs/evaluation/development-question-layers-question-in/).
# Each kind's test of a (layer, KV group): whether it is sent the question's rows.
COVER_LAYER_SETS = {
    "window_expected_coverfwdsink50only2": lambda layer, group: layer == 2,
    "window_expected_coverfwdsink50skip2": lambda layer, group: layer != 2,
    "window_expected_coverfwdsink50only2g0": lambda layer, group: layer == 2 and group == 0}
MOMENT_KINDS = (("keys_expected", "keys_expected_window", "keys_expected_mean", "window_expected",
                 "window_expected_max", "window_expected_pages")
                + tuple(f"window_expected_covermix{w}" for w in COVER_MIX_WIDTHS)
                + tuple(f"window_expected_coverfill{w}" for w in COVER_FILL_WIDTHS)
                + tuple(COVER_HEAD_POOLS)
                + tuple(COVER_LAYER_SETS)
                + tuple(COVER)
                + tuple(f"keys_expected_r{p}" for p in LOW_RANKS)
                + tuple(LAYER_WIDTHS)
                + tuple(f"window_expected_k{w}" for w in MIXED_KEY_WEIGHTS))
# Expected attention's query statistics: the prompt's queries past the first EXPECTED_SINKS,
# rotated as the next EXPECTED_FUTURE positions would be (not tuned: the question and the
# answer of the tasks are shorter; kvpress averages over 512).
EXPECTED_SINKS = 4
EXPECTED_FUTURE = 128
# The window statistic with the daemon's scores of the keys in its frames (a keys mix: each
# head's two rows scaled to sum 1 and averaged half and half): keydiff's (window_keydiff), or
# each head's expected attention from the prompt queries' mean and covariance (window_expected,
# as keys_expected). The rows are sent as a window_mean statistic; the score each mixes in:
MIXED_KINDS = {"window_keydiff": "keydiff", "window_expected": "expected_attention",
               "window_expected_max": "expected_attention",
               "window_expected_pages": "expected_attention",
               **{f"window_expected_covermix{w}": "expected_attention" for w in COVER_MIX_WIDTHS},
               **{f"window_expected_coverfill{w}": "expected_attention"
                  for w in COVER_FILL_WIDTHS},
               **{kind: "expected_attention" for kind in COVER_HEAD_POOLS},
               **{kind: "expected_attention" for kind in COVER_LAYER_SETS},
               **{kind: "expected_attention" for kind in COVER},
               **{f"window_expected_k{w}": "expected_attention" for w in MIXED_KEY_WEIGHTS}}
# The keys' share of each mixed kind's mix (keys_mix.keys_weight).
MIXED_WEIGHTS = {kind: 0.5 for kind in MIXED_KINDS} | {
    f"window_expected_k{w}": w / 100 for w in MIXED_KEY_WEIGHTS}
# How each mixed kind's two rows combine (keys_mix.rule): averaged, or each token's larger
# score for window_expected_max (what either the question or the keys favour is kept); the cover
# rule, an order of pages, for window_expected_cover<c>.
MIXED_RULES = ({kind: "average" for kind in MIXED_KINDS} | {"window_expected_max": "max"}
               | {kind: "cover" for kind in COVER})
# window_expected_pages, an experiment of this worker's (the daemon has no such mix): a union of
# two page choices, not of token scores. Each group ranks its pages twice, by the question's rows
# max-pooled over PAGE_UNION_WIDTHS[0] tokens and by the keys' expected attention (computed here,
# as the daemon computes it) over PAGE_UNION_WIDTHS[1], each as the heads' mean and a page's
# maximum; a page's score is 1 / (1 + its better rank), sent as rows to a policy with no
# neighbourhood, so a quota of K pages keeps about K/2 from the top of each ranking.
PAGE_UNION_WIDTHS = (7, 3)
# The mixed kinds this worker computes itself, sent as rows (the daemon has no such mix).
WORKER_MIXES = (("window_expected_pages",)
                + tuple(f"window_expected_covermix{w}" for w in COVER_MIX_WIDTHS)
                + tuple(f"window_expected_coverfill{w}" for w in COVER_FILL_WIDTHS)
                + tuple(COVER_HEAD_POOLS))
# The default policy (entrokv.default_policy with entrokv.default_statistic) as this worker spells
# it, by setting: with the question's rows (the cover rule, pooled forward, the sink pages
# ranked), or before the question is known.
DEFAULT_SPELLINGS = {"question_in": "mean+winexpcoverfwdsink50+pyramid",
                     "question_excluded": "mean+expattn+nb3max+pyramid"}
# The kinds whose statistic is the default's, built by entrokv.default_statistic.
DEFAULT_KINDS = ("window_expected_coverfwdsink50", "keys_expected")
# Where POSIX shm_open names live on Linux (glibc): the daemon's host arena is /dev/shm/<name>.
_SHM_DIR = "/dev/shm"


# ---- what to decide ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Policy:
    """One eviction setting. name "none" keeps everything (no decision is sent)."""
    name: str
    ratio: Optional[float] = None  # compression ratio: the share of the KV evicted, in [0, 1)
    pages: Optional[int] = None  # or K, the pages every (layer, group) keeps
    statistic: Optional[str] = None  # last_row, window_mean, accumulated, or a KEY_KINDS one;
    # None: the one the registry names for the policy (PoolWorker.kind)
    params: Tuple[Tuple[str, object], ...] = ()  # daemon policy parameters (tau, alpha, ...)
    allocator: Optional[str] = None  # how a ratio's budget is spread over the layers (pyramid)
    layer_floor: Optional[float] = None  # allocator "mass": each layer's least share of the mean
    spelling: str = ""  # the name with its suffixes as written (policy_of), for labels

    def __post_init__(self):
        if self.name != "none" and (self.ratio is None) == (self.pages is None):
            raise ValueError(f"policy {self.name}: give exactly one of ratio, pages")
        if self.ratio is not None and not 0.0 <= self.ratio < 1.0:
            raise ValueError(f"ratio must be in [0, 1), got {self.ratio}")
        known = KINDS + tuple(KEY_KINDS) + tuple(MIXED_KINDS)
        if self.statistic is not None and self.statistic not in known:
            raise ValueError(f"statistic must be one of {', '.join(known)}")
        if self.allocator is not None and self.ratio is None:
            raise ValueError(f"policy {self.name}: an allocator spreads a ratio's budget; "
                             f"pages are every layer's already")

    def budget(self) -> Dict[str, object]:
        if self.pages is not None:
            return {"pages": self.pages}
        budget: Dict[str, object] = {"fraction": 1.0 - self.ratio}
        if self.allocator is not None:
            budget["allocator"] = self.allocator
        if self.layer_floor is not None:
            budget["layer_floor"] = self.layer_floor
        return budget

    def label(self) -> str:
        if self.name == "none":
            return "none"
        name = self.spelling or self.name
        return f"{name}@{self.ratio}" if self.pages is None else f"{name}@K={self.pages}"


def policy_of(name: str, ratio: float) -> Policy:
    """"none", or a policy name with optional suffixes:
    +window (the question-window statistic, the mean of the question's query rows,
    docs/architecture.md §3.1, instead of its default); +last or +acc (the accumulated column
    sums); +keydiff, +knorm, +expattn, +expattnm or +expattnw (no statistic sent: the daemon
    scores the keys in its frames, docs/decisions.md; +expattn with the prompt queries' mean and
    covariance, +expattnm with their mean alone, +expattnw with the observation window's,
    +expattnr<p> with the covariance's p largest directions alone, p in LOW_RANKS;
    +expattnw<a>l2w<b>, an experiment of the worker's, expected attention pooled by the worker
    over b tokens on layer 2 and a on the others: LAYER_WIDTHS);
    +winkeys or +winexp (the window statistic sent with a keys mix: the daemon averages it half
    and half with keydiff's scores, or with each head's expected attention as +expattn's;
    +winexp25 and +winexp75 put 25% or 75% of the mix on the keys' row; +winexpmax keeps each
    token's larger score of the two instead of their average; +winexppages, an experiment of
    the worker's, keeps the union of the two statistics' page rankings: PAGE_UNION_WIDTHS;
    +winexpcover<c>, c in COVER_MASSES, the question's pages until they hold c% of its mass,
    then expected attention's (+winexpcover50q<k>: the question's rows over k tokens, k in
    COVER_QUESTION_KERNELS; +winexpcoverfwd<w>: pooled forward over w, COVER_FORWARD_WIDTHS;
    +winexpcover<c>fwd7: c% of the mass, pooled forward over 7, COVER_FORWARD_MASSES);
    +winexpcovermix<w>, an experiment of the worker's, the same with the first pages ranked by
    the average mix over w tokens: COVER_MIX_WIDTHS;
    +winexpcoverfwdsink<c>: pooled forward over 7 with the sink pages ranked among the
    question's, COVER_FORWARD_SINK_MASSES; +winexpcoversink<c>, the same pooled centred:
    COVER_SINK_MASSES; +winexpcoverfill<w>, an experiment of the worker's,
    cover pooled forward with the rest filled by the average mix over w: COVER_FILL_WIDTHS;
    +winexpcoverheadfwd7 and +winexpcoverheadmid7, experiments of the worker's, cover with each
    head's row pooled before the group mean: COVER_HEAD_POOLS);
    +nb<k><max|mean>
    (neighbourhood pooling of width k); +gf<percent> (group quotas that move, each group keeping
    at least that share of its quota: policy.group_floor); +pyramid (the budget spread over the
    layers by the pyramid allocator: linearly more pages in lower layers, budget.allocator);
    +mass or +mass<percent> (the layers' pages move to the layers whose scores need them, each
    keeping at least that share of the mean, 50 by default: allocator "mass", budget.layer_floor);
    +sinks (the pages holding the sink tokens kept whatever their scores, inside the quota:
    policy.protect_sink_pages); +recent<k> (the newest k pages kept, the tail page among them,
    inside the quota: policy.protect_recent_pages).
    E.g. page_entrokv+window+nb7max, mean+keydiff+gf25, snapkv+pyramid, mean+expattn+mass25."""
    if name == "none":
        return Policy("none")
    base, *suffixes = name.split("+")
    kinds = {"window": "window_mean", "last": "last_row", "acc": "accumulated",
             "keydiff": "keys_keydiff", "knorm": "keys_norm", "expattn": "keys_expected",
             "expattnw": "keys_expected_window", "expattnm": "keys_expected_mean",
             "winkeys": "window_keydiff", "winexp": "window_expected",
             "winexpmax": "window_expected_max", "winexppages": "window_expected_pages",
             **{f"winexp{w}": f"window_expected_k{w}" for w in MIXED_KEY_WEIGHTS},
             **{kind.replace("window_expected_", "winexp"): kind for kind in COVER},
             **{f"winexpcovermix{w}": f"window_expected_covermix{w}" for w in COVER_MIX_WIDTHS},
             **{f"winexpcoverfill{w}": f"window_expected_coverfill{w}"
                for w in COVER_FILL_WIDTHS},
             **{kind.replace("window_expected_", "winexp"): kind for kind in COVER_HEAD_POOLS},
             **{kind.replace("window_expected_", "winexp"): kind for kind in COVER_LAYER_SETS},
             **{f"expattnr{p}": f"keys_expected_r{p}" for p in LOW_RANKS},
             **{kind.replace("keys_expected_", "expattn"): kind for kind in LAYER_WIDTHS}}
    statistic, params, allocator, layer_floor = None, {}, None, None
    for suffix in suffixes:
        neighbourhood = re.fullmatch(r"nb(\d+)(max|mean)", suffix)
        floor = re.fullmatch(r"gf(\d+)", suffix)
        mass = re.fullmatch(r"mass(\d*)", suffix)
        recent = re.fullmatch(r"recent(\d+)", suffix)
        if suffix in kinds and statistic is None:
            statistic = kinds[suffix]
        elif neighbourhood and "neighbourhood_kernel" not in params:
            params["neighbourhood_kernel"] = int(neighbourhood.group(1))
            params["neighbourhood_pooling"] = neighbourhood.group(2)
        elif floor and "group_floor" not in params and int(floor.group(1)) <= 100:
            params["group_floor"] = int(floor.group(1)) / 100
        elif suffix == "pyramid" and allocator is None:
            allocator = "pyramid"
        elif suffix == "sinks" and "protect_sink_pages" not in params:
            params["protect_sink_pages"] = True
        elif recent and "protect_recent_pages" not in params:
            params["protect_recent_pages"] = int(recent.group(1))
        elif mass and allocator is None and (not mass.group(1) or int(mass.group(1)) <= 100):
            allocator = "mass"
            layer_floor = int(mass.group(1)) / 100 if mass.group(1) else None
        else:
            raise ValueError(f"policy {name}: each suffix must be +window, +last, +acc, "
                             f"+keydiff, +knorm, +expattn(m|w), +winkeys, +winexp(max), "
                             f"+nb<k><max|mean>, +gf<0-100>, +pyramid, +mass[<0-100>], "
                             f"+sinks or +recent<k>, "
                             f"at most one of each kind")
    return Policy(base, ratio=ratio, statistic=statistic,
                  params=tuple(params.items()), allocator=allocator, layer_floor=layer_floor,
                  spelling=name)


def neighbourhood_max(row: np.ndarray, width: int) -> np.ndarray:
    """Each token's maximum over the `width` tokens centred on it, clipped at the ends (the
    daemon's neighbourhood pooling, max)."""
    half = width // 2
    padded = np.pad(row, half, constant_values=-np.inf)
    return np.lib.stride_tricks.sliding_window_view(padded, width).max(axis=1)


def forward_max(row: np.ndarray, width: int) -> np.ndarray:
    """Each token's maximum over itself and the `width` - 1 tokens before it (the cover rule's
    question pool forward, cover_question_forward)."""
    padded = np.pad(row, (width - 1, 0), constant_values=-np.inf)
    return np.lib.stride_tricks.sliding_window_view(padded, width).max(axis=1)


def page_ranking(row: np.ndarray, width: int, page_size: int,
                 pool=neighbourhood_max) -> np.ndarray:
    """The pages of `row` ranked best first: the row max-pooled over `width` tokens
    (neighbourhood_max, or `pool`), each page its maximum over its tokens (the last page's real
    ones), ties to the lower page (the daemon's RankPages in core/scoring/cover_mix.cc)."""
    tokens = len(row)
    pages = -(-tokens // page_size)
    pooled = np.full(pages * page_size, -np.inf)
    pooled[:tokens] = pool(row, width)
    return np.argsort(-pooled.reshape(pages, page_size).max(axis=1), kind="stable")


def page_sums(row: np.ndarray, page_size: int) -> np.ndarray:
    """Each page's sum of `row` (the last page's real tokens)."""
    pages = -(-len(row) // page_size)
    padded = np.zeros(pages * page_size)
    padded[:len(row)] = row
    return padded.reshape(pages, page_size).sum(axis=1)


def group_mean(block: np.ndarray) -> np.ndarray:
    """A group's rows [heads, tokens] averaged as the daemon's MeanRows does: the sum in double,
    scaled once, rounded to float32."""
    return (block.astype(np.float64).sum(axis=0) * (1.0 / len(block))).astype(np.float32)


def cover_span_mass(question: np.ndarray, page_size: int, rank_sinks: bool,
                    sink_tokens: int = 4) -> Tuple[np.ndarray, int, int]:
    """The cover rule's span for a group's question row (float32, its heads' mean) under the
    daemon's defaults (4 sink tokens, the tail page protected): (each page's mass in the span,
    summed in double past the sink tokens, zero outside it; first; end). The span runs from past
    the sink page (page 0 with `rank_sinks`) to before the tail page (core CoverSpanOf)."""
    tokens = len(question)
    pages = -(-tokens // page_size)
    sinks = min(sink_tokens, tokens)
    first, end = 0 if rank_sinks else -(-sinks // page_size), pages - 1
    held = np.zeros(pages)
    for p in range(first, end):
        held[p] = sum(float(x) for x in question[max(p * page_size, sinks):(p + 1) * page_size])
    return held, first, end


def cover_pages(first_ranking: np.ndarray, mass: np.ndarray, share: float, first: int,
                end: int) -> List[int]:
    """The cover rule's first pages, in order: those of `first_ranking` in [first, end) until
    they hold `share` of `mass` (per page, zero outside the span); none when it holds none."""
    order, taken, total = [], 0.0, mass.sum()
    for p in first_ranking if total > 0 else []:
        if first <= p < end:
            order.append(int(p))
            taken += mass[p]
            if taken >= share * total:
                break
    return order


def question_cover(question: np.ndarray, page_size: int, share: float, kernel: int,
                   forward: bool, rank_sinks: bool) -> List[int]:
    """The daemon's cover rule's first pages for a group's question row (float32, its heads'
    mean: group_mean), in order: the row max-pooled over `kernel` (forward or centred), ranked by
    page maxima (page_ranking), taken in the span until they hold `share` of its mass there
    (cover_span_mass, cover_pages)."""
    mass, first, end = cover_span_mass(question, page_size, rank_sinks)
    pool = forward_max if forward else neighbourhood_max
    return cover_pages(page_ranking(question, kernel, page_size, pool), mass, share, first, end)


def cover_scores(first_pages: List[int], fill_ranking: np.ndarray) -> np.ndarray:
    """The cover rule's page scores: `first_pages` (cover_pages), then the rest in
    `fill_ranking`; a page scores the page count less its place."""
    order = list(first_pages)
    order += [p for p in fill_ranking if p not in order]
    pages = len(fill_ranking)
    score = np.empty(pages)
    score[order] = pages - np.arange(pages)
    return score


def question_rows_sent(kind: str, layer: int, rows: np.ndarray, per_group: int) -> np.ndarray:
    """The question's rows [query_heads, tokens] a COVER_LAYER_SETS kind sends on `layer`: each
    KV group's (`per_group` consecutive heads) as they are where the kind sends them, zeros
    elsewhere."""
    sent = np.array(rows, copy=True)
    for group in range(len(sent) // per_group):
        if not COVER_LAYER_SETS[kind](layer, group):
            sent[group * per_group:(group + 1) * per_group] = 0
    return sent


def question_window(prompt: np.ndarray) -> int:
    """W of the window statistic: the query rows of the question, from its Q token to the end."""
    marks = np.flatnonzero(np.asarray(prompt) == tasks.Q)
    return int(len(prompt) - marks[-1]) if len(marks) else 1


def statistic_kind(registry: policy_registry.Registry, policy: Policy) -> str:
    """The statistic `policy` is given (PoolWorker.kind says which)."""
    if policy.statistic is not None:
        return policy.statistic
    wanted = "none" if policy.name == "none" else registry.statistic(policy.name)
    return "last_row" if wanted == "none" else wanted


def block_tables(client: entrokv.Client, model_id: str, sequence_id: str, layers: int,
                 groups: int) -> np.ndarray:
    """A sequence's block tables as the pool holds them now: [layers, groups, pages] frame ids,
    -1 where a page has none (evicted)."""
    for info in client.list_sequences(model_id, block_tables=True):
        if info.sequence_id == sequence_id:
            pages = max((len(t.frames) for t in info.block_tables), default=0)
            tables = np.full((layers, groups, pages), -1, np.int32)
            for t in info.block_tables:
                tables[t.layer, t.group, :len(t.frames)] = t.frames
            return tables
    raise entrokv.NotFoundError(f"sequence {sequence_id} is not open")


# ---- the arena --------------------------------------------------------------------------------
class HostArena:
    """A pool's host arena mapped into this process by its shared-memory name.

    `frames` is a numpy view [capacity_frames, groups_per_frame, 2 (K, V), page_size, head_dim]:
    writes land in the daemon's memory, reads see what any worker wrote there.
    """

    def __init__(self, pool: entrokv.PoolInfo, element: str, rank: Optional[int] = None):
        """rank: of a tensor-parallel pool, the arena of that rank, which holds KV groups
        [rank G/t, (rank+1) G/t): its slice of every frame (LAYER layout) or its own frames
        (GROUP layout); None: the pool's one arena."""
        if pool.backend != "host":
            raise ValueError(f"backend: this worker maps host arenas, got {pool.backend}")
        g = pool.geometry
        dtype = np.dtype(ELEMENTS[element])
        if dtype.itemsize != g.element_bytes:
            raise ValueError(f"element {element}: the pool stores {g.element_bytes}-byte elements")
        self.groups_per_frame = g.kv_groups if pool.frame_layout == "layer" else 1
        arena_name, frame_bytes, size = pool.arena_name, pool.frame_bytes, pool.capacity_bytes
        frames, self.first_frame = pool.capacity_frames, 0  # frame f is frames[f - first_frame]
        if rank is not None:
            if not 0 <= rank < len(pool.ranks):
                raise ValueError(f"rank {rank}: the pool has {len(pool.ranks)} rank arenas")
            arena = pool.ranks[rank]
            if pool.frame_layout == "layer":
                self.groups_per_frame = g.kv_groups // len(pool.ranks)
            arena_name, frame_bytes = arena.arena_name, arena.frame_bytes
            frames, self.first_frame = arena.frames, arena.first_frame
            size = frames * frame_bytes
        shape = (frames, self.groups_per_frame, 2, g.page_size, g.head_dim)
        if int(np.prod(shape[1:])) * dtype.itemsize != frame_bytes:
            raise ValueError(f"frame_bytes {frame_bytes} does not match {shape[1:]} {dtype}")
        fd = os.open(os.path.join(_SHM_DIR, arena_name.lstrip("/")), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.frames = np.ndarray(shape, dtype, buffer=self._map)

    def slot(self, group: int) -> int:
        """Index of a group's slice inside a frame."""
        return group if self.groups_per_frame > 1 else 0

    # -- the KV storage interface PoolKV uses (CudaArena in pool_worker_cuda.py has the same) --
    def store(self, frames: np.ndarray, slot: int, slots: np.ndarray, k, v) -> None:
        """K and V rows [n, head_dim] into slots `slots` of frames `frames` (both [n])."""
        self.frames[frames - self.first_frame, slot, 0, slots] = k
        self.frames[frames - self.first_frame, slot, 1, slots] = v

    def load(self, frames: np.ndarray, slot: int, keep: Optional[np.ndarray]):
        """K and V of every slot of `frames`, [len(frames) * page_size, head_dim] float32 each,
        the rows where `keep` (None: all) is true."""
        block = self.frames[frames - self.first_frame, slot]  # [pages, 2, B, D], a copy
        d = block.shape[-1]
        k, v = block[:, 0].reshape(-1, d), block[:, 1].reshape(-1, d)
        if keep is not None:
            k, v = k[keep], v[keep]
        return k.astype(np.float32, copy=False), v.astype(np.float32, copy=False)

    def close(self) -> None:
        self.frames = None
        self._map.close()


# ---- one sequence's KV cache in the pool --------------------------------------------------------
class PoolKV:
    """numpy_model's KV-cache interface over one open sequence's block tables.

    write() stores K/V into the frames the tables name; read() returns, per group, the tokens of
    the pages the tables still name (ascending), read from the arena. A position is read only if
    this sequence wrote it and its page is live: an evicted tail page that an append brought back
    gets a fresh frame whose older slots are undefined, so they stay unreadable.
    """

    def __init__(self, worker: "PoolWorker", sequence_id: str, length: int,
                 valid: Optional[np.ndarray] = None):
        c = worker.model.config
        self.worker = worker
        self.sequence_id = sequence_id
        self.length = length
        self.tables = np.full((c.layers, c.kv_heads, 0), -1, np.int32)
        self.valid = np.zeros((c.layers, c.kv_heads, 0), bool)
        self._reserve(length)
        if valid is not None:
            self.valid[:, :, :valid.shape[2]] = valid[:, :, :self.valid.shape[2]]
        self.frames_seen: set = set()  # every frame id this sequence's tables ever named
        self.stats: Dict[str, np.ndarray] = {}  # kind -> [layers, query_heads, prompt tokens]
        # kind -> layer -> the queries' (mean, covariance) for expected attention
        self.moments: Dict[str, Dict[int, Tuple[np.ndarray, np.ndarray]]] = {}
        self.prefill_logits: Optional[np.ndarray] = None  # [prompt tokens, vocab]

    def _reserve(self, tokens: int) -> None:
        b = self.worker.page_size
        pages = -(-tokens // b)
        if pages > self.tables.shape[2]:
            grow = max(pages, 2 * self.tables.shape[2]) - self.tables.shape[2]
            self.tables = np.pad(self.tables, ((0, 0), (0, 0), (0, grow)), constant_values=-1)
            self.valid = np.pad(self.valid, ((0, 0), (0, 0), (0, grow * b)))

    def set_tables(self, tables: np.ndarray) -> None:
        """The pool's block tables [layers, groups, pages]; positions of evicted pages become
        unreadable for good."""
        self._reserve(tables.shape[2] * self.worker.page_size)
        self.tables[:] = -1
        self.tables[:, :, :tables.shape[2]] = tables
        b = self.worker.page_size
        evicted = np.repeat(self.tables < 0, b, axis=2)
        self.valid &= ~evicted
        self.frames_seen.update(int(f) for f in np.unique(tables[tables >= 0]))

    def assign(self, rows: np.ndarray) -> None:
        """New entries (layer, group, page, frame) from AppendTokens."""
        if len(rows):
            self._reserve((int(rows[:, 2].max()) + 1) * self.worker.page_size)
            self.tables[rows[:, 0], rows[:, 1], rows[:, 2]] = rows[:, 3]
            self.frames_seen.update(int(f) for f in np.unique(rows[:, 3]))

    def live_frames(self) -> int:
        """Distinct frames the tables name (a LAYER-layout frame once, however many groups)."""
        return len(np.unique(self.tables[self.tables >= 0]))

    # -- numpy_model's interface --
    def write(self, layer: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        arena, b = self.worker.arena, self.worker.page_size
        positions = np.asarray(positions)
        if len(positions) and positions[-1] >= self.length:
            raise RuntimeError(f"sequence {self.sequence_id}: position {positions[-1]} is past "
                               f"its length {self.length}; append first")
        pages, slots = positions // b, positions % b
        for group in range(k.shape[0]):
            frames = self.tables[layer, group, pages]
            if np.any(frames < 0):
                raise RuntimeError(f"sequence {self.sequence_id}: layer {layer} group {group} "
                                   "writes a page that has no frame (evicted)")
            arena.store(frames, arena.slot(group), slots, k[group], v[group])
        self.valid[layer, :, positions] = True

    def read(self, layer: int):
        arena, b = self.worker.arena, self.worker.page_size
        pages_total = -(-self.length // b)
        keys, values, cached = [], [], []
        for group in range(self.tables.shape[1]):
            table = self.tables[layer, group, :pages_total]
            pages = np.flatnonzero(table >= 0)
            positions = (pages[:, None] * b + np.arange(b)[None, :]).reshape(-1)
            readable = positions < self.length
            readable[readable] = self.valid[layer, group, positions[readable]]
            keep = None if readable.all() else readable
            k, v = arena.load(table[pages], arena.slot(group), keep)
            keys.append(k)
            values.append(v)
            cached.append(positions if keep is None else positions[keep])
        return keys, values, cached


@dataclasses.dataclass
class RunResult:
    """One prompt under one policy."""
    policy: str  # Policy.label()
    answer: List[int]  # generated tokens before EOS
    correct: bool
    logits: np.ndarray  # [1 + decode steps, vocab]: the prefill's last row, then every step
    kept_frames: int  # frames the sequence's block tables name right after its decisions
    prompt_frames: int  # frames the prompt took before any decision
    freed_frames: int  # frames the decisions returned to the free list
    quota_pages: List[int]  # K per layer
    prefill_ms: float  # 0 for a fork (its parent's prefill is shared)
    decide_ms: float
    decode_ms: float
    decode_tokens: int
    cycle_ms: float = 0.0  # open or fork, decisions, decode and close: the whole sequence
    decisions: list = dataclasses.field(default_factory=list)  # the LayerDecision records


# ---- the worker -------------------------------------------------------------------------------
class PoolWorker:
    """The model served through entrokvd. Thread-safe: sequences may run on several threads
    (each sequence on one thread at a time).

    The pool's backend and where K/V and statistics live are the few methods a subclass
    changes (pool_worker_cuda.CudaPoolWorker: the daemon's CUDA arena, statistics sent as
    device buffers): BACKEND, _open_arena, _statistic_rows, _outgoing and _kept."""

    BACKEND = "host"

    def __init__(self, client: entrokv.Client, model: numpy_model.Model,
                 registry: policy_registry.Registry, *, model_id: Optional[str] = None,
                 page_size: int = 16, frame_layout: str = "group", element: str = "f32",
                 capacity_frames: int = 16384, fail_open: bool = False):
        """fail_open: decisions go through the client's fail-open calls (try_decide_stream): a
        decision the daemon cannot give in time leaves the sequence's cache as it is (counted
        in no_decisions), and the answer comes all the same. Pair it with a client made with
        wait_for_ready=True, so that the calls the worker cannot do without (open, append,
        the block tables, close) wait for a restarting daemon instead of failing."""
        c = model.config
        self.client, self.model, self.page_size = client, model, page_size
        self.element = element
        self.registry = registry
        self.fail_open = fail_open
        self.no_decisions = 0  # decisions gone without (fail_open)
        self.model_id = model_id or f"entrokv-gqa-{frame_layout}-b{page_size}-{element}"
        geometry = dict(layers=c.layers, query_heads=c.query_heads, kv_groups=c.kv_heads,
                        head_dim=c.head_dim, page_size=page_size,
                        element_bytes=np.dtype(ELEMENTS[element]).itemsize)
        groups_per_frame = c.kv_heads if frame_layout == "layer" else 1
        frame_bytes = groups_per_frame * 2 * page_size * c.head_dim * geometry["element_bytes"]
        try:
            pool = client.register_model(self.model_id,
                                         capacity_bytes=capacity_frames * frame_bytes,
                                         frame_layout=frame_layout, backend=self.BACKEND,
                                         **geometry)
        except entrokv.AlreadyExistsError:  # an earlier run's pool: usable if it is the same shape
            pool = client.get_model(self.model_id)
            if (dataclasses.asdict(pool.geometry) != geometry or
                    pool.frame_layout != frame_layout):
                raise ValueError(f"model {self.model_id} is registered with another geometry "
                                 f"or layout: {pool}") from None
        self.pool = pool
        self.arena = self._open_arena(pool, element)
        self._ids = itertools.count()
        self._prefix = f"p{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self._lock = threading.Lock()

    # -- what a backend changes --
    def _open_arena(self, pool: entrokv.PoolInfo, element: str):
        """The pool's arena with HostArena's store/load/slot/close."""
        return HostArena(pool, element)

    def _statistic_rows(self, groups: list):
        """One layer's per-group statistics [r, n] as [query_heads, n] (groups in order)."""
        return np.concatenate(groups, axis=0)

    def _outgoing(self, kv: "PoolKV", layer: int, statistic):
        """What DecideStream carries for a layer's statistic: here the array itself."""
        return statistic

    def _mixed(self, kv: "PoolKV", kind: str, layer: int, rows: np.ndarray,
               tokens: int) -> "entrokv.types.Statistic":
        """MIXED_KINDS: the window rows [query_heads, tokens] with the daemon's scores of the
        keys in the frames, mixed by the daemon (entrokv.mixed_statistic): half and half, or
        w% on the keys' row for window_expected_k<w>; averaged, or each token's larger score
        for window_expected_max."""
        if kind == "window_expected_pages":
            return self._page_union(kv, layer, rows, tokens)
        if kind.startswith("window_expected_covermix"):
            return self._cover_by_mix(kv, kind, layer, rows, tokens)
        if kind.startswith("window_expected_coverfill"):
            return self._cover_then_mix(kv, kind, layer, rows, tokens)
        if kind in COVER_HEAD_POOLS:
            return self._cover_pooled_per_head(kv, kind, layer, rows, tokens)
        if kind in COVER_LAYER_SETS:  # the default's statistic on the rows the kind sends
            c = self.model.config
            rows = question_rows_sent(kind, layer, rows, c.query_heads // c.kv_heads)
        if kind in DEFAULT_KINDS or kind in COVER_LAYER_SETS:
            mean, covariance = kv.moments[kind][layer]
            return entrokv.default_statistic(self.model.config.query_heads, tokens, mean,
                                             covariance, question_rows=rows, dtype=self.element)
        keys = self._key_statistic(kv, kind, layer, tokens)
        if MIXED_RULES[kind] == "cover":
            mass, question_kernel, forward, rank_sinks = COVER[kind]
            return entrokv.mixed_statistic(rows, keys, kind="window_mean", rule="cover",
                                           cover_mass=mass / 100,
                                           cover_question_kernel=question_kernel,
                                           cover_question_forward=forward,
                                           cover_rank_sinks=rank_sinks)
        return entrokv.mixed_statistic(rows, keys, kind="window_mean",
                                       keys_weight=MIXED_WEIGHTS[kind], rule=MIXED_RULES[kind])

    def expected_attention(self, kv: "PoolKV", kind: str, layer: int,
                           tokens: int) -> np.ndarray:
        """[query_heads, tokens]: each head's expected attention over the keys in the frames,
        from the layer's query moments kept for `kind`, as the daemon scores
        KEY_SCORE_EXPECTED_ATTENTION (softmax of mean.k / sqrt(d) + k' cov k / (2 d))."""
        c = self.model.config
        per_group = c.query_heads // c.kv_heads
        mean, covariance = kv.moments[kind][layer]
        pages = -(-tokens // self.page_size)
        out = np.empty((c.query_heads, tokens))
        for g in range(c.kv_heads):
            k, _ = self.arena.load(kv.tables[layer, g, :pages], self.arena.slot(g), None)
            k = k[:tokens].astype(np.float64)
            group = slice(g * per_group, (g + 1) * per_group)
            exponent = (mean[group].astype(np.float64) @ k.T) / np.sqrt(c.head_dim)
            quadratic = np.einsum("hti,ti->ht", k @ covariance[group].astype(np.float64), k)
            exponent += quadratic / (2.0 * c.head_dim)
            out[group] = numpy_model.softmax(exponent, axis=1)
        return out

    def _cover_rows(self, tokens: int, first: int, share: float, mass_row, first_ranking,
                    fill_ranking) -> np.ndarray:
        """The rows [query_heads, tokens] of one of the worker's cover experiments: per group
        (`group`, its heads' slice), the pages first_ranking(group) orders, in [first, tail page),
        until they hold `share` of mass_row(group)'s mass there, then the rest in
        fill_ranking(group)'s order (cover_scores); each of the group's heads gets its pages'
        scores on their tokens."""
        c = self.model.config
        per_group = c.query_heads // c.kv_heads
        end = -(-tokens // self.page_size) - 1
        out = np.empty((c.query_heads, tokens), np.float32)
        for g in range(c.kv_heads):
            group = slice(g * per_group, (g + 1) * per_group)
            mass = page_sums(mass_row(group), self.page_size)
            mass[:first], mass[end:] = 0.0, 0.0
            score = cover_scores(cover_pages(first_ranking(group), mass, share, first, end),
                                 fill_ranking(group))
            out[group] = np.repeat(score, self.page_size)[:tokens]
        return out

    def _average_mix(self, kv: "PoolKV", kind: str, layer: int, sent: np.ndarray,
                     tokens: int) -> tuple:
        """Expected attention [query_heads, tokens] and the average mix with the question's
        rows `sent`: each head's two rows scaled to sum 1, averaged."""
        expected = self.expected_attention(kv, kind, layer, tokens)
        mix = 0.5 * (sent / np.maximum(sent.sum(axis=1, keepdims=True), 1e-30)
                     + expected / expected.sum(axis=1, keepdims=True))
        return expected, mix

    def _cover_by_mix(self, kv: "PoolKV", kind: str, layer: int, rows: np.ndarray,
                      tokens: int) -> np.ndarray:
        """window_expected_covermix<w>'s rows [query_heads, tokens]: per group, the pages the
        average mix ranks highest (each head's two rows scaled to sum 1, averaged; the group
        mean, max-pooled over w tokens, page maxima) past the sink page and before the tail
        until they hold half the question's mass there, then the rest in expected attention's
        order (over 3 tokens); a page scores the page count less its place."""
        width = int(kind[len("window_expected_covermix"):])
        sent = np.asarray(rows, np.float64)
        expected, mix = self._average_mix(kv, kind, layer, sent, tokens)
        return self._cover_rows(
            tokens, 1, 0.5, lambda group: sent[group].mean(axis=0),
            lambda group: page_ranking(mix[group].mean(axis=0), width, self.page_size),
            lambda group: page_ranking(expected[group].mean(axis=0), 3, self.page_size))

    def _cover_then_mix(self, kv: "PoolKV", kind: str, layer: int, rows: np.ndarray,
                        tokens: int) -> np.ndarray:
        """window_expected_coverfill<w>'s rows [query_heads, tokens]: per group, the pages the
        question's rows rank highest (the group mean, max-pooled forward over 7 tokens, page
        maxima) past the sink page and before the tail until they hold half the question's mass
        there, then the rest in the average mix's order (each head's two rows scaled to sum 1,
        averaged; the group mean over w tokens); a page scores the page count less its place."""
        width = int(kind[len("window_expected_coverfill"):])
        sent = np.asarray(rows, np.float64)
        _, mix = self._average_mix(kv, kind, layer, sent, tokens)
        return self._cover_rows(
            tokens, 1, 0.5, lambda group: sent[group].mean(axis=0),
            lambda group: page_ranking(sent[group].mean(axis=0), 7, self.page_size, forward_max),
            lambda group: page_ranking(mix[group].mean(axis=0), width, self.page_size))

    def _cover_pooled_per_head(self, kv: "PoolKV", kind: str, layer: int, rows: np.ndarray,
                               tokens: int) -> np.ndarray:
        """window_expected_coverhead<fwd|mid>7's rows [query_heads, tokens]: per group, the
        pages ranked by the mean of the heads' question rows each max-pooled over 7 tokens
        (forward or centred: COVER_HEAD_POOLS), page maxima, past the sink page and before the
        tail until they hold half the question's mass there (the unpooled group mean), then the
        rest in expected attention's order (over 3 tokens); a page scores the page count less
        its place."""
        pool = forward_max if COVER_HEAD_POOLS[kind] else neighbourhood_max
        expected = self.expected_attention(kv, kind, layer, tokens)
        sent = np.asarray(rows, np.float64)
        return self._cover_rows(
            tokens, 1, 0.5, lambda group: sent[group].mean(axis=0),
            lambda group: page_ranking(np.mean([pool(row, 7) for row in sent[group]], axis=0), 1,
                                       self.page_size),
            lambda group: page_ranking(expected[group].mean(axis=0), 3, self.page_size))

    def _page_union(self, kv: "PoolKV", layer: int, rows: np.ndarray,
                    tokens: int) -> np.ndarray:
        """window_expected_pages' rows [query_heads, tokens]: each page's score 1 / (1 + its
        better rank of the two (PAGE_UNION_WIDTHS)), the same on each of a group's heads."""
        c = self.model.config
        per_group = c.query_heads // c.kv_heads
        expected = self.expected_attention(kv, "window_expected_pages", layer, tokens)
        pages = -(-tokens // self.page_size)
        out = np.empty((c.query_heads, tokens), np.float32)
        for g in range(c.kv_heads):
            group = slice(g * per_group, (g + 1) * per_group)
            best = np.full(pages, pages, np.int64)
            for source, width in zip((rows[group], expected[group]), PAGE_UNION_WIDTHS):
                rank = np.empty(pages, np.int64)
                rank[page_ranking(np.asarray(source, np.float64).mean(axis=0), width,
                                  self.page_size)] = np.arange(pages)
                best = np.minimum(best, rank)
            out[group] = np.repeat(1.0 / (1.0 + best), self.page_size)[:tokens]
        return out

    def _key_statistic(self, kv: "PoolKV", kind: str, layer: int, tokens: int):
        """A keys statistic of every query head over `tokens` tokens: no values, the daemon
        scores the keys in the sequence's frames (expected attention with the layer's query
        statistics kept on `kv`). A LAYER_WIDTHS kind is scored and pooled here instead, and its
        rows [query_heads, tokens] are sent."""
        if kind in LAYER_WIDTHS:
            other, on_layer_2 = LAYER_WIDTHS[kind]
            width = on_layer_2 if layer == 2 else other
            expected = self.expected_attention(kv, kind, layer, tokens)
            return np.stack([neighbourhood_max(row, width) for row in expected]).astype(np.float32)
        mean, covariance = kv.moments[kind][layer] if kind in MOMENT_KINDS else (None, None)
        if kind in DEFAULT_KINDS:
            return entrokv.default_statistic(self.model.config.query_heads, tokens, mean,
                                             covariance, dtype=self.element)
        if kind == "keys_expected_mean":  # the mean alone: d, not d^2, per token and head
            covariance = None
        factor = None
        if kind.startswith("keys_expected_r"):  # the p largest directions: S ~ F'F
            rank = int(kind[len("keys_expected_r"):])
            values, vectors = np.linalg.eigh(covariance.astype(np.float64))
            values, vectors = values[:, ::-1][:, :rank], vectors[:, :, ::-1][:, :, :rank]
            factor = (np.sqrt(np.maximum(values, 0.0))[:, :, None]
                      * vectors.transpose(0, 2, 1)).astype(np.float32)
            covariance = None
        score = KEY_KINDS[kind] if kind in KEY_KINDS else MIXED_KINDS[kind]
        return entrokv.key_statistic(self.model.config.query_heads, tokens, score=score,
                                     dtype=self.element, query_mean=mean,
                                     query_covariance=covariance, query_covariance_factor=factor)

    def _keep_moments(self, kv: "PoolKV", kinds: Sequence[str], tokens: int, window: int):
        """on_queries for the model: each layer's query statistics of each of `kinds` (the
        prompt's queries past the sinks, or the last `window`) into kv.moments."""
        c = self.model.config

        def keep(layer: int, q: np.ndarray) -> None:
            for kind in kinds:
                rows = q[:, -window:] if kind == "keys_expected_window" else q
                sinks = 0 if kind == "keys_expected_window" else EXPECTED_SINKS
                kv.moments.setdefault(kind, {})[layer] = numpy_model.query_moments(
                    rows, tokens, EXPECTED_FUTURE, sinks, c.rope_base)
        return keep

    def _kept(self, statistic) -> np.ndarray:
        """A statistic kept on the sequence for later decisions, as a host array."""
        return statistic

    def close(self, unregister: bool = False) -> None:
        self.arena.close()
        if unregister:
            self.client.unregister_model(self.model_id, force=True)

    def _new_id(self, hint: str) -> str:
        with self._lock:
            return f"{hint}-{self._prefix}-{next(self._ids)}"

    def kind(self, policy: Policy) -> str:
        """The statistic `policy` is given: its own `statistic` when set, else the one the
        registry names for it (h2o ACCUMULATED column sums, snapkv the WINDOW_MEAN over the
        question's query rows, the others LAST_ROW). A policy that scores none (streaming), and
        "none", which decides nothing, get LAST_ROW: the stream carries a statistic anyway."""
        return statistic_kind(self.registry, policy)

    def _fetch_tables(self, kv: PoolKV) -> None:
        """The sequence's block tables as the pool holds them now."""
        c = self.model.config
        kv.set_tables(block_tables(self.client, self.model_id, kv.sequence_id, c.layers,
                                   c.kv_heads))

    # -- the steps --
    def prefill(self, prompt: np.ndarray, *, kinds: Sequence[str] = KINDS,
                policy: Optional[Policy] = None, window: Optional[int] = None,
                on_decided: Optional[Callable[[PoolKV, list], None]] = None,
                sequence_id: Optional[str] = None) -> Tuple[PoolKV, list]:
        """Opens a sequence for `prompt` and runs it through the model, K/V into the pool.

        With a policy (not "none"), each layer's statistic goes out on DecideStream as soon as
        the layer has run (the daemon evicts while the next layers compute), and the returned
        decisions are applied to the tables. Without one, the statistics of `kinds` are kept on
        the sequence (kv.stats) for decisions on its forks. Returns (kv, decisions).
        """
        prompt = np.asarray(prompt)
        n = len(prompt)
        window = window or question_window(prompt)
        deciding = policy is not None and policy.name != "none"
        if deciding:
            kinds = (self.kind(policy),)
        measured = [k for k in kinds if k not in KEY_KINDS] or ["last_row"]
        sid = sequence_id or self._new_id("seq")
        self.client.open_sequence(self.model_id, sid, initial_tokens=n)
        kv = PoolKV(self, sid, n)
        try:
            self._fetch_tables(kv)
            rows = {"last_row": 1, "window_mean": window, "accumulated": n,
                    **{k: window for k in MIXED_KINDS}}
            windows = sorted({rows[k] for k in measured})
            moment_kinds = [k for k in kinds if k in MOMENT_KINDS]
            on_queries = self._keep_moments(kv, moment_kinds, n, window) if moment_kinds else None
            layer_stats: Dict[int, Dict[str, np.ndarray]] = {}

            def statistic(stat: Dict[int, list], kind: str, layer: int):
                if kind in KEY_KINDS:  # the daemon reads the keys this layer just wrote
                    return self._key_statistic(kv, kind, layer, n)
                s = self._statistic_rows(stat[rows[kind]])  # [query_heads, n]
                if kind in MIXED_KINDS and deciding:  # kept for forks as rows
                    return self._mixed(kv, kind, layer, s, n)
                return s * float(n) if kind == "accumulated" else s  # column sums

            if not deciding:
                def keep(layer, stat):
                    layer_stats[layer] = {k: self._kept(statistic(stat, k, layer))
                                          for k in measured}
                kv.prefill_logits = self.model.step(prompt, np.arange(n), kv, windows, keep,
                                                    on_queries=on_queries)
                kv.stats = {k: np.stack([layer_stats[l][k] for l in sorted(layer_stats)])
                            for k in measured}
                return kv, []
            outbox: "queue.Queue" = queue.Queue()
            decisions, failure = [], []

            def send() -> Iterator[Tuple[int, np.ndarray]]:
                while (item := outbox.get()) is not None:
                    yield item

            def receive() -> None:
                try:
                    decisions.extend(self._decide_stream(kv, policy, send()))
                except Exception as error:  # noqa: BLE001 -- re-raised below, in this thread
                    failure.append(error)

            receiver = threading.Thread(target=receive, name=f"decide-{sid}")
            receiver.start()
            try:
                kv.prefill_logits = self.model.step(
                    prompt, np.arange(n), kv, windows,
                    lambda layer, stat: outbox.put(
                        (layer, self._outgoing(kv, layer,
                                               statistic(stat, self.kind(policy), layer)))),
                    on_queries=on_queries)
            finally:
                outbox.put(None)
                receiver.join()
            if failure:
                raise failure[0]
            self._fetch_tables(kv)
            if on_decided is not None:
                on_decided(kv, decisions)
            return kv, decisions
        except BaseException:
            self._close_quietly(kv)
            raise

    def fork(self, parent: PoolKV, sequence_id: Optional[str] = None) -> PoolKV:
        """A child sharing every page of `parent` (the partial tail too: copy-on-write on its
        first append), its statistics and its prefill logits. Allocates nothing."""
        sid = sequence_id or self._new_id("fork")
        pages = -(-parent.length // self.page_size)
        self.client.open_sequence(self.model_id, sid, initial_tokens=0,
                                  parent=parent.sequence_id, prefix_pages=pages)
        kv = PoolKV(self, sid, parent.length, valid=parent.valid)
        kv.stats, kv.prefill_logits = parent.stats, parent.prefill_logits
        kv.moments = parent.moments
        try:
            self._fetch_tables(kv)
        except BaseException:
            self._close_quietly(kv)
            raise
        return kv

    def _decide_stream(self, kv: PoolKV, policy: Policy, layer_stats) -> list:
        """The decisions of the stream (of one Decide call for the "mass" allocator, which moves
        pages between layers); with fail_open, [] when there is no decision (the layers decided
        before a broken stream are applied all the same: every caller rereads the block tables
        after this)."""
        kind = self.kind(policy)
        kind = "last_row" if kind in KEY_KINDS else "window_mean" if kind in MIXED_KINDS else kind
        arguments = dict(policy=policy.name, kind=kind,
                         **policy.budget(), **dict(policy.params))
        if policy.allocator == "mass":
            # Pages move between the layers of one Decide call: every layer goes in one.
            items = list(layer_stats)
            call = self.client.try_decide if self.fail_open else self.client.decide
            decisions = call(self.model_id, kv.sequence_id, [stat for _, stat in items],
                             layers=[layer for layer, _ in items], **arguments)
        elif not self.fail_open:
            return list(self.client.decide_stream(self.model_id, kv.sequence_id, layer_stats,
                                                  **arguments))
        else:
            decisions = self.client.try_decide_stream(self.model_id, kv.sequence_id, layer_stats,
                                                      **arguments)
        if decisions is None:
            with self._lock:
                self.no_decisions += 1
            return []
        return decisions

    def decide(self, kv: PoolKV, policy: Policy) -> list:
        """Sends the sequence's kept statistics (of a prefill without a policy, or its fork)
        layer by layer on DecideStream, then reads back the block tables."""
        if policy.name == "none":
            return []
        kind = self.kind(policy)
        if kind in KEY_KINDS:
            stats = [self._key_statistic(kv, kind, layer, kv.length)
                     for layer in range(self.model.config.layers)]
        elif kind not in kv.stats:
            raise ValueError(f"sequence {kv.sequence_id} kept no {kind} statistic")
        elif kind in MIXED_KINDS:
            stats = [self._mixed(kv, kind, layer, kv.stats[kind][layer], kv.length)
                     for layer in range(self.model.config.layers)]
        else:
            stats = kv.stats[kind]
        decisions = self._decide_stream(kv, policy, [(l, stats[l]) for l in range(len(stats))])
        self._fetch_tables(kv)
        return decisions

    def append(self, kv: PoolKV, tokens: int = 1) -> None:
        length, rows = self.client.append_tokens_frames(self.model_id, kv.sequence_id, tokens)
        kv._reserve(length)
        kv.length = length
        kv.assign(rows)

    def truncate(self, kv: PoolKV, tokens: int) -> int:
        """Rolls back the last `tokens` tokens (speculative drafts the target model rejected):
        TruncateSequence, then the tables as the pool holds them. The rolled-back positions are
        unreadable until written again; returns the frames the pool freed."""
        length, freed = self.client.truncate_sequence(self.model_id, kv.sequence_id, tokens)
        kv.length = length
        kv.valid[:, :, length:] = False
        self._fetch_tables(kv)
        return freed

    def decode(self, kv: PoolKV, max_new: int,
               eos: int = tasks.EOS) -> Tuple[List[int], np.ndarray]:
        """Greedy decoding from the prefill's last logits: each token is appended to the
        sequence (AppendTokens), its K/V written into the pool, its step attends through it.
        Returns the tokens before EOS and the logits rows [1 + steps, vocab]."""
        rows = [kv.prefill_logits[-1]]
        out: List[int] = []
        token = int(np.argmax(rows[-1]))
        while token != eos and len(out) < max_new:
            out.append(token)
            position = kv.length
            self.append(kv, 1)
            rows.append(self.model.step(np.array([token]), np.array([position]), kv)[-1])
            token = int(np.argmax(rows[-1]))
        return out, np.stack(rows)

    def close_sequence(self, kv: PoolKV) -> int:
        return self.client.close_sequence(self.model_id, kv.sequence_id)

    def _close_quietly(self, kv: PoolKV) -> None:
        try:
            self.close_sequence(kv)
        except entrokv.EntrokvError:
            pass

    # -- whole runs --
    def _result(self, example: tasks.Example, policy: Policy, kv: PoolKV, decisions: list,
                prompt_frames: int, prefill_ms: float, decide_ms: float,
                max_new: Optional[int]) -> RunResult:
        kept = kv.live_frames()
        start = time.perf_counter()
        answer, logits = self.decode(kv, max_new or tasks.answer_budget(example))
        decode_ms = (time.perf_counter() - start) * 1e3
        return RunResult(policy=policy.label(), answer=answer,
                         correct=tasks.is_correct(example, answer), logits=logits,
                         kept_frames=kept, prompt_frames=prompt_frames,
                         freed_frames=sum(len(d.freed_frames) for d in decisions),
                         quota_pages=[d.quota_pages for d in decisions], prefill_ms=prefill_ms,
                         decide_ms=decide_ms, decode_ms=decode_ms, decode_tokens=len(answer),
                         decisions=decisions)

    def run_prompt(self, example: tasks.Example, policy: Policy, *,
                   max_new: Optional[int] = None,
                   on_decided: Optional[Callable[[PoolKV, list], None]] = None) -> RunResult:
        """One prompt, one sequence: prefill with the policy's decisions streamed per layer,
        greedy decode, close. on_decided(kv, decisions) runs after the decisions (tests poison
        the freed frames there)."""
        start = time.perf_counter()
        prompt_frames = self.model.config.layers * self._frames_per_layer(len(example.prompt))
        kv, decisions = self.prefill(example.prompt, policy=policy, on_decided=on_decided,
                                     kinds=(self.kind(policy),))
        try:
            prefill_ms = (time.perf_counter() - start) * 1e3
            result = self._result(example, policy, kv, decisions, prompt_frames, prefill_ms, 0.0,
                                  max_new)
        finally:
            self.close_sequence(kv)
        result.cycle_ms = (time.perf_counter() - start) * 1e3
        return result

    def run_forked(self, example: tasks.Example, policies: Sequence[Policy], *,
                   max_new: Optional[int] = None,
                   question_excluded: bool = False,
                   on_decided: Optional[Callable[[Policy, PoolKV], None]] = None
                   ) -> List[RunResult]:
        """One prefill, then per policy a fork of it (prefix sharing), its decisions, a greedy
        decode and its close; the parent closes last. Results in the order of `policies`.

        question_excluded: the context is decided before the question is seen (kvpress's
        default setting; prefix caching, a later turn of a chat). The prefill stops before the
        question, its statistics are the context's own (last_row: the last context token's
        row; window_mean: the mean of the context's last W rows, W the question's length), and
        each fork, once decided, runs the question through what it kept before decoding.
        on_decided(policy, fork) runs after each fork's decisions, before the question and the
        decode (a diagnostic reads the pages kept there)."""
        kinds = sorted({self.kind(p) for p in policies if p.name != "none"}) or ["last_row"]
        prompt = np.asarray(example.prompt)
        window = question_window(prompt)
        split = len(prompt) - window if question_excluded else len(prompt)
        start = time.perf_counter()
        parent, _ = self.prefill(prompt[:split], kinds=kinds, window=window)
        prefill_ms = (time.perf_counter() - start) * 1e3
        try:
            prompt_frames = parent.live_frames()
            results = []
            for policy in policies:
                cycle = time.perf_counter()
                child = self.fork(parent)
                try:
                    start = time.perf_counter()
                    decisions = self.decide(child, policy)
                    decide_ms = (time.perf_counter() - start) * 1e3
                    if on_decided is not None:
                        on_decided(policy, child)
                    if split < len(prompt):  # the question, through the kept context
                        self.append(child, len(prompt) - split)
                        child.prefill_logits = self.model.step(
                            prompt[split:], np.arange(split, len(prompt)), child)
                    results.append(self._result(example, policy, child, decisions, prompt_frames,
                                                0.0, decide_ms, max_new))
                finally:
                    self.close_sequence(child)
                results[-1].cycle_ms = (time.perf_counter() - cycle) * 1e3
            if results:
                results[0].prefill_ms = prefill_ms
            return results
        finally:
            self.close_sequence(parent)

    def _frames_per_layer(self, tokens: int) -> int:
        pages = -(-tokens // self.page_size)
        return pages * (1 if self.pool.frame_layout == "layer" else self.model.config.kv_heads)


# ---- a private daemon (tests, and the command line without --server) ---------------------------
def _terminate_with(parent: int) -> Callable[[], None]:
    """What the daemon's child runs before exec: ask Linux for SIGTERM when the thread that
    started it dies (prctl PR_SET_PDEATHSIG), so a tool killed outright (SIGKILL, a SIGTERM it
    does not catch) leaves no daemon behind; and exit at once if that parent is already gone."""
    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)
    return arm


_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


class LocalDaemon:
    """entrokvd on 127.0.0.1 with kernel-chosen ports, stopped with SIGTERM by stop(); and, when
    started from the main thread, when the process that started it dies. (Linux signals the
    child when the thread that forked it exits, so a daemon started from a short-lived thread,
    as a test's restart may be, is not armed: that thread's end would stop it.)"""

    def __init__(self, binary: str, *args: str, listen: str = "127.0.0.1:0"):
        armed = threading.current_thread() is threading.main_thread()
        self.process = subprocess.Popen(
            [binary, f"--listen={listen}", "--metrics_listen=127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_terminate_with(os.getpid()) if armed else None)
        line = self.process.stdout.readline()
        addresses = entrokv.parse_listening_line(line)
        if addresses is None:
            self.process.kill()
            raise RuntimeError(f"entrokvd did not start: {line!r} {self.process.stderr.read()}")
        self.address = addresses.address

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.process.stdout.close()
        self.process.stderr.close()
        return code


# ---- the command line: the main job's demonstration --------------------------------------------
def parse_policies(text: str, ratio: float) -> List[Policy]:
    return [policy_of(name, ratio) for name in (part.strip() for part in text.split(",")) if name]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the small GQA model with entrokvd as its KV cache: prefill each prompt "
                    "once, fork it per policy, decide, decode greedily; print accuracy and frames.")
    parser.add_argument("--server", help="entrokvd address; default: start --entrokvd privately")
    parser.add_argument("--entrokvd", default="entrokvd", help="daemon binary when no --server")
    parser.add_argument("--entrokv", default="entrokv",
                        help="the entrokv CLI: `entrokv policies` names each policy's statistic")
    parser.add_argument("--weights", required=True, help="the model's .npz (train.py export)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts, spread over the tasks")
    parser.add_argument("--length", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--tasks", default=",".join(tasks.TASKS))
    parser.add_argument("--policies", default="page_entrokv,mean")
    parser.add_argument("--ratio", type=float, default=0.75,
                        help="compression ratio: the share of the KV cache evicted")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--frame-layout", choices=("group", "layer"), default="group")
    parser.add_argument("--element", choices=sorted(ELEMENTS), default="f32")
    parser.add_argument("--concurrency", type=int, default=2, help="prompts in flight")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--question-excluded", action="store_true",
                        help="decide the context before the question is seen (the question is "
                             "prefilled after the decision)")
    parser.add_argument("--layer-quotas", action="store_true",
                        help="also print each policy's pages kept per (layer, group), the mean "
                             "over the prompts of each layer's quota")
    parser.add_argument("--fail-open", action="store_true",
                        help="a decision the daemon cannot give in time leaves the cache as it "
                             "is; the other calls wait for a restarting daemon")
    args = parser.parse_args(argv)

    registry = policy_registry.load(args.entrokv)
    policies = [Policy("none")] + [p for p in parse_policies(args.policies, args.ratio)
                                   if p.name != "none"]
    for policy in policies[1:]:
        if policy.name not in registry:
            parser.error(f"--policies: '{policy.name}' is not one of none, "
                         f"{', '.join(registry.names)}")
    model = numpy_model.Model.load(args.weights)
    task_list = [t for t in args.tasks.split(",") if t]
    per_task = -(-args.prompts // len(task_list))
    examples = [e for t in task_list for e in tasks.examples(t, args.length, per_task, args.seed)]
    examples = examples[:args.prompts]
    daemon = None if args.server else LocalDaemon(args.entrokvd)
    address = args.server or daemon.address
    print(f"pool worker: {len(examples)} prompts of {args.length} tokens "
          f"({', '.join(task_list)}), each prefilled once into entrokvd's pool at {address} and "
          f"forked per policy; compression ratio {args.ratio} "
          f"(keep {100 * (1 - args.ratio):g}%), {args.frame_layout} layout, page size "
          f"{args.page_size}, {args.element} K/V; greedy answers, exact match "
          f"(multi-value: any order)")
    started = time.perf_counter()
    try:
        with entrokv.Client(address, timeout_s=60, wait_for_ready=args.fail_open) as client:
            worker = PoolWorker(client, model, registry, page_size=args.page_size,
                                frame_layout=args.frame_layout, element=args.element,
                                fail_open=args.fail_open)
            try:
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    runs = list(pool.map(lambda e: worker.run_forked(
                        e, policies, question_excluded=args.question_excluded), examples))
                stats = client.pool_stats(worker.model_id)
            finally:
                worker.close()
    finally:
        if daemon is not None:
            daemon.stop()
    elapsed = time.perf_counter() - started
    width = max(22, *(len(p.label()) for p in policies))
    print(f"{'policy':<{width}} {'accuracy':>9} {'frames kept':>12} {'of prompt':>10} "
          f"{'decode ms/token':>16}")
    for i, policy in enumerate(policies):
        results = [run[i] for run in runs]
        correct = sum(r.correct for r in results)
        kept = np.mean([r.kept_frames for r in results])
        share = kept / np.mean([r.prompt_frames for r in results])
        tokens = sum(r.decode_tokens for r in results)
        ms = sum(r.decode_ms for r in results) / max(tokens, 1)
        print(f"{policy.label():<{width}} {correct:>4}/{len(results):<4} {kept:>12.0f} "
              f"{100 * share:>9.1f}% {ms:>16.1f}")
    if args.layer_quotas:
        print(f"{'pages per (layer, group)':<{width}} "
              + " ".join(f"{'layer ' + str(l):>8}" for l in range(model.config.layers)))
        for i, policy in enumerate(policies[1:], start=1):
            quotas = np.mean([[d.quota_pages for d in run[i].decisions] for run in runs], axis=0)
            print(f"{policy.label():<{width}} " + " ".join(f"{q:>8.1f}" for q in quotas))
    prefill = np.mean([run[0].prefill_ms for run in runs])
    cycle = np.mean([r.cycle_ms for run in runs for r in run[1:]] or [0.0])
    print(f"prefill {prefill:.0f} ms/prompt, fork + decide + decode + close {cycle:.0f} ms; "
          f"{elapsed:.1f} s in all; pool after every close: "
          f"{stats.used_frames} used + {stats.free_frames} free = {stats.capacity_frames} frames")
    if args.fail_open:
        print(f"fail-open: {worker.no_decisions} decisions gone without "
              f"({client.no_decisions})")
    # Every sequence is closed by now: a frame still in use, or one missing from the count, is a
    # leak and fails the run.
    balanced = stats.used_frames + stats.free_frames == stats.capacity_frames
    return 0 if balanced and stats.used_frames == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
