"""Trains the small GQA model on the RULER-style tasks (PyTorch, CPU or GPU).

    /usr/bin/python3 eval/model/train.py --out eval/model/weights.npz --log eval/model/train_log.jsonl

A curriculum over lengths (short prompts first, where the retrieval circuit forms quickly, then
the evaluated lengths), loss on the answer tokens and EOS only, AdamW with warm-up and cosine
decay. Warm-up tasks with a loss on many tokens per example teach the circuits retrieval needs
(`pieces`: induction heads; `recall`: every fact of a prompt asked about), and short prompts
with spread rotary positions (spread_positions) show the model long needle-to-question
distances at the cost of short prompts. Every example comes from tasks.make_example (or a
warm-up) with a seed derived from (--seed, step, i), so a run is reproducible, and a run
stopped at a checkpoint resumes where it stopped (--resume); a new run may start from a
model's checkpoint or exported weights (--start-from), a shallower one grown to --layers (grow).
The weights are exported to .npz for numpy_model (no PyTorch at inference) and checked against
this module's logits before the file is written.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import tasks  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


QUERY_CHUNK = 256  # query rows per attention block; see causal_attention


def causal_attention(q, k, v, mask, r):
    """Causal GQA attention of [b, H_Q, t_q, d] queries, the last t_q positions, on
    [b, H_KV, t, d] keys and values; query head h reads KV head h // r. Query rows go in chunks
    of QUERY_CHUNK, each against only the keys up to its last row: the masked upper triangle,
    half of a full t x t product, is never computed, and a chunk's scores stay small enough for
    the cache. Within a chunk each group's r heads are stacked along the row axis so one batched
    matmul per KV head does the group."""
    b, heads, t_q, d = q.shape
    kv_heads, offset = k.shape[1], k.shape[2] - t_q
    q = q.reshape(b, kv_heads, r, t_q, d)
    outs = []
    for start in range(0, t_q, QUERY_CHUNK):
        end = min(t_q, start + QUERY_CHUNK)
        keys = offset + end
        rows = q[:, :, :, start:end].reshape(b, kv_heads, r * (end - start), d)
        causal = mask[offset + start:keys, :keys].repeat(r, 1)
        scores = rows @ k[:, :, :keys].transpose(-1, -2) + causal
        probs = torch.softmax(scores, dim=-1)
        outs.append((probs @ v[:, :, :keys]).view(b, kv_heads, r, end - start, d))
    return torch.cat(outs, dim=3).view(b, heads, t_q, d)


class Block(nn.Module):
    def __init__(self, c: numpy_model.Config):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.wq = nn.Linear(c.d_model, c.query_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.d_model, c.kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.d_model, c.kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.query_heads * c.head_dim, c.d_model, bias=False)
        self.mlp_norm = RMSNorm(c.d_model, c.norm_eps)
        self.w1 = nn.Linear(c.d_model, c.mlp_hidden, bias=False)
        self.w3 = nn.Linear(c.d_model, c.mlp_hidden, bias=False)
        self.w2 = nn.Linear(c.mlp_hidden, c.d_model, bias=False)

    def forward(self, x, cos, sin, mask, first_row=0):
        """The block's output at rows first_row.. (every row reads the keys of all before it)."""
        c = self.c
        b, t, _ = x.shape
        h = self.attn_norm(x)
        rows = t - first_row
        q = self.wq(h[:, first_row:]).view(b, rows, c.query_heads, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        q = rope(q, cos[:, :, first_row:], sin[:, :, first_row:]) * (1.0 / math.sqrt(c.head_dim))
        k = rope(k, cos, sin)
        out = causal_attention(q, k, v, mask, c.group_size).transpose(1, 2).reshape(b, rows, -1)
        x = x[:, first_row:] + self.wo(out)
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Transformer(nn.Module):
    def __init__(self, c: numpy_model.Config):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.output = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, tokens, positions=None, first_row=0):
        """Logits at rows first_row.. (training asks only for the rows its loss reads: the last
        layer then skips the others' queries and MLP). positions: [b, t] rotary positions
        (default 0..t-1); training spreads them out."""
        c = self.c
        b, t = tokens.shape
        if positions is None:
            positions = torch.arange(t).expand(b, t)
        # numpy_model's tables, so training and inference rotate by the same angles.
        cos, sin = numpy_model.rope_tables(positions.reshape(-1).cpu().numpy(), c.head_dim,
                                           c.rope_base)
        cos, sin = (torch.from_numpy(a).view(b, 1, t, -1).to(tokens.device) for a in (cos, sin))
        mask = torch.full((t, t), float("-inf"), device=tokens.device).triu(1)  # additive, causal
        x = self.embed(tokens)
        for block in self.layers[:-1]:
            x = block(x, cos, sin, mask)
        x = self.layers[-1](x, cos, sin, mask, first_row)
        return self.output(self.norm(x))


