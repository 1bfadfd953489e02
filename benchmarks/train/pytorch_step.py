#!/usr/bin/python3
"""One GPT-2 training step (forward, backward, clip, AdamW) in PyTorch, timed: the PyTorch side of
benchmarks/train/compare_pytorch.sh (CPU, fp32) and benchmarks/train/compare_pytorch_gpu.sh
(CUDA, bf16).

The model is tools/make_golden.py's GPT-2 in plain torch ops (the same arithmetic as fourway's
Gpt: pre-LN blocks, tanh GELU, causal softmax attention, tied head, mean cross-entropy), the
optimizer torch.optim.AdamW (weight decay 0.1 on 2-D weights, betas 0.9 / 0.95) with clipping of
the global gradient norm at 1.0, as fourway-train runs it.

CPU (default: --device cpu --dtype fp32): make_golden's gpt_loss itself, unchanged; prints one line
  pytorch VERSION threads N step_ms <median wall> tokens_per_s <...> cpu_ms <median process CPU
  time> loss <last loss>

CUDA (--device cuda): the same model with the causal mask made once on the GPU, the token lookup
as F.embedding and the linear layers as F.linear (what nn.Embedding and nn.Linear run: the linear
layers are one GEMM with the bias, in the autocast dtype). Each step is timed between
torch.cuda.synchronize() calls. The line above gets more fields:
  ... loss L device cuda dtype bf16 attention eager adamw default params N mfu 0.xxxx
  --dtype bf16   the honest PyTorch equivalent of fourway's bf16 mode (bf16 compute, fp32 master
                 weights and AdamW moments) as PyTorch users write it: fp32 parameters, forward
                 and loss under torch.autocast(device_type='cuda', dtype=torch.bfloat16), backward
                 outside it, fp32 gradients, AdamW on the fp32 parameters. (No loss scaling: bf16
                 has fp32's range.) Autocast keeps LayerNorm, softmax and the cross-entropy in fp32
                 and the residual stream in fp32; fourway keeps bf16 weights, activations and
                 gradients with fp32 masters. The arithmetic differs in those details, not the
                 work: the same GEMMs in bf16 on tensor cores.
  --dtype fp32   true fp32 (TF32 off unless --tf32).
  --attention eager   (default) q·kᵀ, scale, masked_fill, softmax, ·v: the (B, H, T, T)
                      scores materialised, as make_golden and nanoGPT's manual path do
  --attention sdpa    F.scaled_dot_product_attention(q, k, v, is_causal=True) (PyTorch >= 2.0:
                      flash / memory-efficient kernels); --sdpa is short for it
  --attention compile the sdpa model's loss under torch.compile (PyTorch >= 2.0: the inductor
                      fuses the elementwise work around the GEMMs); the compilation happens in
                      the warm-up steps, which are not timed
  --attention eager,sdpa,compile   several in one process, one after the other (fresh model,
                      optimizer and warm-up each), one line each: saves start-ups and CUDA init
  --adamw default|foreach|fused   torch.optim.AdamW's implementation (default: PyTorch's choice,
                      foreach on CUDA; nanoGPT passes fused=True)
MFU = tokens/s · (6·N + 12·L·T·C) / peak, with N every parameter (wte counted once: it is the
tied head), L layers, T the sequence length, C the width: 6·N for the forward and backward of
the weights, 12·L·T·C for the attention's score and value products (PaLM's appendix-B convention,
as nanoGPT: not halved for the causal mask). Peak: --peak-tflops, default 989 (bf16 dense tensor
core of the H100/H200 SXM, NVIDIA's datasheet); for --dtype fp32 pass the GPU's fp32 figure.
"""
import argparse
import gc
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from make_golden import gpt_loss, init_params, param_shapes  # noqa: E402

H200_BF16_DENSE_TFLOPS = 989.0  # NVIDIA H100/H200 SXM datasheet: BF16 tensor core, dense


def flops_per_token(cfg, n_params, seq):
    """6·N + 12·L·T·C (see the module docstring)."""
    return 6 * n_params + 12 * cfg["layers"] * seq * cfg["dim"]


