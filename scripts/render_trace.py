#!/usr/bin/env python3
"""Renders a fourway-train --trace file (Chrome trace events) to a PNG: one row per rank.

usage: /usr/bin/python3 scripts/render_trace.py TRACE.json OUT.png [--last-steps N]
Needs matplotlib (Debian: python3-matplotlib). F blue, B/BW green, W light green, p2p grey,
optimizer step and reductions red; white is idle time (the bubble).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def colour(name, cat):
    if cat == "p2p":
        return "#b0b0b0"
    if cat == "collective":
        return "#d62728"
    if name.startswith("BW") or name.startswith("B"):
        return "#2ca02c"
    if name.startswith("W"):
        return "#98df8a"
    return "#1f77b4"


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    last = 2
    if "--last-steps" in args:
        last = int(args[args.index("--last-steps") + 1])
    with open(args[0]) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ranks = sorted({e["tid"] for e in events})
    # keep the last `last` optimizer steps of rank 0's timeline (and everything after their start)
    opt = sorted(e["ts"] for e in events if e["cat"] == "collective" and e["tid"] == ranks[0])
    t0 = opt[-last - 1] + 1e-9 if len(opt) > last else min(e["ts"] for e in events)
    events = [e for e in events if e["ts"] >= t0]
    fig, ax = plt.subplots(figsize=(14, 0.6 * len(ranks) + 1.2))
    for e in events:
        y = ranks.index(e["tid"])
        ax.barh(y, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.8,
                color=colour(e["name"], e["cat"]), edgecolor="black", linewidth=0.2)
        if e["cat"] == "compute" and e["dur"] > 0:
            ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, y, e["name"].split(".")[0],
                    ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(args[0].split("/")[-1] + f": last {last} steps (F blue, B green, W light green, "
                 "p2p grey, optimizer red, white idle)")
    fig.tight_layout()
    fig.savefig(args[1], dpi=110)


if __name__ == "__main__":
    main()
