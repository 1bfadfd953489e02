#!/usr/bin/env python3
"""fourway-train step time with the block cache on vs off (docs/memory.md), interleaved rounds.

usage: /usr/bin/python3 scripts/block_cache_figures.py [ROUNDS]   (from the repository root, after
building build/default; prints min/median/max of each side and the ratio of medians)"""
import json, statistics, subprocess, sys, tempfile, os

exe = "build/default/examples/train/fourway-train"
shapes = {
  "1 rank, 4x256, V 4096, T 128, B 8": ["--layers","4","--dim","256","--heads","8","--vocab","4096","--seq","128","--batch","8"],
  "2 ranks ZeRO-3, same shape": ["--layers","4","--dim","256","--heads","8","--vocab","4096","--seq","128","--batch","8","--ranks","2","--zero","3"],
}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
os.environ["OPENBLAS_NUM_THREADS"] = "1"
for name, args in shapes.items():
    res = {"on": [], "off": []}
    for r in range(rounds):
        for side in (["on","off"] if r % 2 == 0 else ["off","on"]):
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as log:
                subprocess.run([exe, *args, "--steps", "8", "--quiet", "--block-cache", side, "--log-json", log.name], check=True, capture_output=True)
                steps = [json.loads(l) for l in open(log.name)]
                res[side].append(statistics.median(s["step_ms"] for s in steps[2:]))
    on, off = sorted(res["on"]), sorted(res["off"])
    print(f"{name}: cache on {on[0]:.0f}/{statistics.median(on):.0f}/{on[-1]:.0f} ms, off {off[0]:.0f}/{statistics.median(off):.0f}/{off[-1]:.0f} ms, on/off {statistics.median(on)/statistics.median(off):.3f}")
