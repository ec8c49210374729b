"""RULER-style long-context retrieval tasks over the model's own small vocabulary.

These are RULER-style tasks, not RULER: the same four shapes (single needle, multi-key needle,
multi-value needle, variable tracking) written by our own generator over a 128-token vocabulary,
so that a small model trained here can solve them and eviction can be measured on its answers.

Every example is a pure function of (task, length, seed): the same arguments give the same
tokens on every machine (numpy's PCG64 generator, no global state).

A prompt is

    BOS  filler ... needle ... filler ... needle ...  Q <question>

and the answer the model must produce greedily is `answer` followed by EOS (multi-value: the
key's values in any order, exactly, see `accepted_answers`). Keys and variable
names are one token (a letter), values are digits. A needle states a value right after its key
(`key k 2 8 3 1 1 .`) and the key tasks ask with the key (`Q: key k`), so the answer continues
the question exactly as the value continues its key in the needle. Variable tracking writes
assignments rightward, source first (`2 8 3 1 1 -> a .` then `a -> b .`, as R's `->`), asks
`Q: 2 8 3 1 1 ->` and answers with the chain of names holding the value (`a b ...`): each name
is found from the one before it by looking forward, the direction retrieval heads read. Filler
is sentences from a fixed random bigram chain over 80 words, so attention over it is neither
uniform nor trivially repetitive.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import List, Sequence, Tuple

import numpy as np

# ---- vocabulary -------------------------------------------------------------------------------
# IS and VAR belong to earlier formats and stay unused, so that token ids do not move.
PAD, BOS, EOS, SEP, Q, A, KEY, IS, VAR, ARROW, COMMA = range(11)
DIGIT0 = 11  # digits 0-9: 11..20
LETTER0 = 21  # letters a-z: 21..46
WORD0 = 47  # filler words: 47..126
WORDS = 80
VOCAB = 128

TASKS = ("single_needle", "multi_key", "multi_value", "variable_tracking")

_NAMES = (["<pad>", "<s>", "</s>", ".", "Q:", "A:", "key", "is", "var", "->", ","] +
          [str(d) for d in range(10)] + [chr(ord("a") + i) for i in range(26)] +
          [f"w{i}" for i in range(WORDS)] + ["<unused>"])


def detokenize(tokens: Sequence[int]) -> str:
    """Readable text for logs and docs."""
    return " ".join(_NAMES[int(t)] if 0 <= int(t) < len(_NAMES) else "?" for t in tokens)


@dataclasses.dataclass(frozen=True)
class Example:
    task: str
    prompt: np.ndarray  # int32 [T], starts with BOS, ends with the question
    answer: np.ndarray  # int32, the tokens to generate before EOS
    needle_spans: Tuple[Tuple[int, int], ...]  # [start, end) token spans the answer depends on
    depth: float  # where the (first) needle sits, 0 = start of the filler, 1 = end


# ---- filler -----------------------------------------------------------------------------------
def _bigram_table() -> np.ndarray:
    """A fixed sparse bigram chain: each word has 6 likely successors."""
    rng = np.random.Generator(np.random.PCG64(20261130))
    table = np.full((WORDS, WORDS), 0.02 / WORDS)
    for w in range(WORDS):
        successors = rng.choice(WORDS, size=6, replace=False)
        table[w, successors] += rng.dirichlet(np.ones(6)) * 0.98
    return table / table.sum(axis=1, keepdims=True)


_BIGRAMS = _bigram_table()
_CUMULATIVE = np.cumsum(_BIGRAMS, axis=1)


def filler(rng: np.random.Generator, count: int) -> List[int]:
    """`count` tokens of sentences (5-12 words then SEP) from the bigram chain."""
    out: List[int] = []
    while len(out) < count:
        length = int(rng.integers(5, 13))
        word = int(rng.integers(WORDS))
        for _ in range(length):
            out.append(WORD0 + word)
            word = int(np.searchsorted(_CUMULATIVE[word], rng.random(), side="right"))
            word = min(word, WORDS - 1)
        out.append(SEP)
    return out[:count]


def _digits(rng: np.random.Generator, count: int) -> List[int]:
    return [DIGIT0 + int(d) for d in rng.integers(0, 10, size=count)]


def _names(rng: np.random.Generator, count: int) -> List[int]:
    """`count` distinct one-token names (letters): keys and variables."""
    return [LETTER0 + int(c) for c in rng.choice(26, size=count, replace=False)]


def _distinct(rng: np.random.Generator, make, count: int) -> List[List[int]]:
    seen, out = set(), []
    while len(out) < count:
        item = make()
        if tuple(item) not in seen:
            seen.add(tuple(item))
            out.append(item)
    return out


# ---- assembly ---------------------------------------------------------------------------------
def _assemble(rng: np.random.Generator, length: int, needles: List[List[int]],
              depths: List[float], question: List[int]) -> Tuple[List[int], List[Tuple[int, int]]]:
    """BOS + filler with the needles at their depths + Q question A, exactly `length` tokens.

    Needles are placed at sentence boundaries of the filler in the order of their depths; a
    needle's span is where it ends up in the prompt.
    """
    fixed = 1 + sum(len(n) for n in needles) + 1 + len(question)
    filler_count = length - fixed
    if filler_count < 8:
        raise ValueError(f"length {length} is too short for this task (needs > {fixed + 8})")
    text = filler(rng, filler_count)
    boundaries = [i + 1 for i, t in enumerate(text) if t == SEP] or [filler_count]
    order = sorted(range(len(needles)), key=lambda i: depths[i])
    cuts = []
    for i in order:
        target = depths[i] * filler_count
        cuts.append((min(boundaries, key=lambda b: (abs(b - target), b)) if depths[i] > 0 else 0, i))
    tokens, spans = [BOS], [None] * len(needles)
    start = 0
    for cut, i in cuts:
        tokens.extend(text[start:cut])
        start = cut
        spans[i] = (len(tokens), len(tokens) + len(needles[i]))
        tokens.extend(needles[i])
    tokens.extend(text[start:])
    tokens.extend([Q] + question)
    assert len(tokens) == length, (len(tokens), length)
    return tokens, spans


def _rng(task: str, length: int, seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([TASKS.index(task), length, seed]))


def make_example(task: str, length: int, seed: int, depth: float | None = None) -> Example:
    """One prompt of exactly `length` tokens. `depth` in [0, 1] places the needle the answer
    comes from; None draws it from the seed."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    rng = _rng(task, length, seed)
    if depth is None:
        depth = float(rng.random())
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")

    if task == "single_needle":
        key, value = _names(rng, 1), _digits(rng, 5)
        needles = [[KEY] + key + value + [SEP]]
        tokens, spans = _assemble(rng, length, needles, [depth], [KEY] + key)
        answer, used = value, [0]
    elif task == "multi_key":
        keys = [[name] for name in _names(rng, 4)]
        values = [_digits(rng, 5) for _ in keys]
        needles = [[KEY] + k + v + [SEP] for k, v in zip(keys, values)]
        depths = [depth] + [float(x) for x in rng.random(3)]
        tokens, spans = _assemble(rng, length, needles, depths, [KEY] + keys[0])
        answer, used = values[0], [0]
    elif task == "multi_value":
        key, other = ([name] for name in _names(rng, 2))
        values = _distinct(rng, lambda: _digits(rng, 3), 4)
        needles = [[KEY] + key + v + [SEP] for v in values[:3]]
        needles.append([KEY] + other + values[3] + [SEP])  # a distractor key
        depths = sorted([depth] + [float(x) for x in rng.random(2)]) + [float(rng.random())]
        tokens, spans = _assemble(rng, length, needles, depths, [KEY] + key)
        # All values of the key, in the order they appear in the prompt.
        in_order = sorted(range(3), key=lambda i: spans[i][0])
        answer = []
        for n, i in enumerate(in_order):
            answer += values[i] + ([COMMA] if n < 2 else [])
        used = [0, 1, 2]
    else:  # variable_tracking: a chain of 4 names holding one value, and a distractor chain
        names = [[name] for name in _names(rng, 8)]
        value = _digits(rng, 5)
        # The distractor's value differs from the asked one in every digit, so one digit of the
        # question tells the chains apart.
        other_value = [DIGIT0 + (d - DIGIT0 + int(s)) % 10
                       for d, s in zip(value, rng.integers(1, 10, size=5))]
        chain, decoy = names[:4], names[4:]
        needles = [value + [ARROW] + chain[0] + [SEP]]
        needles += [chain[i - 1] + [ARROW] + chain[i] + [SEP] for i in range(1, 4)]
        needles += [other_value + [ARROW] + decoy[0] + [SEP]]
        needles += [decoy[i - 1] + [ARROW] + decoy[i] + [SEP] for i in range(1, 4)]
        # Each hop comes after the one it names; the chain starts at `depth`.
        hops = np.sort(rng.random(3)) * (1.0 - depth) + depth
        decoy_depths = np.sort(rng.random(4))
        depths = [depth] + [float(h) for h in hops] + [float(d) for d in decoy_depths]
        tokens, spans = _assemble(rng, length, needles, depths, value + [ARROW])
        answer = [t for name in chain for t in name]
        used = [0, 1, 2, 3]
    return Example(task=task,
                   prompt=np.asarray(tokens, dtype=np.int32),
                   answer=np.asarray(answer, dtype=np.int32),
                   needle_spans=tuple(spans[i] for i in used),
                   depth=depth)


