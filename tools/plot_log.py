#!/usr/bin/env python3
"""Plots fourway-train's --log-json: the training loss of every step and the validation loss of
the steps that evaluated (`val_loss`), as an SVG file, with the standard library only.

  python3 tools/plot_log.py run.jsonl curves.svg [--title TEXT]

Each line of the log is one step's JSON object (docs/train.md, "Output"). The y axis is the loss
in nats (a byte-level model's loss / ln 2 is bits per byte); the x axis the step. A text summary
(first/last/min of both curves) is printed too, so a terminal without an SVG viewer sees the run.
"""
import argparse
import json
import math
import sys


def read(path):
    steps, loss, val = [], [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            o = json.loads(line)
            if o.get("loss") is None:
                continue
            steps.append(o["step"])
            loss.append(o["loss"])
            if o.get("val_loss") is not None:
                val.append((o["step"], o["val_loss"]))
    return steps, loss, val


def svg(steps, loss, val, title):
    w, h, left, right, top, bottom = 720, 420, 64, 16, 36, 48
    x0, x1 = min(steps), max(steps)
    ys = loss + [v for _, v in val]
    y0, y1 = math.floor(min(ys) * 10) / 10, math.ceil(max(ys) * 10) / 10
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1

    def px(x):
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def py(y):
        return top + (y1 - y) / (y1 - y0) * (h - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for i in range(6):  # grid and labels
        y = y0 + (y1 - y0) * i / 5
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        x = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{px(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">'
                   f'{x:.0f}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">step</text>')
    out.append(f'<text x="14" y="{h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {h / 2})">loss (nats)</text>')
    pts = " ".join(f"{px(s):.1f},{py(l):.1f}" for s, l in zip(steps, loss))
    out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.2"/>')
    if val:
        pts = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in val)
        out.append(f'<polyline points="{pts}" fill="none" stroke="#d62728" stroke-width="2"/>')
        for s, v in val:
            out.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3" fill="#d62728"/>')
    out.append(f'<text x="{w - right - 150}" y="{top + 16}" fill="#1f77b4">training loss</text>')
    if val:
        out.append(f'<text x="{w - right - 150}" y="{top + 32}" fill="#d62728">'
                   f'validation loss</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--title", default="fourway-train")
    a = ap.parse_args()
    steps, loss, val = read(a.log)
    if not steps:
        sys.exit(f"plot_log: {a.log} has no step with a loss")
    with open(a.out, "w") as f:
        f.write(svg(steps, loss, val, a.title))
    print(f"plot_log: {len(steps)} steps: training loss {loss[0]:.4f} -> {loss[-1]:.4f} "
          f"(min {min(loss):.4f})", end="")
    if val:
        print(f"; validation loss {val[0][1]:.4f} (step {val[0][0]}) -> {val[-1][1]:.4f} "
              f"(step {val[-1][0]}), {len(val)} evaluations", end="")
    print(f"; wrote {a.out}")


if __name__ == "__main__":
    main()
