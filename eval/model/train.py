"""Trains the small GQA model on the RULER-style tasks (PyTorch, CPU or GPU).

    /usr/bin/python3 eval/model/train.py --out eval/model/weights.npz --log eval/model/train_log.jsonl

A curriculum over lengths (short prompts first, where the retrieval circuit forms quickly, then
the evaluated lengths), loss on the answer tokens and EOS only, AdamW with warm-up and cosine
decay. Every example comes from tasks.make_example with a seed derived from (--seed, step, i), so
a run is reproducible. The weights are exported to .npz for numpy_model (no PyTorch at inference)
and checked against this module's logits before the file is written.
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

    def forward(self, x, cos, sin, mask):
        c = self.c
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, c.query_heads, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rope(q, cos, sin) * (1.0 / math.sqrt(c.head_dim)), rope(k, cos, sin)
        # Query head h reads KV head h // r: stack each group's r heads along the row axis so
        # one batched matmul per KV head does the group (no repeated K/V, larger matrices).
        r = c.group_size
        q = q.reshape(b, c.kv_heads, r * t, c.head_dim)
        scores = q @ k.transpose(-1, -2) + mask.repeat(r, 1)
        probs = torch.softmax(scores, dim=-1)
        out = (probs @ v).view(b, c.query_heads, t, c.head_dim).transpose(1, 2).reshape(b, t, -1)
        x = x + self.wo(out)
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

    def forward(self, tokens):
        c = self.c
        t = tokens.shape[1]
        cos, sin = numpy_model.rope_tables(np.arange(t), c.head_dim, c.rope_base)
        cos, sin = torch.from_numpy(cos).to(tokens.device), torch.from_numpy(sin).to(tokens.device)
        mask = torch.full((t, t), float("-inf"), device=tokens.device).triu(1)  # additive, causal
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x, cos, sin, mask)
        return self.output(self.norm(x))


def copy_example(length, seed):
    """A warm-up task: BOS, a random string, the same string again; loss on the repeat.

    Retrieval needs heads that find an earlier occurrence of the current context and copy what
    followed it. A repeated random string teaches exactly that with a loss on every token of the
    repeat, where the real tasks give a handful of answer tokens per prompt.
    """
    rng = np.random.Generator(np.random.PCG64([99, length, seed]))
    half = (length - 1) // 2
    body = rng.integers(tasks.DIGIT0, tasks.VOCAB - 1, size=half)
    seq = np.concatenate([[tasks.BOS], body, body])
    tgt = np.full(len(seq), -100, dtype=np.int64)
    tgt[half + 1:len(seq) - 1] = seq[half + 2:]
    return seq, tgt


def batch(task_mix, length, size, seed):
    """Prompt + answer + EOS, padded to one length; targets -100 except answer and EOS."""
    rows, targets = [], []
    for i in range(size):
        task = task_mix[(seed + i) % len(task_mix)]
        if task == "copy":
            seq, tgt = copy_example(length, seed * 64 + i)
            rows.append(seq)
            targets.append(tgt)
            continue
        e = tasks.make_example(task, length, seed * 64 + i)
        seq = np.concatenate([e.prompt, e.answer, [tasks.EOS]])
        tgt = np.full(len(seq), -100, dtype=np.int64)
        tgt[len(e.prompt) - 1:len(seq) - 1] = seq[len(e.prompt):]
        rows.append(seq)
        targets.append(tgt)
    width = max(len(r) for r in rows)
    x = np.full((size, width), tasks.PAD, dtype=np.int64)
    y = np.full((size, width), -100, dtype=np.int64)
    for i, (r, t) in enumerate(zip(rows, targets)):
        x[i, :len(r)], y[i, :len(t)] = r, t
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def accuracy(model, task, length, count, seed, device):
    """Exact-match accuracy of greedy answers (teacher-forced argmax equals greedy decoding
    for an exact match: the first wrong token fails the example either way)."""
    correct = 0
    for start in range(0, count, 8):
        n = min(8, count - start)
        x, y = batch([task], length, n, seed + start)
        logits = model(x.to(device))
        pred = logits.argmax(-1).cpu()
        ok = ((pred == y) | (y == -100)).all(dim=1)
        correct += int(ok.sum())
    return correct / count


def export(model, config, path):
    weights = {name: p.detach().cpu().numpy().astype(np.float32)
               for name, p in model.state_dict().items()}
    np.savez_compressed(path, config_json=json.dumps(dataclasses.asdict(config)), **weights)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="weights .npz to write")
    ap.add_argument("--log", required=True, help="JSON-lines training log to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--curriculum", default="256:800:16,512:400:8,1024:200:4,2048:100:4",
                    help="length:steps:batch[:task+task...],... in order; tasks default to all "
                         "four, 'copy' is the warm-up task")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--resume", help="a --checkpoint file to continue from (weights only)")
    ap.add_argument("--checkpoint", help="PyTorch state to write at every evaluation")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--eval-every", type=int, default=250)
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = numpy_model.Config()
    model = Transformer(config).to(device)
    stages = []
    for stage in args.curriculum.split(","):
        fields = stage.split(":")
        mix = tuple(fields[3].split("+")) if len(fields) > 3 else tasks.TASKS
        stages.append((int(fields[0]), int(fields[1]), int(fields[2]), mix))
    total = sum(steps for _, steps, _, _ in stages)
    if args.resume:
        model.load_state_dict(torch.load(args.resume))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / total))))
    params = sum(p.numel() for p in model.parameters())
    started = time.time()
    step = 0
    with open(args.log, "w") as log:
        log.write(json.dumps({"event": "start", "params": params, "device": device,
                              "threads": torch.get_num_threads(), "args": vars(args)}) + "\n")
        for length, steps, batch_size, mix in stages:
            for _ in range(steps):
                model.train()
                x, y = batch(mix, length, batch_size, args.seed * 10_000_019 + step)
                logits = model(x.to(device))
                loss = F.cross_entropy(logits.reshape(-1, config.vocab), y.to(device).reshape(-1))
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
                    acc = {t: accuracy(model, t, length, 16, 900_000 + step, device)
                           for t in mix if t != "copy"}
                    record = {"step": step, "length": length, "accuracy": acc,
                              "seconds": round(time.time() - started, 1)}
                    print(json.dumps(record), flush=True)
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    export(model, config, args.out)
                    if args.checkpoint:
                        torch.save(model.state_dict(), args.checkpoint)
        log.write(json.dumps({"event": "done", "steps": step,
                              "seconds": round(time.time() - started, 1)}) + "\n")
    export(model, config, args.out)


if __name__ == "__main__":
    main()