def pieces_example(length, seed, digits=False):
    """A warm-up task (`pieces`): BOS, a random string, then pieces of it (4-11 tokens each)
    copied from random places; loss on every copied token after a piece's first.

    Retrieval needs heads that find an earlier occurrence of the current token and copy what
    followed it (induction heads). Pieces from random places force the match on content; the
    string repeated once (the earlier warm-up) can be copied by a head that looks a fixed
    distance back, which does not help retrieval.

    `digits` (`digit_pieces`): a string of digits only, pieces of 6-14, loss from a piece's
    fourth token on. Every digit occurs many times, so the last token copied does not say where
    the copy is: the model must find the source from the piece's first tokens and then follow
    it, the copying that a value sharing digits with another needs.
    """
    rng = np.random.Generator(np.random.PCG64([98 if digits else 99, length, seed]))
    half = (length - 1) // 2
    top = tasks.DIGIT0 + 10 if digits else tasks.VOCAB - 1
    given, shortest, longest = (3, 6, 15) if digits else (1, 4, 12)  # given: untaught
    body = rng.integers(tasks.DIGIT0, top, size=half)
    seq, tgt = [tasks.BOS] + [int(t) for t in body], [-100] * (half + 1)
    while len(seq) < length:
        start = int(rng.integers(0, half - 4))
        piece = [int(t) for t in body[start:start + int(rng.integers(shortest, longest))]]
        piece = piece[:length - len(seq)]
        tgt[-1] = -100  # the piece's first token is a free choice, not predictable
        seq += piece
        # Row j of the piece predicts its token j + 1, taught from the piece's token `given` on.
        following = piece[1:] + [-100]
        tgt += [t if j + 1 >= given else -100 for j, t in enumerate(following)]
    return np.asarray(seq, dtype=np.int64), np.asarray(tgt, dtype=np.int64)


def _few_words(rng):
    """Zero to three filler words, between the facts of a warm-up prompt."""
    count = int(rng.integers(0, 4))
    return [tasks.WORD0 + int(w) for w in rng.integers(0, tasks.WORDS, size=count)]


def _ask(seq, targets, question, answer):
    """Appends `Q: <question> <answer>` to a warm-up prompt, the loss on the answer alone.

    Position t is trained to predict token t + 1: the question's last token predicts the
    answer's first, and the answer's last (EOS) predicts nothing.
    """
    seq += [tasks.Q] + question + answer
    targets += [-100] * len(question) + answer + [-100]


def recall_example(seed, wide=False):
    """A warm-up task (`recall`): several `key k <digits> .` facts (the tasks' needle form),
    then questions about all of them in a random order, each `Q: key k <digits> </s>`; loss on
    every answer.

    Multi-key retrieval needs a head that matches the asked key against the key before each
    value; one answer per prompt teaches it slowly. Here every example asks about every fact it
    states. `wide_recall` states 5-7 digit values (multi-key's are 5): in values that long a
    digit recurs, so the digit after it is found by more than the one token before it (the
    multi-key misses were such copies: `6 8 6 6 8` answered `6 8 6 8 6`).
    """
    rng = np.random.Generator(np.random.PCG64([95 if wide else 98, seed]))
    count = int(rng.integers(3, 9))
    keys = tasks.LETTER0 + rng.choice(26, size=count, replace=False)
    width = int(rng.integers(5, 8) if wide else rng.integers(1, 4))
    values = rng.integers(tasks.DIGIT0, tasks.DIGIT0 + 10, size=(count, width))
    seq = [tasks.BOS]
    for k, v in zip(keys, values):
        seq += [tasks.KEY, int(k)] + [int(d) for d in v] + [tasks.SEP]
        seq += _few_words(rng)
    targets = [-100] * len(seq)
    for i in rng.permutation(count):
        answer = [int(d) for d in values[i]] + [tasks.EOS]
        _ask(seq, targets, [tasks.KEY, int(keys[i])], answer)
    return np.asarray(seq, dtype=np.int64), np.asarray(targets, dtype=np.int64)