def gpt_loss_device(p, cfg, idx, targets, attention, causal):
    """make_golden.gpt_loss on any device: the mask made once (`causal`, True above the
    diagonal), the token lookup as F.embedding and the linear layers as F.linear (x @ W + b in
    one GEMM), as nn.Embedding and nn.Linear run them, and optionally SDPA."""
    B, T = idx.shape
    C, NH = cfg["dim"], cfg["heads"]
    hs = C // NH
    x = F.embedding(idx, p["wte.weight"]) + p["wpe.weight"][:T].unsqueeze(0)
    for i in range(cfg["layers"]):
        q_ = f"h.{i}."
        h = F.layer_norm(x, (C,), p[q_ + "ln_1.weight"], p[q_ + "ln_1.bias"], 1e-5)
        qkv = F.linear(h, p[q_ + "attn.c_attn.weight"].t(), p[q_ + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(causal[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, p[q_ + "attn.c_proj.weight"].t(), p[q_ + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), p[q_ + "ln_2.weight"], p[q_ + "ln_2.bias"], 1e-5)
        h = F.gelu(F.linear(h, p[q_ + "mlp.c_fc.weight"].t(), p[q_ + "mlp.c_fc.bias"]),
                   approximate="tanh")
        x = x + F.linear(h, p[q_ + "mlp.c_proj.weight"].t(), p[q_ + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = F.linear(x, p["wte.weight"])
    return F.cross_entropy(logits.reshape(-1, cfg["vocab"]).float(), targets.reshape(-1))


def fail(msg, code=1):
    print(f"pytorch_step.py: {msg}", file=sys.stderr)
    sys.exit(code)


def run(a, cfg, dev, attention, init, tokens):
    """Warm-up and timed steps of one configuration from a copy of the initial parameters `init`
    on the batch `tokens` (both on the CPU); returns the output line."""
    params = {n: t.detach().to(dev, copy=True).requires_grad_(True) for n, t in init.items()}
    order = [params[n] for n, _ in param_shapes(cfg)]
    n_params = sum(p.numel() for p in order)
    impl = {} if a.adamw == "default" else {a.adamw: True}
    opt = torch.optim.AdamW([{"params": [p for p in order if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in order if p.dim() != 2], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **impl)
    data = tokens.to(dev)
    inputs, targets = data[:, :-1], data[:, 1:]
    golden = dev.type == "cpu" and attention == "eager"
    causal = None
    if not golden and attention == "eager":
        causal = torch.ones(a.seq, a.seq, dtype=torch.bool, device=dev).triu(1)
    autocast = a.dtype == "bf16"

    loss_fn = gpt_loss_device
    if attention == "compile":  # the sdpa model, compiled
        loss_fn = torch.compile(gpt_loss_device)

    def forward():
        if golden:
            return gpt_loss(params, cfg, inputs, targets)
        return loss_fn(params, cfg, inputs, targets, "sdpa" if attention == "compile" else attention,
                       causal)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times, cpu = [], []
    for _ in range(a.warmup + a.steps):
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        if autocast:
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = forward()
        else:
            loss = forward()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(order, 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    t = sorted(times[a.warmup:])[len(times[a.warmup:]) // 2]
    c = sorted(cpu[a.warmup:])[len(cpu[a.warmup:]) // 2]
    tokens_per_s = a.batch * a.seq / t
    line = (f"pytorch {torch.__version__} threads {a.threads} step_ms {t * 1e3:.1f} "
            f"tokens_per_s {tokens_per_s:.0f} cpu_ms {c * 1e3:.1f} loss {float(loss):.4f}")
    if (dev.type != "cpu" or a.dtype != "fp32" or attention != "eager" or a.adamw != "default"
            or a.peak_tflops > 0):  # else compare_pytorch.sh's line, unchanged
        line += (f" device {dev.type} dtype {a.dtype} attention {attention} adamw {a.adamw}"
                 f" params {n_params}")
        if a.peak_tflops > 0:
            mfu = tokens_per_s * flops_per_token(cfg, n_params, a.seq) / (a.peak_tflops * 1e12)
            line += f" mfu {mfu:.4f}"
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="fp32, or bf16 autocast over fp32 parameters (default fp32)")
    ap.add_argument("--attention", default="eager",
                    help="eager, sdpa, compile, or a comma list run one after the other "
                         "(default eager)")
    ap.add_argument("--sdpa", action="store_true", help="short for --attention sdpa")
    ap.add_argument("--adamw", choices=["default", "foreach", "fused"], default="default",
                    help="torch.optim.AdamW implementation (default: PyTorch's choice)")
    ap.add_argument("--tf32", action="store_true", help="CUDA fp32: let matmuls use TF32")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak for the MFU (default 989 on CUDA: H100/H200 SXM bf16 dense; "
                         "0: no MFU)")
    a = ap.parse_args()
    attentions = ["sdpa"] if a.sdpa else [s.strip() for s in a.attention.split(",") if s.strip()]
    for att in attentions:
        if att not in ("eager", "sdpa", "compile"):
            ap.error(f"--attention takes eager, sdpa, compile or a comma list of them, got '{att}'")
    if not attentions:
        ap.error("--attention is empty")
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if a.peak_tflops is None:
        a.peak_tflops = H200_BF16_DENSE_TFLOPS if a.device == "cuda" else 0.0
    for att in ("sdpa", "compile"):
        if att in attentions and not (hasattr(F, "scaled_dot_product_attention")
                                      and hasattr(torch, "compile")):
            fail(f"--attention {att} needs F.scaled_dot_product_attention and torch.compile "
                 f"(PyTorch >= 2.0); this is PyTorch {torch.__version__}")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            built = torch.version.cuda or "none (a CPU-only build)"
            fail(f"--device cuda, but torch.cuda.is_available() is False (PyTorch "
                 f"{torch.__version__} from {os.path.dirname(torch.__file__)}, built for CUDA "
                 f"{built}): no GPU is visible or this PyTorch has no CUDA; run it on a GPU "
                 f"machine with a CUDA build of PyTorch", 77)
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    elif a.tf32:
        ap.error("--tf32 is for --device cuda")
    torch.set_num_threads(a.threads)
    cfg = dict(layers=a.layers, heads=a.heads, dim=a.dim, vocab=a.vocab, max_seq=a.seq)
    dev = torch.device(a.device)
    gen = torch.Generator().manual_seed(1)
    init = init_params(cfg, gen)  # on the CPU generator: the same init on every device
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
    for att in attentions:
        print(run(a, cfg, dev, att, init, tokens), flush=True)
        gc.collect()  # the run's model, gradients and optimizer state are garbage now
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