def accepted_answers(example: Example) -> List[List[int]]:
    """Every answer graded right. Multi-value accepts the key's values in any order, each once
    and nothing else (stricter than RULER's string_match_all, which credits each value found in
    the output and ignores the rest); `answer` is the prompt-order one. The other tasks have one
    answer."""
    answer = [int(t) for t in example.answer]
    if example.task != "multi_value":
        return [answer]
    accepted = []
    for order in itertools.permutations(_comma_separated(answer)):
        accepted.append([t for n, v in enumerate(order) for t in ([COMMA] if n else []) + v])
    return accepted


def _comma_separated(answer: List[int]) -> List[List[int]]:
    values, current = [], []
    for t in answer + [COMMA]:
        if t == COMMA:
            values.append(current)
            current = []
        else:
            current.append(t)
    return values


def ruler_credit(example: Example, generated: Sequence[int]) -> float:
    """RULER's string_match_all on tokens: the share of the references that appear anywhere in
    the output as a contiguous run, whatever else it holds. The references are as RULER's: each
    value (multi-value), each variable name (variable tracking), the answer (the needle tasks).
    Looser than is_correct, which is all or nothing; for comparison with RULER-graded results."""
    answer = [int(t) for t in example.answer]
    if example.task == "multi_value":
        references = _comma_separated(answer)
    elif example.task == "variable_tracking":
        references = [[t] for t in answer]
    else:
        references = [answer]
    out = [int(t) for t in generated]

    def appears(ref: List[int]) -> bool:
        return any(out[i:i + len(ref)] == ref for i in range(len(out) - len(ref) + 1))

    return sum(appears(r) for r in references) / len(references)


def answer_budget(example: Example) -> int:
    """How many tokens a greedy decode of `example` may write: the answer, EOS and one spare.
    Every grader decodes this many (the report, weights_check, training's checks), so an answer
    that runs on is cut at the same place everywhere."""
    return len(example.answer) + 2


def is_correct(example: Example, generated: Sequence[int]) -> bool:
    """Whether greedy output (the tokens before EOS) is an accepted answer."""
    return [int(t) for t in generated] in accepted_answers(example)


def examples(task: str, length: int, count: int, seed: int = 0) -> List[Example]:
    """`count` examples with needle depths spread evenly over [0, 1] (0%, ..., 100%)."""
    return [example_at(task, length, count, i, seed) for i in range(count)]


def example_at(task: str, length: int, count: int, index: int, seed: int = 0) -> Example:
    """The `index`-th of `examples(task, length, count, seed)`, made alone (a worker process
    that runs one prompt need not generate all of them)."""
    if not 0 <= index < count:
        raise ValueError(f"index must be in [0, {count}), got {index}")
    depth = float(np.linspace(0.0, 1.0, count)[index]) if count > 1 else 0.5
    return make_example(task, length, seed * 1_000_003 + index, depth)