def values_example(seed, twins=False):
    """A warm-up task (`values`): multi-value facts, dense. Several keys, most with two to four
    values of the same width, stated `key k <digits> .` in a shuffled order; then every key
    asked, `Q: key k <value> , <value> , ... </s>` with the values in prompt order; loss on
    every answer.

    After a value, the answer needs the key's next value in the prompt: a step one induction
    head cannot take (every `key k` matches). One multi-value prompt gives two such targets;
    this gives a dozen.

    `twins` (`twin_values`): values of two or three digits, each after a key's first starting
    with the digits of an earlier one of the key (one digit or all but the last). Copying such
    a value digit by digit needs where the copy started, not only the last digit copied: most
    multi-value misses of the 6-layer model early in phase 2 were of this kind (TRAINING.md).
    """
    rng = np.random.Generator(np.random.PCG64([95 if twins else 97, seed]))
    count = int(rng.integers(2, 6))
    width = int(rng.integers(2, 4)) if twins else int(rng.integers(1, 4))
    keys = tasks.LETTER0 + rng.choice(26, size=count, replace=False)
    values = [rng.integers(tasks.DIGIT0, tasks.DIGIT0 + 10, size=(int(rng.integers(1, 5)), width))
              for _ in range(count)]
    if twins:
        for key_values in values:
            for j in range(1, len(key_values)):
                shared = int(rng.integers(1, width))
                key_values[j, :shared] = key_values[rng.integers(j), :shared]
                while any(np.array_equal(key_values[j], key_values[k]) for k in range(j)):
                    key_values[j, shared:] = rng.integers(tasks.DIGIT0, tasks.DIGIT0 + 10,
                                                          size=width - shared)
    facts = [(i, j) for i in range(count) for j in range(len(values[i]))]
    order = rng.permutation(len(facts))
    seq, said = [tasks.BOS], [[] for _ in range(count)]
    for f in order:
        i, j = facts[f]
        said[i].append(j)
        seq += [tasks.KEY, int(keys[i])] + [int(d) for d in values[i][j]] + [tasks.SEP]
        seq += _few_words(rng)
    targets = [-100] * len(seq)
    for i in rng.permutation(count):
        answer = []
        for n, j in enumerate(said[i]):
            answer += [int(d) for d in values[i][j]]
            answer += [tasks.COMMA] if n + 1 < len(said[i]) else []
        _ask(seq, targets, [tasks.KEY, int(keys[i])], answer + [tasks.EOS])
    return np.asarray(seq, dtype=np.int64), np.asarray(targets, dtype=np.int64)


def chains_example(seed):
    """A warm-up task (`chains`): variable tracking, dense. Two to four chains of assignments
    (`<digits> -> a .`, then `a -> b .`, `b -> c .`, each after the one it names), interleaved;
    then every chain asked by its value, `Q: <digits> -> a b c </s>`; loss on every answer.

    Each name after the first needs the assignment that names the previous one, a step of its
    own kind; a variable-tracking prompt gives three such targets, this gives up to twelve.
    """
    rng = np.random.Generator(np.random.PCG64([96, seed]))
    count = int(rng.integers(2, 5))
    width = int(rng.integers(1, 6))
    names = tasks.LETTER0 + rng.choice(26, size=4 * count, replace=False)
    chains = [[int(n) for n in names[4 * i:4 * i + int(rng.integers(2, 5))]] for i in range(count)]
    # Values differ in every digit, as variable tracking's decoy does.
    first = rng.integers(0, 10, size=width)
    values = [[tasks.DIGIT0 + (int(d) + int(s)) % 10 for d, s in zip(first, shift)]
              for shift in [np.zeros(width, dtype=int)] +
              [rng.integers(1, 10, size=width) for _ in range(count - 1)]]
    for i in range(1, count):  # distinct from every earlier chain in every digit, by rejection
        while any(any(a == b for a, b in zip(values[i], values[j])) for j in range(i)):
            values[i] = [tasks.DIGIT0 + int(d) for d in rng.integers(0, 10, size=width)]
    pending = [0] * count
    seq = [tasks.BOS]
    while any(p < len(c) for p, c in zip(pending, chains)):
        i = int(rng.choice([c for c in range(count) if pending[c] < len(chains[c])]))
        hop = pending[i]
        source = values[i] if hop == 0 else [chains[i][hop - 1]]
        seq += source + [tasks.ARROW, chains[i][hop], tasks.SEP]
        seq += _few_words(rng)
        pending[i] += 1
    targets = [-100] * len(seq)
    for i in rng.permutation(count):
        _ask(seq, targets, values[i] + [tasks.ARROW], chains[i] + [tasks.EOS])
    return np.asarray(seq, dtype=np.int64), np.asarray(targets, dtype=np.int64)


