#!/usr/bin/env python3
"""Per-epoch curves of several `tapestry train` logs in one SVG chart, to compare runs side by side.

    tools/epoch-curves.py OUT.svg "18 epochs=runs/a.log" "planned to 15=runs/b.log" [--metric "val BLEU"] [--first 6]

Reads the epoch lines a run prints (`epoch 3: train loss 3.652, val loss 3.342, val BLEU 22.39
(greedy), ...`) and draws the named metric against the epoch, one line per log. Standard library only.
"""
import argparse
import re
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def read_curve(path, metric):
    pattern = re.compile(r"^epoch (\d+): .*?\b" + re.escape(metric) + r" (-?[0-9.]+)")
    points = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = pattern.match(line)
            if m:
                points.append((int(m.group(1)), float(m.group(2))))
    if not points:
        sys.exit(f"epoch-curves: no '{metric}' on any epoch line of {path}")
    return points


def chart(series, metric, title):
    right = max(190, 50 + 7 * max(len(name) for name, _ in series))  # room for the legend
    w, h, left, top, bottom = 530 + right, 400, 60, 40, 50
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    if not xs:
        sys.exit("epoch-curves: no epoch from --first on in any log")
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    px = lambda x: left + (x - x0) / max(x1 - x0, 1) * (w - left - right)
    py = lambda y: top + (y1 - y) / (y1 - y0) * (h - top - bottom)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for i in range(6):  # horizontal grid and the metric's ticks
        y = y0 + (y1 - y0) * i / 5
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{w - right}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for x in range(x0, x1 + 1):
        out.append(f'<text x="{px(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">epoch</text>')
    out.append(f'<text x="16" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + h - bottom) / 2})">{metric}</text>')
    for i, (name, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>')
        ly = top + 10 + 20 * i
        out.append(f'<line x1="{w - right + 12}" y1="{ly}" x2="{w - right + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 38}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the SVG file to write")
    p.add_argument("runs", nargs="+", help="NAME=LOG: a legend name and a train log")
    p.add_argument("--metric", default="val BLEU", help="the epoch line's metric to draw (default: val BLEU)")
    p.add_argument("--first", type=int, default=1, help="the first epoch drawn (default: 1)")
    p.add_argument("--title", default="", help="the chart's title (default: the metric per epoch)")
    a = p.parse_args()
    series = []
    for run in a.runs:
        if "=" not in run:
            sys.exit(f"epoch-curves: '{run}' is not NAME=LOG")
        name, path = run.split("=", 1)
        try:
            series.append((name, [pt for pt in read_curve(path, a.metric) if pt[0] >= a.first]))
        except OSError as e:
            sys.exit(f"epoch-curves: cannot read {path}: {e.strerror}")
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(chart(series, a.metric, a.title or f"{a.metric} per epoch"))


if __name__ == "__main__":
    main()
