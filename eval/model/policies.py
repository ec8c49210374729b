"""The eviction policies as the C++ registry states them (core/scoring/policies.cc).

The Python tools keep no list of policy names and no table of which statistic a policy scores:
they ask the `entrokv` CLI once (`entrokv policies --json`, offline) and read both from here.

    registry = policies.load("build/client/cli/entrokv")
    registry.names                 # every policy, registry order
    registry.statistic("h2o")      # "accumulated"
"""
from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
from typing import Iterable, Tuple

STATISTICS = ("last_row", "window_mean", "accumulated", "none")


@dataclasses.dataclass(frozen=True)
class PolicyInfo:
    name: str
    statistic: str  # what a worker should measure for it: one of STATISTICS
    exact_budget: bool  # keeps exactly K pages per group; False: the union of its heads' pages


class Registry:
    """The registered policies in registry order. Immutable; picklable (worker processes get it
    from their parent)."""

    def __init__(self, infos: Iterable[PolicyInfo]):
        self._infos = {info.name: info for info in infos}

    @property
    def names(self) -> Tuple[str, ...]:
        """Every registered policy."""
        return tuple(self._infos)

    @property
    def exact_budget_names(self) -> Tuple[str, ...]:
        """The policies that keep exactly their quota per group (all but the union)."""
        return tuple(name for name, info in self._infos.items() if info.exact_budget)

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def info(self, name: str) -> PolicyInfo:
        if name not in self._infos:
            raise ValueError(f"policy '{name}' is not one of {', '.join(self._infos)}")
        return self._infos[name]

    def statistic(self, name: str) -> str:
        """The statistic `name` scores: last_row, window_mean, accumulated, or none."""
        return self.info(name).statistic

    def wanting(self, statistic: str) -> Tuple[str, ...]:
        """The policies that score `statistic`, in registry order."""
        return tuple(name for name, info in self._infos.items() if info.statistic == statistic)


def parse(text: str) -> Registry:
    """`entrokv policies --json`'s document as a Registry; ValueError when it is not one."""
    try:
        listed = json.loads(text)["policies"]
        infos = [PolicyInfo(str(p["name"]), str(p["statistic"]), bool(p["exact_budget"]))
                 for p in listed]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"not an `entrokv policies --json` document: {text[:200]!r}") from error
    for info in infos:
        if info.statistic not in STATISTICS:
            raise ValueError(f"policy {info.name}: unknown statistic {info.statistic!r}")
    if not infos:
        raise ValueError("`entrokv policies --json` listed no policy")
    return Registry(infos)


@functools.lru_cache(maxsize=None)
def load(cli: str = "entrokv") -> Registry:
    """The registry of the `entrokv` binary `cli` (a path, or a name on PATH)."""
    try:
        done = subprocess.run([cli, "policies", "--json"], capture_output=True, text=True,
                              timeout=60)
    except OSError as error:
        raise RuntimeError(f"cannot run the entrokv CLI '{cli}': {error}") from error
    if done.returncode != 0:
        raise RuntimeError(f"{cli} policies --json failed ({done.returncode}): "
                           f"{done.stderr.strip()}")
    return parse(done.stdout)
