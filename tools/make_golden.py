#!/usr/bin/python3
"""Writes tests/golden/gpt_tiny_v1.bin: a tiny GPT-2, its data, and what PyTorch computes on it.

Run with Debian's python3 (PyTorch 1.13, CPU):  /usr/bin/python3 tools/make_golden.py
The format is documented in docs/golden.md. The model is GPT-2 written out in plain torch ops
(pre-LayerNorm blocks, tanh GELU, LayerNorm eps 1e-5, learned positions, LM head tied to wte,
mean cross-entropy over all B*T targets), fp32, one thread, fixed seeds: rerunning the script
reproduces the file bit for bit on the same PyTorch build.
"""
import argparse
import math
import os
import struct

import torch
import torch.nn.functional as F

MAGIC = b"FWGOLD\0\0"
VERSION = 1
DTYPE_F32, DTYPE_I32 = 0, 1

CONFIG = dict(layers=2, heads=4, dim=32, vocab=64, max_seq=16, B=2, T=7, steps=10)
HPARAMS = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=2.0)
SEED = 20261129


def param_shapes(cfg):
    """(name, shape) in the order fourway's Gpt::visit_parameters uses (Hugging Face names)."""
    C, V, L = cfg["dim"], cfg["vocab"], cfg["layers"]
    out = [("wte.weight", (V, C)), ("wpe.weight", (cfg["max_seq"], C))]
    for i in range(L):
        p = f"h.{i}."
        out += [
            (p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
            (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,)),
        ]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def init_params(cfg, gen):
    """GPT-2 / nanoGPT init (normal 0.02, residual projections 0.02/sqrt(2L), biases 0, LN 1),
    then biases and LayerNorm parameters perturbed so that a bias or gain that is ignored,
    swapped or transposed shows in the gradients (all-zero biases would hide it)."""
    L = cfg["layers"]
    params = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(shape, generator=gen)
        elif name.endswith("c_proj.weight"):
            t = (0.02 / math.sqrt(2 * L)) * torch.randn(shape, generator=gen)
        else:
            t = 0.02 * torch.randn(shape, generator=gen)
        params[name] = t.float().contiguous().requires_grad_(True)
    return params


def gpt_loss(p, cfg, idx, targets):
    B, T = idx.shape
    C, NH = cfg["dim"], cfg["heads"]
    hs = C // NH
    x = p["wte.weight"][idx] + p["wpe.weight"][:T].unsqueeze(0)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["layers"]):
        q_ = f"h.{i}."
        h = F.layer_norm(x, (C,), p[q_ + "ln_1.weight"], p[q_ + "ln_1.bias"], 1e-5)
        qkv = h @ p[q_ + "attn.c_attn.weight"] + p[q_ + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ p[q_ + "attn.c_proj.weight"] + p[q_ + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), p[q_ + "ln_2.weight"], p[q_ + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ p[q_ + "mlp.c_fc.weight"] + p[q_ + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ p[q_ + "mlp.c_proj.weight"] + p[q_ + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, cfg["vocab"]), targets.reshape(-1))


def entry(name, arr, dtype):
    t = arr.detach().contiguous()
    if dtype == DTYPE_F32:
        data = t.to(torch.float32).numpy().astype("<f4").tobytes()
    else:
        data = t.to(torch.int32).numpy().astype("<i4").tobytes()
    nb = name.encode("ascii")
    head = struct.pack("<I", len(nb)) + nb + struct.pack("<II", dtype, t.dim())
    head += b"".join(struct.pack("<Q", d) for d in t.shape)
    return head + data


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "tests", "golden", "gpt_tiny_v1.bin"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg, hp = CONFIG, HPARAMS
    params = init_params(cfg, gen)
    tokens = torch.randint(0, cfg["vocab"], (cfg["steps"], cfg["B"], cfg["T"] + 1), generator=gen,
                           dtype=torch.int64)

    entries = [
        entry("config", torch.tensor([cfg[k] for k in
                                      ("layers", "heads", "dim", "vocab", "max_seq", "B", "T",
                                       "steps")]), DTYPE_I32),
        entry("hparams", torch.tensor([hp[k] for k in
                                       ("lr", "beta1", "beta2", "eps", "weight_decay",
                                        "grad_clip")], dtype=torch.float32), DTYPE_F32),
        entry("tokens", tokens, DTYPE_I32),
    ]
    names = [n for n, _ in param_shapes(cfg)]
    entries += [entry(n, params[n], DTYPE_F32) for n in names]

    entries += train_and_record(params, names, hp, tokens, lambda i, t: gpt_loss(params, cfg, i, t))
    write_golden(args.out, entries)


def train_and_record(params, names, hp, tokens, loss_fn):
    """AdamW (decay on 2-D tensors), clipping at hp["grad_clip"], one step per row of `tokens`
    (steps, B, T + 1); returns the entries of step 1's gradients, the losses, the gradient norms
    and the final parameters, and prints the losses and norms."""
    order = [params[n] for n in names]
    decay = [p for p in order if p.dim() == 2]
    no_decay = [p for p in order if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    entries, losses, norms = [], [], []
    for step in range(tokens.shape[0]):
        idx, tgt = tokens[step, :, :-1], tokens[step, :, 1:]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(idx, tgt)
        loss.backward()
        if step == 0:
            entries += [entry("grad." + n, params[n].grad, DTYPE_F32) for n in names]
        norms.append(float(torch.nn.utils.clip_grad_norm_(order, hp["grad_clip"])))
        opt.step()
        losses.append(float(loss))
    entries.append(entry("loss", torch.tensor(losses, dtype=torch.float32), DTYPE_F32))
    entries.append(entry("grad_norm", torch.tensor(norms, dtype=torch.float32), DTYPE_F32))
    entries += [entry("final." + n, params[n], DTYPE_F32) for n in names]
    print("losses   ", " ".join(f"{v:.6f}" for v in losses))
    print("grad norm", " ".join(f"{v:.4f}" for v in norms), "(clip at", hp["grad_clip"], ")")
    return entries


def write_golden(path, entries):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(entries)))
        for e in entries:
            f.write(e)
    print(f"wrote {path}: {len(entries)} entries, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
