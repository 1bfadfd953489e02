#!/usr/bin/python3
"""One fp32 GPT-2 training step (forward, backward, AdamW) in PyTorch, timed: the PyTorch side of
benchmarks/train/compare_pytorch.sh. The model is tools/make_golden.py's GPT-2 in plain torch ops
(the same arithmetic as fourway's Gpt: pre-LN blocks, tanh GELU, causal softmax attention, tied
head, mean cross-entropy), the optimizer torch.optim.AdamW with clipping at 1.0, as fourway-train
runs it. Prints one line: `pytorch ... step_ms <median wall> tokens_per_s <...> cpu_ms <median
process CPU time>`.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from make_golden import gpt_loss, init_params, param_shapes  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = dict(layers=a.layers, heads=a.heads, dim=a.dim, vocab=a.vocab, max_seq=a.seq)
    gen = torch.Generator().manual_seed(1)
    params = init_params(cfg, gen)
    order = [params[n] for n, _ in param_shapes(cfg)]
    opt = torch.optim.AdamW([{"params": [p for p in order if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in order if p.dim() != 2], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
    times, cpu = [], []
    for step in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = gpt_loss(params, cfg, data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(order, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    t = sorted(times[a.warmup:])[len(times[a.warmup:]) // 2]
    c = sorted(cpu[a.warmup:])[len(cpu[a.warmup:]) // 2]
    print(f"pytorch {torch.__version__} threads {a.threads} step_ms {t * 1e3:.1f} "
          f"tokens_per_s {a.batch * a.seq / t:.0f} cpu_ms {c * 1e3:.1f} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
