#!/usr/bin/env python3
"""Writes tests/golden/sample_greedy_v1.txt: the tokens Hugging Face `transformers`' `generate`
gives by greedy decoding from the weights of fourway-train's golden run, the reference of
fourway's KV-cache sampler (layers/generate.hpp; docs/train.md, "Samples").

The weights are the final weights of that run (`final.<name>` of
tests/golden/train_expected_v1.safetensors, 8 AdamW steps from train_gpt2_v1.safetensors: a
model whose next-token distributions are no longer flat, so greedy choices are not near ties),
loaded into `GPT2LMHeadModel` (config: 2 layers, 4 heads, width 32, vocabulary 64, context 16).
For each prompt, `generate(do_sample=False)` runs to the full context; the file records the
prompt, the new tokens and the smallest gap between the chosen logit and the runner-up over the
steps (how far from a tie the reference is).

Run with a Python that has torch and transformers (CI's /opt/fourway-hf-venv/bin/python):
  python tools/make_sample_golden.py
"""
import json
import os
import struct
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "tests", "golden")
PROMPTS = [[49, 50, 51], [7], [33, 60, 2, 40, 41]]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] != "F32":
            continue
        lo, hi = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.float32)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def main():
    final = read_safetensors(os.path.join(GOLDEN, "train_expected_v1.safetensors"))
    weights = {k[len("final."):]: v for k, v in final.items() if k.startswith("final.")}
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64, n_positions=16,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).eval()
    state = {("transformer." + k): v for k, v in weights.items()}
    state["lm_head.weight"] = weights["wte.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(m.endswith("attn.bias") or m.endswith("attn.masked_bias") for m in missing), missing
    lines = ["# greedy decoding of transformers " + __import__("transformers").__version__ +
             " from the final weights of tests/golden/train_expected_v1.safetensors "
             "(tools/make_sample_golden.py)"]
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=cfg.n_positions - len(prompt),
                                 do_sample=False, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True)
            new = out.sequences[0, len(prompt):].tolist()
            gap = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores)
            lines.append("prompt " + " ".join(map(str, prompt)) + " : " +
                         " ".join(map(str, new)) + f" : min_gap {gap:.6f}")
    path = os.path.join(GOLDEN, "sample_greedy_v1.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(open(path).read())


if __name__ == "__main__":
    sys.exit(main())
