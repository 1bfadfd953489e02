#!/usr/bin/env python3
"""fourway-train --save writes config.json beside the weights, and Hugging Face transformers
loads a shape other than GPT-2 124M from them (issue 44, item 7): 3 blocks, width 96, 6 heads of
16 (width/64 would not even divide), vocabulary 100, context 24. GPT2LMHeadModel.from_pretrained
must load every tensor (no missing or unexpected key) and compute fourway's loss on the same
tokens within 1e-4 relative: a wrong head count or layout would change it.

Usage: transformers_loads_saved.py FOURWAY_TRAIN WORK_DIR
Exits 77 (ctest: skipped) when transformers or torch cannot be imported; .ci/run installs them
(a venv over Debian's python3-torch) and fails when this test is skipped.
"""
import json
import os
import struct
import subprocess
import sys

try:
    import torch
    from transformers import GPT2LMHeadModel
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: transformers is not importable here ({e})")
    sys.exit(77)

exe, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
L, C, H, V, T = 3, 96, 6, 100, 24

# an llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens
tokens = [(7 * i + 3) % V for i in range(T * 4 + 1)]
data = os.path.join(work, "tokens.bin")
with open(data, "wb") as f:
    header = [20240520, 1, len(tokens)] + [0] * 253
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))

weights = os.path.join(work, "model.safetensors")
common = ["--data", data, "--seq", str(T), "--batch", "1", "--quiet"]
subprocess.run([exe, "--layers", str(L), "--dim", str(C), "--heads", str(H), "--vocab", str(V),
                "--seed", "11", "--steps", "2", "--lr", "0.01", "--save", weights] + common,
               check=True, stdout=subprocess.DEVNULL)
config = json.load(open(os.path.join(work, "config.json")))
for key, want in {"n_layer": L, "n_embd": C, "n_head": H, "vocab_size": V,
                  "n_positions": T, "model_type": "gpt2"}.items():
    assert config[key] == want, f"config.json: {key} = {config[key]!r}, expected {want!r}"

# fourway's loss of the first batch with the saved weights (lr 0: the first step's loss)
log = os.path.join(work, "loss.jsonl")
subprocess.run([exe, "--init-from", weights, "--steps", "1", "--lr", "0", "--log-json", log]
               + common, check=True, stdout=subprocess.DEVNULL)
fourway_loss = json.loads(open(log).readline())["loss"]

model, info = GPT2LMHeadModel.from_pretrained(work, output_loading_info=True)
missing = [k for k in info["missing_keys"] if not k.endswith(("attn.bias", "attn.masked_bias"))]
assert not missing and not info["unexpected_keys"], f"loading info: {info}"
assert model.config.n_head == H and model.config.n_embd == C and model.config.n_layer == L
model.eval()
ids = torch.tensor([tokens[:T]])
targets = torch.tensor([tokens[1:T + 1]])
with torch.no_grad():
    logits = model(ids).logits
hf_loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1)).item()
rel = abs(hf_loss - fourway_loss) / abs(fourway_loss)
print(f"transformers {hf_loss:.7f}, fourway {fourway_loss:.7f}, relative difference {rel:.2e}")
sys.exit(0 if rel < 1e-4 else 1)