WARM_UPS = {"pieces": pieces_example,
            "digit_pieces": lambda length, seed: pieces_example(length, seed, digits=True),
            "recall": lambda length, seed: recall_example(seed),
            "wide_recall": lambda length, seed: recall_example(seed, wide=True),
            "values": lambda length, seed: values_example(seed),
            "twin_values": lambda length, seed: values_example(seed, twins=True),
            "chains": lambda length, seed: chains_example(seed)}
# Warm-ups made of facts and then questions; they have far_ and long_ forms.
FACT_WARM_UPS = ("recall", "wide_recall", "values", "twin_values", "chains")
# `far_<name>`: the warm-up with its facts' rotary positions spread over the stage's span, so the
# steps between facts (a key's next value, a chain's next name) are taken at long distances.
FAR_WARM_UPS = {"far_" + name: name for name in FACT_WARM_UPS}
# `long_<name>`: the warm-up with filler sentences between its facts, the stage's length in all
# (set_in_filler).
LONG_WARM_UPS = {"long_" + name: name for name in FACT_WARM_UPS}
# Every warm-up task a mix may name, and the warm-up it draws.
WARM_UP_FORMS = {**{name: name for name in WARM_UPS}, **FAR_WARM_UPS, **LONG_WARM_UPS}
# `deep_<task>`: the task with its asked needle in the last quarter of the prompt (depth drawn
# in [0.75, 1]), next to the question: of the 17 multi-key misses at 2K (300 prompts, depths
# 0-100%), 13 were in the 84 prompts with the needle at depth 0.72 or more, 4 in the other 216.
DEEP_DEPTHS = (0.75, 1.0)
DEEP_TASKS = {"deep_" + name: name for name in tasks.TASKS}
# `early_<task>`: the task redrawn until every needle its answer depends on ends in the first
# EARLY_END of the prompt, far from the question: the r = 8 model's multi-value misses (80
# prompts, 1K and 2K) had their last value a median 42% and 35% of the prompt before the
# question, the prompts it answered 17% and 19%. Trained on, it did not help (TRAINING.md).
EARLY_END = 0.6
EARLY_TASKS = {"early_" + name: name for name in tasks.TASKS}
# Every name a curriculum's mix may use ("all" aside).
MIX_FORMS = frozenset(tasks.TASKS) | set(WARM_UP_FORMS) | set(DEEP_TASKS) | set(EARLY_TASKS)


def early_example(task, length, rng):
    """The first draw of `task` (seeds from `rng`) whose needles all end in the first EARLY_END."""
    while True:
        e = tasks.make_example(task, length, int(rng.integers(1 << 31)))
        if max(end for _, end in e.needle_spans) <= EARLY_END * length:
            return e


def set_in_filler(seq, targets, length, rng):
    """A fact warm-up `seq` with the tasks' filler sentences between its facts, `length` tokens
    in all (one already that long as it is); the facts keep their order, so every answer stays
    right.

    Spread rotary positions (far_) show the distances of a long prompt but not its filler.
    Teacher-forced at 2K, the 6-layer model of run 5 (TRAINING.md) got 12% of the answer tokens of
    `values` set in filler wrong and none of multi-value's: a multi-value prompt teaches the step
    to a key's next value twice, a `values` warm-up about five times.
    """
    question = int(np.flatnonzero(seq == tasks.Q)[0])
    assert np.all(targets[:question] == -100), "only the answers after the facts are taught"
    count = length - len(seq)
    if count <= 0:
        return seq, targets
    text = np.asarray(tasks.filler(rng, count), dtype=np.int64)
    sentence_starts = np.concatenate([[0], np.flatnonzero(text == tasks.SEP) + 1])
    # Each fact ends with its full stop; the few words after it travel with the next fact.
    facts = np.split(seq[1:question], np.flatnonzero(seq[1:question] == tasks.SEP)[:-1] + 1)
    cuts = np.sort(rng.choice(sentence_starts, size=len(facts)))
    out, start = [seq[:1]], 0
    for cut, fact in zip(cuts, facts):
        out += [text[start:cut], fact]
        start = cut
    out += [text[start:], seq[question:]]
    seq = np.concatenate(out)
    asked = len(seq) - (len(targets) - question)  # where the questions start now
    return seq, np.concatenate([np.full(asked, -100), targets[question:]])


