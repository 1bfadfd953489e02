#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo, CPU) step time of a GPT-2, the reference side of
benchmarks/parallel/compare_ddp.sh. Run with Debian's python3 (PyTorch 1.13, CPU):

    /usr/bin/python3 benchmarks/parallel/ddp_torch.py --ranks 2 --layers 4 --dim 256 --heads 8 \
        --vocab 4096 --seq 128 --batch 8 --steps 10 --bucket-mb 25

Spawns --ranks processes (torch.multiprocessing), each with --threads intra-op threads, builds the
same GPT-2 as fourway (pre-LayerNorm blocks, tanh GELU, LayerNorm eps 1e-5, learned positions,
LM head tied to wte, mean cross-entropy), splits the global batch of --batch sequences evenly,
and times forward + backward (gradients all-reduced by DDP's buckets, overlapped with backward)
+ AdamW over --steps steps after --warmup steps. Prints one line of JSON from rank 0:
{"impl":"torch-ddp-gloo","ranks":..,"ms_per_step":..,"tokens_per_s":..,"losses":[...]}.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.nh, hs).transpose(1, 2)
        k = k.view(B, T, self.nh, hs).transpose(1, 2)
        v = v.view(B, T, self.nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(~mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, C, NH, V, T):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))  # not a buffer: gloo has no bool
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T].unsqueeze(0)
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def worker(rank, a, port, out):
    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(a.seed)
    model = Gpt(a.layers, a.dim, a.heads, a.vocab, a.seq)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(a.seed + 1)
    data = torch.randint(0, a.vocab, (a.warmup + a.steps, a.batch, a.seq + 1), generator=gen)
    per = a.batch // a.ranks
    losses, times = [], []
    for s in range(a.warmup + a.steps):
        rows = data[s, rank * per:(rank + 1) * per]
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = ddp(rows[:, :-1], rows[:, 1:])
        loss.backward()
        opt.step()
        dist.barrier()
        dt = time.perf_counter() - t0
        g = loss.detach().clone()
        dist.all_reduce(g)
        losses.append(g.item() / a.ranks)
        if s >= a.warmup:
            times.append(dt)
    if rank == 0:
        times.sort()
        med = times[len(times) // 2]
        out.put({"impl": "torch-ddp-gloo", "torch": torch.__version__, "ranks": a.ranks,
                 "threads_per_rank": a.threads, "bucket_mb": a.bucket_mb,
                 "params": sum(p.numel() for p in model.parameters()),
                 "ms_per_step": med * 1e3, "tokens_per_s": a.batch * a.seq / med,
                 "losses": losses})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="global sequences per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    if a.batch % a.ranks:
        raise SystemExit(f"--batch {a.batch} does not divide by --ranks {a.ranks}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, a.port, out)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    import queue
    result = None
    while result is None:
        try:
            result = out.get(timeout=1.0)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit("a DDP rank failed; see its traceback above")
    for p in procs:
        p.join()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
