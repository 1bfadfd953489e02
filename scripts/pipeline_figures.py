#!/usr/bin/env python3
"""p = 2 pipeline figures for docs/benchmarks/pipeline.md: per schedule, the measured idle
fraction per stage beside the schedule simulation's prediction (with the measured per-action
costs), and the step time. Each schedule runs REPS times, interleaved (gpipe, 1f1b, ..., gpipe,
...); min / median / max over the runs. Prints a markdown table.

usage: /usr/bin/python3 scripts/pipeline_figures.py [FOURWAY_TRAIN] [REPS]
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

train = sys.argv[1] if len(sys.argv) > 1 else "build/default/examples/train/fourway-train"
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
schedules = ["gpipe", "1f1b", "zb-h1", "interleaved", "zb-v"]
args = ["--layers", "4", "--dim", "256", "--heads", "8", "--seq", "64", "--batch", "16",
        "--micro-batches", "8", "--steps", "4", "--pp", "2", "--quiet"]
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
runs = {s: [] for s in schedules}
load_before = open("/proc/loadavg").read().strip()
for rep in range(reps):
    for s in schedules:
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as log:
            out = subprocess.run([train, *args, "--schedule", s, "--log-json", log.name],
                                 check=True, capture_output=True, text=True, env=env).stdout
            steps = [json.loads(line) for line in open(log.name)]
        idle = re.findall(r"stage (\d+): measured ([\d.]+), predicted ([\d.]+), "
                          r"replayed ([\d.]+)", out)
        runs[s].append({"idle": [(float(m), float(p), float(y)) for _, m, p, y in idle],
                        "step_ms": statistics.median(st["step_ms"] for st in steps[1:])})


def mmm(values, fmt):
    return "/".join(fmt % v for v in (min(values), statistics.median(values), max(values)))


print("load before: " + load_before)
print("| schedule | stage | measured idle (min/med/max) | predicted (min/med/max) | "
      "replayed (min/med/max) | largest gap in one run | step ms (min/med/max) |")
print("|---|---:|---|---|---|---|---|")
for s in schedules:
    for q in range(2):
        meas = [r["idle"][q][0] for r in runs[s]]
        pred = [r["idle"][q][1] for r in runs[s]]
        replay = [r["idle"][q][2] for r in runs[s]]
        gap = max(abs(m - p) for m, p in zip(meas, pred))
        step = mmm([r["step_ms"] for r in runs[s]], "%.0f") if q == 0 else ""
        print(f"| {s} | {q} | {mmm(meas, '%.3f')} | {mmm(pred, '%.3f')} | "
              f"{mmm(replay, '%.3f')} | {gap:.3f} | {step} |")
print("load after: " + open("/proc/loadavg").read().strip())