def spread_positions(prompt, total, span, rng):
    """Rotary positions for a sequence whose prompt is `prompt`, spread over up to `span`.

    RoPE sees only distances, so a short prompt whose positions jump at filler sentence ends
    (never inside a needle, the question or the answer) shows the model the needle-to-question
    distances of a prompt up to `span` tokens long at the cost of a short one. The spread is
    drawn per example, uniform in [len, span]; the jumps split it with Dirichlet(0.5) shares.
    """
    positions = np.arange(total, dtype=np.int64)
    question = int(np.flatnonzero(prompt == tasks.Q)[-1])
    cuts = np.flatnonzero(prompt[:question] == tasks.SEP) + 1
    if span <= total or len(cuts) == 0:
        return positions
    extra = int(rng.integers(0, span - total + 1))
    gaps = rng.multinomial(extra, rng.dirichlet(np.full(len(cuts), 0.5)))
    jump = np.zeros(total, dtype=np.int64)
    jump[cuts] = gaps
    return positions + np.cumsum(jump)


def batch(task_mix, length, size, seed, span=0):
    """Prompt + answer + EOS, padded to one length; targets -100 except answer and EOS; and
    each row's rotary positions (spread over up to `span` when span > length).

    The target is `answer`: multi-value's values in prompt order, one of the orders graded
    right (eval/model/README.md says why not a random one)."""
    rows, targets, positions = [], [], []
    rng = np.random.Generator(np.random.PCG64([7, seed]))
    for i in range(size):
        task = task_mix[(seed + i) % len(task_mix)]
        if task in WARM_UP_FORMS:
            seq, tgt = WARM_UPS[WARM_UP_FORMS[task]](length, seed * 64 + i)
            if task in LONG_WARM_UPS:  # its own generator: the other rows draw as before
                words = np.random.Generator(np.random.PCG64([4, seed, i]))
                seq, tgt = set_in_filler(seq, tgt, length, words)
            rows.append(seq)
            targets.append(tgt)
            if task in FAR_WARM_UPS:
                far = np.random.Generator(np.random.PCG64([5, seed, i]))
                positions.append(spread_positions(seq, len(seq), span, far))
            else:
                positions.append(np.arange(len(seq)))
            continue
        if task in DEEP_TASKS:  # its own generator: the other rows draw as before
            deep = np.random.Generator(np.random.PCG64([6, seed, i]))
            e = tasks.make_example(DEEP_TASKS[task], length, seed * 64 + i,
                                   depth=float(deep.uniform(*DEEP_DEPTHS)))
        elif task in EARLY_TASKS:  # its own generator too
            e = early_example(EARLY_TASKS[task], length,
                              np.random.Generator(np.random.PCG64([8, seed, i])))
        else:
            e = tasks.make_example(task, length, seed * 64 + i)
        seq = np.concatenate([e.prompt, e.answer, [tasks.EOS]])
        tgt = np.full(len(seq), -100, dtype=np.int64)
        tgt[len(e.prompt) - 1:len(seq) - 1] = seq[len(e.prompt):]
        rows.append(seq)
        targets.append(tgt)
        positions.append(spread_positions(e.prompt, len(seq), span, rng))
    width = max(len(r) for r in rows)
    x = np.full((size, width), tasks.PAD, dtype=np.int64)
    y = np.full((size, width), -100, dtype=np.int64)
    p = np.zeros((size, width), dtype=np.int64)
    for i, (r, t, q) in enumerate(zip(rows, targets, positions)):
        x[i, :len(r)], y[i, :len(t)], p[i, :len(q)] = r, t, q
        p[i, len(q):] = q[-1] + 1 + np.arange(width - len(q))
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(p)


