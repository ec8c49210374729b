"""Inference for the small GQA model in numpy: no PyTorch needed to run it.

The model: token embedding, `layers` pre-norm blocks (RMSNorm, grouped-query attention with
rotary positions, RMSNorm, SwiGLU MLP), a final RMSNorm and an output projection. Query head `h`
reads KV head `h // r` (contiguous groups, like `repeat_kv`), the convention entrokv scores with.

Weights come from the `.npz` that `train.py` exports; names match `train.py`'s module names.

The KV cache is an object with two methods, so the same forward runs over a dense array (here)
or over the frames of entrokvd's page pool (the worker):
  kv.write(layer, positions, k, v)      k, v: [G, len(positions), D]
  kv.read(layer) -> (k, v, positions)   per group: lists of [n_g, D] arrays and their positions
"""
from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np


# Query rows per attention block (the working set of one block of scores stays in cache).
QUERY_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 128
    d_model: int = 128
    layers: int = 4
    query_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    mlp_hidden: int = 384
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def group_size(self) -> int:
        return self.query_heads // self.kv_heads


def rope_tables(positions: np.ndarray, head_dim: int, base: float) -> Tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape [len(positions), head_dim / 2] (rotate-half convention)."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: [..., T, D] with D even; rotates the two halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def query_moments(q: np.ndarray, next_position: int, future: int, sinks: int,
                  base: float) -> Tuple[np.ndarray, np.ndarray]:
    """The statistics of the queries expected next, for an expected-attention score: the mean
    and covariance over the tokens of `q` (before RoPE, [heads, n, head_dim]) past the first
    `sinks`, each rotated by RoPE's rotation averaged over the `future` positions from
    `next_position` (rotate-half convention). Returns mean [heads, head_dim] and covariance
    [heads, head_dim, head_dim], float32."""
    x = q[:, sinks:] if q.shape[1] > sinks else q
    x = x.astype(np.float64)
    mean = x.mean(axis=1)
    centred = x - mean[:, None, :]
    covariance = np.einsum("hti,htj->hij", centred, centred) / x.shape[1]
    d = q.shape[-1]
    cos, sin = rope_tables(np.arange(next_position, next_position + future), d, base)
    c, s = np.diag(cos.mean(axis=0).astype(np.float64)), np.diag(sin.mean(axis=0).astype(np.float64))
    rotation = np.block([[c, -s], [s, c]])  # apply_rope(x) = rotation @ x for one position
    mean = mean @ rotation.T
    covariance = rotation @ covariance @ rotation.T
    return mean.astype(np.float32), covariance.astype(np.float32)


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    scale = 1.0 / np.sqrt(np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True) + eps)
    return (x * scale * gain).astype(np.float32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


class DenseKV:
    """Every position of every (layer, group), in memory: the model with no eviction.

    Per layer, arrays in position order (tokens arrive ascending, after everything cached), so a
    decode step's read is a few array slices, not a walk over every cached position.
    """

    def __init__(self, config: Config):
        self.config = config
        c = config
        self.positions = [np.zeros(0, np.int64) for _ in range(c.layers)]
        self.k = [np.zeros((c.kv_heads, 0, c.head_dim), np.float32) for _ in range(c.layers)]
        self.v = [np.zeros((c.kv_heads, 0, c.head_dim), np.float32) for _ in range(c.layers)]
        self.kept = [np.zeros((c.kv_heads, 0), bool) for _ in range(c.layers)]  # not dropped

    def write(self, layer: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [kv_heads, n, head_dim] of `positions`, ascending and after every cached one."""
        positions = np.asarray(positions, np.int64)
        cached = self.positions[layer]
        if len(positions) and ((len(cached) and positions[0] <= cached[-1])
                               or np.any(np.diff(positions) <= 0)):
            raise ValueError(f"layer {layer}: positions must ascend after the cached ones")
        self.positions[layer] = np.concatenate([cached, positions])
        self.k[layer] = np.concatenate([self.k[layer], k], axis=1)
        self.v[layer] = np.concatenate([self.v[layer], v], axis=1)
        self.kept[layer] = np.concatenate(
            [self.kept[layer], np.ones((self.config.kv_heads, len(positions)), bool)], axis=1)

    def drop(self, layer: int, group: int, positions: Sequence[int]) -> None:
        self.kept[layer][group] &= ~np.isin(self.positions[layer], np.asarray(positions))

    def read(self, layer: int):
        kept = self.kept[layer]
        return ([self.k[layer][g][kept[g]] for g in range(self.config.kv_heads)],
                [self.v[layer][g][kept[g]] for g in range(self.config.kv_heads)],
                [self.positions[layer][kept[g]] for g in range(self.config.kv_heads)])


class Model:
    def __init__(self, config: Config, weights: Dict[str, np.ndarray]):
        self.config = config
        self.w = {name: np.asarray(value, dtype=np.float32) for name, value in weights.items()}

    @classmethod
    def load(cls, path: str) -> "Model":
        with np.load(path) as data:
            config = Config(**json.loads(str(data["config_json"])))
            weights = {k: data[k] for k in data.files if k != "config_json"}
        return cls(config, weights)

    # ---- one layer over new tokens, attending through the cache -------------------------------
    def _attention(self, layer: int, x: np.ndarray, positions: np.ndarray, kv,
                   stat_rows: Union[int, Sequence[int]], on_queries=None):
        """x: [n, d] new tokens at `positions` (ascending, after everything cached).

        Writes their K/V into `kv`, attends causally over what `kv` holds, and returns the
        attention output [n, d] and, when stat_rows > 0, the statistic: per group, the mean
        attention probability of the last `stat_rows` new queries over every cached position,
        [r, T_g] (positions in cache order). stat_rows may be a sequence of window sizes W: then
        the statistic is a dict W -> that list, all from one pass (a W >= n averages every new
        query, the ACCUMULATED statistic divided by n).
        """
        c, p = self.config, f"layers.{layer}."
        h = rms_norm(x, self.w[p + "attn_norm.weight"], c.norm_eps)
        n = x.shape[0]
        q = (h @ self.w[p + "wq.weight"].T).reshape(n, c.query_heads, c.head_dim).transpose(1, 0, 2)
        k = (h @ self.w[p + "wk.weight"].T).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
        v = (h @ self.w[p + "wv.weight"].T).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
        if on_queries is not None:  # the queries before RoPE, [query_heads, n, head_dim]
            on_queries(layer, q)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_base)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv.write(layer, positions, k.astype(np.float32), v.astype(np.float32))
        keys, values, cached = kv.read(layer)
        out = np.zeros((c.query_heads, n, c.head_dim), np.float32)
        single = isinstance(stat_rows, (int, np.integer))
        windows = [int(w) for w in ((stat_rows,) if single else stat_rows) if w > 0]
        stats = {w: [None] * c.kv_heads for w in windows}
        scale = 1.0 / np.sqrt(c.head_dim)
        for g in range(c.kv_heads):
            heads = slice(g * c.group_size, (g + 1) * c.group_size)
            sums = {w: np.zeros((c.group_size, len(cached[g])), np.float64) for w in windows}
            # Blocks of query rows: every row's softmax is its own, and a [r, block, T_g] score
            # block stays in cache (three times faster than one [r, n, T_g] array at n = 2K).
            # Both caches read in position order, so a block sees a prefix of the cache: the
            # keys after its last query (probability 0) are never scored.
            for a in range(0, n, QUERY_BLOCK):
                b = min(n, a + QUERY_BLOCK)
                seen = int(np.searchsorted(cached[g], positions[b - 1], side="right"))
                scores = (q[heads, a:b] @ keys[g][:seen].T) * scale  # [r, b - a, seen]
                scores[:, cached[g][None, :seen] > positions[a:b, None]] = -np.inf  # causal
                probs = softmax(scores, axis=-1)
                out[heads, a:b] = probs @ values[g][:seen]
                for w in windows:  # the rows of the last w queries that fall in this block
                    first = max(a, n - w)
                    if first < b:
                        sums[w][:, :seen] += probs[:, first - a:, :].sum(axis=1)
            for w in windows:
                stats[w][g] = (sums[w] / min(w, n)).astype(np.float32)
        out = out.transpose(1, 0, 2).reshape(n, c.query_heads * c.head_dim)
        if not windows:
            return out @ self.w[p + "wo.weight"].T, None
        return out @ self.w[p + "wo.weight"].T, stats[windows[0]] if single else stats

    def _mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        p = f"layers.{layer}."
        h = rms_norm(x, self.w[p + "mlp_norm.weight"], self.config.norm_eps)
        gate = h @ self.w[p + "w1.weight"].T
        up = h @ self.w[p + "w3.weight"].T
        act = gate / (1.0 + np.exp(-gate)) * up
        return act @ self.w[p + "w2.weight"].T

    def step(self, tokens: np.ndarray, positions: np.ndarray, kv,
             stat_rows: Union[int, Sequence[int]] = 0, on_layer=None,
             on_queries=None) -> np.ndarray:
        """Runs new tokens through every layer; returns logits [n, vocab].

        on_layer(layer, statistic) is called after each layer's attention when stat_rows > 0,
        with the per-group statistics (a list of [r, T_g] arrays; a dict window -> such a list
        when stat_rows is a sequence of windows): the moment a worker sends that layer's
        statistic and may evict before the next layer runs. on_queries(layer, q), before it,
        gets the layer's queries before RoPE, [query_heads, n, head_dim].
        """
        x = self.w["embed.weight"][tokens].astype(np.float32)
        for layer in range(self.config.layers):
            attn, stat = self._attention(layer, x, positions, kv, stat_rows, on_queries)
            x = x + attn
            x = x + self._mlp(layer, x)
            if on_layer is not None and stat is not None:
                on_layer(layer, stat)
        x = rms_norm(x, self.w["norm.weight"], self.config.norm_eps)
        return x @ self.w["output.weight"].T

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """Logits [T, vocab] of a whole sequence with no eviction (the reference forward)."""
        tokens = np.asarray(tokens)
        return self.step(tokens, np.arange(len(tokens)), DenseKV(self.config))

    def generate(self, prompt: np.ndarray, max_new: int, eos: int, kv=None,
                 stat_rows: int = 0, on_layer=None) -> List[int]:
        """Greedy decoding: prefill `prompt`, then one token at a time until EOS or max_new."""
        kv = kv if kv is not None else DenseKV(self.config)
        logits = self.step(np.asarray(prompt), np.arange(len(prompt)), kv, stat_rows, on_layer)
        return greedy_continue(logits, len(prompt), max_new, eos,
                               lambda tokens, positions: self.step(tokens, positions, kv))


def greedy_continue(logits: np.ndarray, position: int, max_new: int, eos: int,
                    step) -> List[int]:
    """The greedy tokens after a prefill whose logits are `logits` and whose next position is
    `position`: step(tokens, positions) -> logits runs one new token; stops at EOS or max_new.
    Model.generate's loop, and torch_model's."""
    out: List[int] = []
    token = int(np.argmax(logits[-1]))
    while token != eos and len(out) < max_new:
        out.append(token)
        logits = step(np.array([token]), np.array([position]))
        position += 1
        token = int(np.argmax(logits[-1]))
    return out
