#!/usr/bin/python3
"""Writes the golden files of fourway-train's end-to-end test (tests/golden/train_*):

  train_gpt2_v1.safetensors  a tiny GPT-2's initial weights as a Hugging Face GPT2LMHeadModel
                             file would hold them: names prefixed `transformer.`, the causal-mask
                             buffers `attn.bias` / `attn.masked_bias`, `lm_head.weight` = wte.
  train_tokens_v1.bin        an llm.c token file (256 int32 header: 20240520, 1, N; uint16 tokens)
  train_expected_v1.safetensors  what PyTorch computes: `loss` and `grad_norm` per step (F64),
                             the run's settings in `config` (I64) and `hparams` (F64), and the
                             final weights `final.<name>` (F32)

Run with Debian's python3 (PyTorch 1.13, CPU):  /usr/bin/python3 tools/make_train_golden.py
The safetensors files are written here by hand (8-byte little-endian header length, JSON header
with dtype / shape / data_offsets, raw little-endian data), without the safetensors package.
Batches follow llm.c's loader: batch k is tokens[k*B*T : k*B*T + B*T + 1] for k < K =
(N-1) // (B*T), wrapping to batch 0 after K; the token count is chosen so the run wraps twice.
The model and its init are tools/make_golden.py's (plain torch ops, fp32, one thread).
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import gpt_loss, init_params, param_shapes  # noqa: E402

VERSION = 1
CONFIG = dict(layers=2, heads=4, dim=32, vocab=64, max_seq=16, B=3, T=8, steps=8)
HPARAMS = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
SEED = 6020261


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, torch tensor); dtypes F32, F64, I64 and BOOL."""
    codes = {torch.float32: ("F32", "<f4"), torch.float64: ("F64", "<f8"),
             torch.int64: ("I64", "<i8"), torch.bool: ("BOOL", "|b1")}
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors:
        code, np_dtype = codes[t.dtype]
        data = t.detach().contiguous().numpy().astype(np_dtype).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_llmc_tokens(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out-dir", default=os.path.join(root, "tests", "golden"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg, hp = CONFIG, HPARAMS
    B, T, steps = cfg["B"], cfg["T"], cfg["steps"]
    params = init_params(cfg, gen)
    names = [n for n, _ in param_shapes(cfg)]

    batches = 3  # K whole batches, then llm.c wraps to batch 0
    n_tokens = batches * B * T + 5  # the 4 tokens after the last whole batch are never used
    tokens = torch.randint(0, cfg["vocab"], (n_tokens,), generator=gen, dtype=torch.int64)
    assert (n_tokens - 1) // (B * T) == batches

    os.makedirs(args.out_dir, exist_ok=True)
    weights = [("transformer." + n, params[n]) for n in names]
    mask = torch.tril(torch.ones(cfg["max_seq"], cfg["max_seq"])).view(1, 1, cfg["max_seq"],
                                                                        cfg["max_seq"])
    for i in range(cfg["layers"]):
        weights.append((f"transformer.h.{i}.attn.bias", mask.to(torch.bool)))
        weights.append((f"transformer.h.{i}.attn.masked_bias", torch.tensor(-1e4)))
    weights.append(("lm_head.weight", params["wte.weight"]))
    write_safetensors(os.path.join(args.out_dir, f"train_gpt2_v{VERSION}.safetensors"), weights,
                      {"format": "pt"})
    write_llmc_tokens(os.path.join(args.out_dir, f"train_tokens_v{VERSION}.bin"),
                      [int(t) for t in tokens])

    order = [params[n] for n in names]
    opt = torch.optim.AdamW([{"params": [p for p in order if p.dim() == 2],
                              "weight_decay": hp["weight_decay"]},
                             {"params": [p for p in order if p.dim() != 2], "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    losses, norms = [], []
    for step in range(steps):
        k = step % batches
        window = tokens[k * B * T: k * B * T + B * T + 1]
        idx, tgt = window[:-1].view(B, T), window[1:].view(B, T)
        opt.zero_grad(set_to_none=True)
        loss = gpt_loss(params, cfg, idx, tgt)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(order, hp["grad_clip"])))
        opt.step()
        losses.append(float(loss))

    expected = [
        ("config", torch.tensor([cfg[k] for k in ("layers", "heads", "dim", "vocab", "max_seq",
                                                  "B", "T", "steps")], dtype=torch.int64)),
        ("hparams", torch.tensor([hp[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay",
                                                  "grad_clip")], dtype=torch.float64)),
        ("loss", torch.tensor(losses, dtype=torch.float64)),
        ("grad_norm", torch.tensor(norms, dtype=torch.float64)),
    ] + [("final." + n, params[n]) for n in names]
    write_safetensors(os.path.join(args.out_dir, f"train_expected_v{VERSION}.safetensors"),
                      expected, {"generator": "tools/make_train_golden.py",
                                 "torch": torch.__version__})
    print("losses   ", " ".join(f"{v:.6f}" for v in losses))
    print("grad norm", " ".join(f"{v:.4f}" for v in norms), "(clip at", hp["grad_clip"], ")")


if __name__ == "__main__":
    main()