def accuracy(plain, task, length, count, seed):
    """Share of greedy answers graded right (tasks.is_correct) on the prompts batch() draws for
    (seed + 8k), decoded by `plain` (a numpy_model.Model, with its KV cache, as weights_check
    and the worker decode)."""
    correct = 0
    for start in range(0, count, 8):
        for i in range(min(8, count - start)):
            e = tasks.make_example(task, length, (seed + start) * 64 + i)
            answer = plain.generate(e.prompt, tasks.answer_budget(e), tasks.EOS)
            correct += tasks.is_correct(e, answer)
    return correct / count


def layer_count(state):
    return 1 + max(int(name.split(".")[1]) for name in state if name.startswith("layers."))


def grow(model, old_state):
    """Loads a shallower model's weights (`old_state`) into `model`. The old layers keep their
    order, spread evenly over the new depth; each new layer starts as the identity (its
    attention and MLP output projections zero, so it adds nothing to the residual), so the grown
    model computes exactly what the old one did and training continues from there."""
    old_layers = layer_count(old_state)
    new_layers = model.c.layers
    if not 1 < old_layers < new_layers:
        raise ValueError(f"--start-from has {old_layers} layers; --layers must be more, "
                         f"got {new_layers}")
    place = {i: round(i * (new_layers - 1) / (old_layers - 1)) for i in range(old_layers)}
    state = {}
    for name, value in old_state.items():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            name = f"layers.{place[int(i)]}.{rest}"
        state[name] = value
    with torch.no_grad():
        for j in set(range(new_layers)) - set(place.values()):
            model.layers[j].wo.weight.zero_()
            model.layers[j].w2.weight.zero_()
            state.update({f"layers.{j}.{k}": v for k, v in model.layers[j].state_dict().items()})
    model.load_state_dict(state)


def start_from(model, state):
    """Loads a model's weights (`state`) into `model`: as they are at the same depth, grown
    (grow) from a shallower model. A deeper model is refused."""
    if layer_count(state) == model.c.layers:
        model.load_state_dict(state)
    else:
        grow(model, state)


def saved_weights(path):
    """A model's weights by name, from a --checkpoint file or from weights exported to .npz
    (numpy_weights' names are the state dict's)."""
    if path.endswith(".npz"):
        return {k: torch.from_numpy(v) for k, v in numpy_model.Model.load(path).w.items()}
    return torch.load(path)["model"]


def numpy_weights(model):
    """The weights as float32 numpy arrays: what export writes and numpy_model runs."""
    return {name: p.detach().cpu().numpy().astype(np.float32)
            for name, p in model.state_dict().items()}


