"""The paired arithmetic every comparison of answers uses: Wilson intervals for a count and the
exact McNemar test for two policies (or two sets of weights) answering the same prompts. No
dependency beyond the standard library, so tools that never talk to a daemon can use it."""
from __future__ import annotations

import math
from typing import Sequence, Tuple


def wilson(correct: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """The Wilson score interval: sound at 0% and 100%, where the normal approximation is not."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def discordant(a: Sequence[int], b: Sequence[int]) -> Tuple[int, int]:
    """Of prompts paired by position (1 or True: answered), how many only `a` answered and how
    many only `b` did: the two counts McNemar's test reads."""
    return (sum(x > y for x, y in zip(a, b)), sum(x < y for x, y in zip(a, b)))


def mcnemar(better: int, worse: int) -> float:
    """Exact two-sided McNemar p of a paired comparison: under no difference, each of the
    better + worse discordant prompts goes either way with probability 1/2."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2 ** n
    return min(1.0, 2.0 * tail)
