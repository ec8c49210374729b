"""The small GQA model's forward in PyTorch, on any device (a GPU for the CUDA pool worker).

The same computation as numpy_model.Model, step for step (RMSNorm, rotary positions, grouped
attention in blocks of QUERY_BLOCK query rows, SwiGLU), so the two agree to float32 rounding
(torch_model_test.py checks the logits and the greedy answers). The KV cache interface is
numpy_model's with torch tensors for K and V:
  kv.write(layer, positions, k, v)      positions: numpy int64 [n]; k, v: tensors [G, n, D]
  kv.read(layer) -> (k, v, positions)   per group: lists of [n_g, D] tensors, numpy positions
Statistics handed to on_layer are per-group [r, T_g] float32 tensors on the model's device.
Logits come back as numpy float32 [n, vocab].
"""
from __future__ import annotations

from typing import List, Sequence, Union

import numpy as np
import torch

import numpy_model
from numpy_model import QUERY_BLOCK, Config, rope_tables


class TorchDenseKV:
    """numpy_model.DenseKV with tensors: every position of every (layer, group), no eviction."""

    def __init__(self, config: Config, device: torch.device):
        c = config
        self.config, self.device = config, device
        self.positions = [np.zeros(0, np.int64) for _ in range(c.layers)]
        self.k = [torch.zeros((c.kv_heads, 0, c.head_dim), device=device) for _ in range(c.layers)]
        self.v = [torch.zeros((c.kv_heads, 0, c.head_dim), device=device) for _ in range(c.layers)]

    def write(self, layer: int, positions: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> None:
        self.positions[layer] = np.concatenate([self.positions[layer], np.asarray(positions)])
        self.k[layer] = torch.cat([self.k[layer], k], dim=1)
        self.v[layer] = torch.cat([self.v[layer], v], dim=1)

    def read(self, layer: int):
        groups = range(self.config.kv_heads)
        return ([self.k[layer][g] for g in groups], [self.v[layer][g] for g in groups],
                [self.positions[layer] for _ in groups])


class TorchModel:
    """numpy_model.Model's weights as float32 tensors on `device`; step() as Model.step."""

    def __init__(self, model: numpy_model.Model, device: Union[str, torch.device] = "cpu"):
        self.config = model.config
        self.device = torch.device(device)
        self.w = {name: torch.tensor(np.ascontiguousarray(value), device=self.device)
                  for name, value in model.w.items()}  # copies: the numpy model is untouched

    def _rms_norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        scale = 1.0 / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.config.norm_eps)
        return x * scale * gain

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _attention(self, layer: int, x: torch.Tensor, positions: np.ndarray, kv,
                   stat_rows: Union[int, Sequence[int]], on_queries=None):
        c, p = self.config, f"layers.{layer}."
        h = self._rms_norm(x, self.w[p + "attn_norm.weight"])
        n = x.shape[0]
        q = (h @ self.w[p + "wq.weight"].T).reshape(n, c.query_heads, c.head_dim).transpose(0, 1)
        k = (h @ self.w[p + "wk.weight"].T).reshape(n, c.kv_heads, c.head_dim).transpose(0, 1)
        v = (h @ self.w[p + "wv.weight"].T).reshape(n, c.kv_heads, c.head_dim).transpose(0, 1)
        if on_queries is not None:  # Model.step's: the queries before RoPE, as numpy
            on_queries(layer, q.float().cpu().numpy())
        cos, sin = (torch.from_numpy(t).to(self.device)
                    for t in rope_tables(positions, c.head_dim, c.rope_base))
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        kv.write(layer, positions, k.contiguous(), v.contiguous())
        keys, values, cached = kv.read(layer)
        out = torch.zeros((c.query_heads, n, c.head_dim), device=self.device)
        single = isinstance(stat_rows, (int, np.integer))
        windows = [int(w) for w in ((stat_rows,) if single else stat_rows) if w > 0]
        stats = {w: [None] * c.kv_heads for w in windows}
        scale = 1.0 / np.sqrt(c.head_dim)
        query_positions = torch.from_numpy(np.asarray(positions, np.int64)).to(self.device)
        for g in range(c.kv_heads):
            heads = slice(g * c.group_size, (g + 1) * c.group_size)
            key_positions = torch.from_numpy(np.asarray(cached[g], np.int64)).to(self.device)
            sums = {w: torch.zeros((c.group_size, len(cached[g])), dtype=torch.float64,
                                   device=self.device) for w in windows}
            for a in range(0, n, QUERY_BLOCK):
                b = min(n, a + QUERY_BLOCK)
                seen = int(np.searchsorted(cached[g], positions[b - 1], side="right"))
                scores = (q[heads, a:b] @ keys[g][:seen].T) * scale  # [r, b - a, seen]
                future = key_positions[None, :seen] > query_positions[a:b, None]
                scores = scores.masked_fill(future[None], float("-inf"))
                probs = torch.softmax(scores, dim=-1)
                out[heads, a:b] = probs @ values[g][:seen]
                for w in windows:
                    first = max(a, n - w)
                    if first < b:
                        sums[w][:, :seen] += probs[:, first - a:, :].sum(dim=1).double()
            for w in windows:
                stats[w][g] = (sums[w] / min(w, n)).float()
        out = out.transpose(0, 1).reshape(n, c.query_heads * c.head_dim)
        result = out @ self.w[p + "wo.weight"].T
        if not windows:
            return result, None
        return result, stats[windows[0]] if single else stats

    def _mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = f"layers.{layer}."
        h = self._rms_norm(x, self.w[p + "mlp_norm.weight"])
        gate = h @ self.w[p + "w1.weight"].T
        up = h @ self.w[p + "w3.weight"].T
        return (gate / (1.0 + torch.exp(-gate)) * up) @ self.w[p + "w2.weight"].T

    @torch.no_grad()
    def step(self, tokens: np.ndarray, positions: np.ndarray, kv,
             stat_rows: Union[int, Sequence[int]] = 0, on_layer=None,
             on_queries=None) -> np.ndarray:
        """Model.step: new tokens through every layer; logits [n, vocab] as numpy float32."""
        index = torch.from_numpy(np.asarray(tokens, np.int64)).to(self.device)
        x = self.w["embed.weight"][index]
        positions = np.asarray(positions)
        for layer in range(self.config.layers):
            attn, stat = self._attention(layer, x, positions, kv, stat_rows, on_queries)
            x = x + attn
            x = x + self._mlp(layer, x)
            if on_layer is not None and stat is not None:
                on_layer(layer, stat)
        x = self._rms_norm(x, self.w["norm.weight"])
        return (x @ self.w["output.weight"].T).float().cpu().numpy()

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens)
        return self.step(tokens, np.arange(len(tokens)), TorchDenseKV(self.config, self.device))

    def generate(self, prompt: np.ndarray, max_new: int, eos: int) -> List[int]:
        """Greedy decoding with a dense cache, as Model.generate."""
        kv = TorchDenseKV(self.config, self.device)
        logits = self.step(np.asarray(prompt), np.arange(len(prompt)), kv)
        return numpy_model.greedy_continue(
            logits, len(prompt), max_new, eos,
            lambda tokens, positions: self.step(tokens, positions, kv))