def export(model, config, path):
    np.savez_compressed(path, config_json=json.dumps(dataclasses.asdict(config)),
                        **numpy_weights(model))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="weights .npz to write")
    ap.add_argument("--log", required=True, help="JSON-lines training log to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--curriculum", default="256:800:16,512:400:8,1024:200:4,2048:100:4",
                    help="length:steps:batch[:task+task...[:span]],... in order; tasks default "
                         "to all four ('all', which a mix may also name), 'pieces', "
                         "'digit_pieces', 'recall', 'wide_recall', 'values', 'twin_values' and "
                         "'chains' are warm-up tasks "
                         "(far_<warm-up>: spread over the span; long_<warm-up>: set in filler to "
                         "the stage's length; deep_<task>: the asked needle in the last "
                         "quarter); span > length spreads rotary "
                         "positions over up to span (spread_positions)")
    ap.add_argument("--eval-lengths", default="",
                    help="comma-separated prompt lengths every evaluation also measures (plain "
                         "positions), besides the stage's length")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--resume", help="a --checkpoint file: continue that run where it stopped "
                                     "(weights, optimizer, schedule, step; the same arguments)")
    ap.add_argument("--checkpoint", help="training state to write at every evaluation, so a "
                                         "stopped run loses at most --eval-every steps")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--layers", type=int, default=numpy_model.Config.layers)
    ap.add_argument("--query-heads", type=int, default=numpy_model.Config.query_heads,
                    help="query heads per layer (a multiple of --kv-heads)")
    ap.add_argument("--kv-heads", type=int, default=numpy_model.Config.kv_heads,
                    help="KV heads per layer; a group of query-heads / kv-heads heads shares one")
    ap.add_argument("--start-from", help="a model's --checkpoint file or exported .npz weights "
                                         "(the committed ones): a new run (fresh optimizer and "
                                         "schedule) from its weights; a shallower model is grown "
                                         "to --layers, new layers as identities (grow)")
    args = ap.parse_args()
    if args.start_from and args.resume:
        ap.error("--start-from starts a new run; --resume continues one")
    if args.kv_heads < 1 or args.query_heads % args.kv_heads:
        ap.error(f"--query-heads ({args.query_heads}) must be a multiple of --kv-heads "
                 f"({args.kv_heads}), which must be at least 1")

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = numpy_model.Config(layers=args.layers, query_heads=args.query_heads,
                                kv_heads=args.kv_heads)
    model = Transformer(config).to(device)
    if args.start_from:
        start_from(model, saved_weights(args.start_from))
    stages = []
    for stage in args.curriculum.split(","):
        fields = stage.split(":")
        names = fields[3].split("+") if len(fields) > 3 else ["all"]
        mix = tuple(t for name in names for t in (tasks.TASKS if name == "all" else [name]))
        unknown = sorted(set(mix) - MIX_FORMS)
        if unknown:
            ap.error(f"--curriculum stage {stage}: unknown task {', '.join(unknown)}")
        span = int(fields[4]) if len(fields) > 4 else 0
        stages.append((int(fields[0]), int(fields[1]), int(fields[2]), mix, span))
    total = sum(stage[1] for stage in stages)
    eval_lengths = [int(x) for x in args.eval_lengths.split(",") if x]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / total))))
    params = sum(p.numel() for p in model.parameters())
    step, spent = 0, 0.0
    if args.resume:
        state = torch.load(args.resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, spent = state["step"], state["seconds"]
    started = time.time() - spent
    # Batches are a function of the step alone, so a resumed run sees the data it would have.
    with open(args.log, "a" if args.resume else "w") as log:
        log.write(json.dumps({"event": "resume" if args.resume else "start", "step": step,
                              "params": params, "device": device,
                              "threads": torch.get_num_threads(), "args": vars(args)}) + "\n")
        done = 0
        for length, steps, batch_size, mix, span in stages:
            done += steps
            while step < done:
                model.train()
                x, y, p = batch(mix, length, batch_size, args.seed * 10_000_019 + step, span)
                first_row = int((y != -100).any(0).nonzero().min())  # rows before have no loss
                logits = model(x.to(device), p.to(device), first_row)
                loss = F.cross_entropy(logits.reshape(-1, config.vocab),
                                       y[:, first_row:].to(device).reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                schedule.step()
                step += 1
                if step % 25 == 0:
                    record = {"step": step, "length": length, "loss": round(loss.item(), 4),
                              "seconds": round(time.time() - started, 1)}
                    print(json.dumps(record), flush=True)
                    log.write(json.dumps(record) + "\n")
                if step % args.eval_every == 0 or step == total:
                    model.eval()
                    plain = numpy_model.Model(config, numpy_weights(model))
                    acc = {t: accuracy(plain, t, length, 16, 900_000 + step)
                           for t in mix if t in tasks.TASKS}
                    record = {"step": step, "length": length, "accuracy": acc}
                    for at in eval_lengths:
                        if at == length and set(acc) == set(tasks.TASKS):
                            record[f"accuracy_{at}"] = acc  # the stage's own, measured above
                        else:
                            record[f"accuracy_{at}"] = {
                                t: accuracy(plain, t, at, 16, 900_000 + step)
                                for t in tasks.TASKS}
                    record["seconds"] = round(time.time() - started, 1)
                    print(json.dumps(record), flush=True)
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    export(model, config, args.out)
                    if args.checkpoint:
                        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                    "schedule": schedule.state_dict(), "step": step,
                                    "seconds": time.time() - started}, args.checkpoint + ".new")
                        os.replace(args.checkpoint + ".new", args.checkpoint)
        log.write(json.dumps({"event": "done", "steps": step,
                              "seconds": round(time.time() - started, 1)}) + "\n")
    export(model, config, args.out)


if __name__ == "__main__":
    main()
