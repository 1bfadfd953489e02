#!/usr/bin/env python3
"""Tokens/s of the demo model on every mesh shape of the equivalence matrix, on LocalWorld threads,
with fourway-plan's estimate for the same mesh beside each.

    benchmarks/mesh/mesh_throughput.py [build-dir]      (ROUNDS=3 STEPS=10 by default)

Measured: fourway-train runs each mesh (the demo model: 4 layers, width 128, 8 heads, vocabulary
256, T 64, global batch 16, fp32, the built-in corpus) for STEPS steps with --log-json; a run's
figure is the median tokens/s of its steps after 2 warm-up steps. Every mesh runs once per round,
ROUNDS rounds in turn (interleaved), reported as min / median / max over the rounds.

Modelled: fourway-plan --footprint published for the same model and mesh, with a calibration of
this machine in place of a GPU: --tflops is the one-rank run's FLOP rate (the planner's FLOPs of
the one-rank step over its measured median time), shared by the mesh's ranks over the machine's
cores (each rank gets cores/ranks of it when ranks > cores), and the "links" are LocalWorld's
in-process copies, --nvlink-gbs LINK_GBS (default 4) with --nvlink-latency-us LINK_US (default 20)
on one "node". The ratio measured / modelled says how far the planner's model of compute, bubble
and communication carries to this host; it is not a GPU prediction.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "build", "default")
TRAIN = os.path.join(BUILD, "examples", "train", "fourway-train")
PLAN = os.path.join(BUILD, "examples", "plan", "fourway-plan")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
STEPS = int(os.environ.get("STEPS", "10"))
LINK_GBS = os.environ.get("LINK_GBS", "4")
LINK_US = os.environ.get("LINK_US", "20")
WARMUP = 2
MODEL = dict(layers=4, dim=128, heads=8, vocab=256, seq=64, batch=16)
CORES = os.cpu_count() or 1

# (name, tp, pp, dp, zero, schedule, micro-batches)
MESHES = [
    ("one rank", 1, 1, 1, 0, None, 1),
    ("dp8", 1, 1, 8, 0, None, 1),
    ("dp8 zero1", 1, 1, 8, 1, None, 1),
    ("dp8 zero2", 1, 1, 8, 2, None, 1),
    ("dp8 zero3", 1, 1, 8, 3, None, 1),
    ("tp2 dp4", 2, 1, 4, 0, None, 1),
    ("tp4 dp2", 4, 1, 2, 0, None, 1),
    ("tp8", 8, 1, 1, 0, None, 1),
    ("pp2 dp4 gpipe", 1, 2, 4, 0, "gpipe", 2),
    ("pp2 dp4 1f1b", 1, 2, 4, 0, "1f1b", 2),
    ("pp4 dp2 1f1b", 1, 4, 2, 0, "1f1b", 4),
    ("tp2 pp2 dp2 zero0", 2, 2, 2, 0, "1f1b", 4),
    ("tp2 pp2 dp2 zero1", 2, 2, 2, 1, "1f1b", 4),
    ("tp2 pp2 dp2 zero2", 2, 2, 2, 2, "1f1b", 4),
    ("tp2 pp2 dp2 zero3", 2, 2, 2, 3, "1f1b", 4),
    ("tp2 pp4", 2, 4, 1, 0, "1f1b", 4),
    ("tp4 pp2", 4, 2, 1, 0, "1f1b", 4),
    ("pp3", 1, 3, 1, 0, "1f1b", 4),
    ("tp2 pp3", 2, 3, 1, 0, "1f1b", 4),
    ("pp3 dp2", 1, 3, 2, 0, "1f1b", 4),
    ("pp2 dp4 zb-h1", 1, 2, 4, 0, "zb-h1", 2),
    ("tp2 pp2 dp2 zero1 interleaved", 2, 2, 2, 1, "interleaved", 4),
    ("tp2 pp2 dp2 zero3 zb-v", 2, 2, 2, 3, "zb-v", 4),
]


def train_args(tp, pp, dp, zero, schedule, m, log):
    a = [TRAIN, "--quiet", "--steps", str(STEPS), "--log-json", log]
    for k, v in MODEL.items():
        a += [f"--{k}", str(v)]
    a += ["--zero", str(zero), "--micro-batches", str(m)]
    if tp > 1:
        a += ["--tp", str(tp)]
    if pp > 1:
        a += ["--pp", str(pp), "--schedule", schedule]
    a += ["--dp", str(dp)] if tp > 1 or pp > 1 else ["--ranks", str(dp)]
    return a


def measure(mesh, tmp):
    _, tp, pp, dp, zero, schedule, m = mesh
    log = os.path.join(tmp, "run.jsonl")
    subprocess.run(train_args(tp, pp, dp, zero, schedule, m, log), check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return statistics.median(r["tokens_per_s"] for r in rows[WARMUP:])


def plan(tp, pp, dp, zero, schedule, m, tflops, ranks):
    b = MODEL["batch"] // (dp * m)
    a = [PLAN, "--json", "--footprint", "published", "--precision", "fp32",
         "--layers", str(MODEL["layers"]), "--hidden", str(MODEL["dim"]),
         "--heads", str(MODEL["heads"]), "--vocab", str(MODEL["vocab"]), "--seq", str(MODEL["seq"]),
         "--gpus", str(ranks), "--gpus-per-node", str(ranks), "--tp", str(tp), "--pp", str(pp),
         "--dp", str(dp), "--zero", str(zero), "--micro-batch", str(b), "--micro-batches", str(m),
         "--tflops", repr(tflops), "--nvlink-gbs", LINK_GBS, "--nvlink-latency-us", LINK_US]
    if schedule:  # interleaved: fourway-train's and fourway-plan's default v = 2
        a += ["--schedule", schedule]
    out = subprocess.run(a, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["time"]


def stats(v):
    return min(v), statistics.median(v), max(v)


def main():
    for exe in (TRAIN, PLAN):
        if not os.access(exe, os.X_OK):
            sys.exit(f"no {exe}: build fourway-train and fourway-plan first")
    runs = {mesh[0]: [] for mesh in MESHES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(ROUNDS):
            for mesh in MESHES:
                runs[mesh[0]].append(measure(mesh, tmp))
            print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
    # calibration: the planner's FLOPs of the one-rank step over its measured time
    one = stats(runs["one rank"])[1]
    t_at_1 = plan(1, 1, 1, 0, None, 1, 1.0, 1)["compute_s"]  # seconds at 1 TFLOP/s
    tokens = MODEL["batch"] * MODEL["seq"]
    tflops_one = t_at_1 / (tokens / one)
    print(f"machine: {CORES} cores; calibration: one rank computes {tflops_one * 1e3:.2f} "
          f"GFLOP/s (planner FLOPs / measured one-rank step); links {LINK_GBS} GB/s, "
          f"{LINK_US} us")
    print()
    print("| mesh | ranks | measured tokens/s (min / median / max) | modelled tokens/s | "
          "measured / modelled | modelled bubble |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, tp, pp, dp, zero, schedule, m in MESHES:
        ranks = tp * pp * dp
        share = min(1.0, CORES / ranks)
        t = plan(tp, pp, dp, zero, schedule, m, tflops_one * share, ranks)
        lo, med, hi = stats(runs[name])
        print(f"| {name} | {ranks} | {lo:.0f} / {med:.0f} / {hi:.0f} | {t['tokens_per_s']:.0f} | "
              f"{med / t['tokens_per_s']:.2f} | {t['bubble']:.2f} |")


if __name__ == "__main__":
    main()
