#!/usr/bin/python3
"""Writes tests/golden/llama_tiny_v1.bin: a tiny Llama-style decoder, its data, and what PyTorch
computes on it (the reference of examples/llama/, tests/llama/).

Run with Debian's python3 (PyTorch 1.13, CPU):  /usr/bin/python3 tools/make_llama_golden.py
The format is tools/make_golden.py's (docs/golden.md). The model is written out in plain torch
ops: RMSNorm (eps 1e-5, x * rsqrt(mean(x^2) + eps) * w), rotary embeddings in the rotate-half
convention (inv_freq = 1/theta^(2i/hs), position t = the token's index), causal softmax attention,
SwiGLU (silu(x W_gate) * (x W_up)) W_down, an untied LM head, mean cross-entropy; no biases.
Tensors use fourway's layouts: linear weights (in, out) with q|k|v and gate|up side by side
(wqkv (C, 3C), w13 (C, 2F)), tok_embeddings and output (V, C). fp32, one thread, fixed seeds.
"""
import argparse
import math
import os

import torch
import torch.nn.functional as F

from make_golden import DTYPE_F32, DTYPE_I32, entry, train_and_record, write_golden

CONFIG = dict(layers=2, heads=4, dim=32, ffn=48, vocab=67, max_seq=16, B=4, T=7, steps=5)
HPARAMS = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0,
               rope_theta=10000.0, norm_eps=1e-5)
SEED = 20261203


def param_shapes(cfg):
    """(name, shape) in examples/llama/llama.hpp's visit_parameters order."""
    C, V, L, Fh = cfg["dim"], cfg["vocab"], cfg["layers"], cfg["ffn"]
    out = [("tok_embeddings.weight", (V, C))]
    for i in range(L):
        p = f"layers.{i}."
        out += [
            (p + "attention_norm.weight", (C,)), (p + "attention.wqkv.weight", (C, 3 * C)),
            (p + "attention.wo.weight", (C, C)), (p + "ffn_norm.weight", (C,)),
            (p + "feed_forward.w13.weight", (C, 2 * Fh)), (p + "feed_forward.w2.weight", (Fh, C)),
        ]
    out += [("norm.weight", (C,)), ("output.weight", (V, C))]
    return out


def init_params(cfg, gen):
    """normal(0, 0.02), wo and w2 0.02/sqrt(2L); norm gains 1 + 0.1 normal (a gain that is
    ignored or misplaced shows in the gradients)."""
    L = cfg["layers"]
    params = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("wo.weight") or name.endswith("w2.weight"):
            t = (0.02 / math.sqrt(2 * L)) * torch.randn(shape, generator=gen)
        else:
            t = 0.02 * torch.randn(shape, generator=gen)
        params[name] = t.float().contiguous().requires_grad_(True)
    return params


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x, theta):
    """x (B, NH, T, hs): the rotate-half rotary embedding of position t = index along T."""
    T, hs = x.shape[2], x.shape[3]
    i = torch.arange(0, hs // 2, dtype=torch.float32)
    inv_freq = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float32), 2.0 * i / hs)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, hs/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    a, b = x[..., : hs // 2], x[..., hs // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def llama_loss(p, cfg, hp, idx, targets):
    B, T = idx.shape
    C, NH, Fh = cfg["dim"], cfg["heads"], cfg["ffn"]
    hs = C // NH
    eps = hp["norm_eps"]
    x = p["tok_embeddings.weight"][idx]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["layers"]):
        q_ = f"layers.{i}."
        h = rms_norm(x, p[q_ + "attention_norm.weight"], eps)
        q, k, v = (h @ p[q_ + "attention.wqkv.weight"]).split(C, dim=2)
        q = rotate(q.view(B, T, NH, hs).transpose(1, 2), hp["rope_theta"])
        k = rotate(k.view(B, T, NH, hs).transpose(1, 2), hp["rope_theta"])
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ p[q_ + "attention.wo.weight"]
        h = rms_norm(x, p[q_ + "ffn_norm.weight"], eps)
        gate, up = (h @ p[q_ + "feed_forward.w13.weight"]).split(Fh, dim=2)
        x = x + (F.silu(gate) * up) @ p[q_ + "feed_forward.w2.weight"]
    x = rms_norm(x, p["norm.weight"], eps)
    logits = x @ p["output.weight"].t()
    return F.cross_entropy(logits.reshape(-1, cfg["vocab"]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "tests", "golden", "llama_tiny_v1.bin"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg, hp = CONFIG, HPARAMS
    params = init_params(cfg, gen)
    tokens = torch.randint(0, cfg["vocab"], (cfg["steps"], cfg["B"], cfg["T"] + 1), generator=gen,
                           dtype=torch.int64)
    keys = ("layers", "heads", "dim", "ffn", "vocab", "max_seq", "B", "T", "steps")
    hkeys = ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "rope_theta", "norm_eps")
    entries = [
        entry("config", torch.tensor([cfg[k] for k in keys]), DTYPE_I32),
        entry("hparams", torch.tensor([hp[k] for k in hkeys], dtype=torch.float32), DTYPE_F32),
        entry("tokens", tokens, DTYPE_I32),
    ]
    names = [n for n, _ in param_shapes(cfg)]
    entries += [entry(n, params[n], DTYPE_F32) for n in names]

    entries += train_and_record(params, names, hp, tokens,
                                lambda i, t: llama_loss(params, cfg, hp, i, t))
    write_golden(args.out, entries)


if __name__ == "__main__":
    main()
