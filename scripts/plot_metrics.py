#!/usr/bin/env python3
"""Plot loss and throughput from one or more runs' metrics.jsonl.

    python3 scripts/plot_metrics.py RUN_OR_METRICS [RUN_OR_METRICS ...] [--out plot.png]
        [--out-dir DIR] [--labels a,b] [--smooth 20] [--title TEXT]

With one run directory and neither --out nor --out-dir, writes loss.png and
throughput.png into that run directory. --out writes the two panels side by
side in one PNG; --out-dir writes loss.png and throughput.png there.

Each argument is a run directory (its metrics.jsonl is read) or a
metrics.jsonl file. The figure has two panels: loss (raw, faint, and an
exponential moving average with span --smooth) and samples/s. For each run it
prints the throughput table of docs/benchmarks.md (samples/s over steps 2..N,
the first step's decoding excluded; median step time and data wait; median
MFU), and with two runs the largest relative difference of the smoothed losses
and the throughput ratio of the first run to the second.
"""
import argparse
import json
import sys
from pathlib import Path


def read(path: Path):
    f = path / "metrics.jsonl" if path.is_dir() else path
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    if not rows:
        sys.exit(f"plot_metrics: {f} has no records")
    return rows


def ema(values, span):
    alpha = 2.0 / (span + 1.0)
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="one PNG with both panels")
    ap.add_argument("--out-dir", type=Path, help="loss.png and throughput.png in this directory")
    ap.add_argument("--labels", default="")
    ap.add_argument("--smooth", type=int, default=20)
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    if args.out is None and args.out_dir is None:
        if len(args.runs) != 1 or not args.runs[0].is_dir():
            ap.error("give --out or --out-dir (the default, loss.png and throughput.png in the run, needs one run directory)")
        args.out_dir = args.runs[0]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.labels.split(",") if args.labels else [str(r) for r in args.runs]
    data = [read(r) for r in args.runs]
    if args.out:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        figs = [(fig, args.out)]
    else:
        f1, ax1 = plt.subplots(figsize=(7, 4.5))
        f2, ax2 = plt.subplots(figsize=(7, 4.5))
        figs = [(f1, args.out_dir / "loss.png"), (f2, args.out_dir / "throughput.png")]
    smoothed = []
    for rows, label in zip(data, labels):
        steps = [r["step"] for r in rows]
        loss = [r["loss"] for r in rows]
        s = ema(loss, args.smooth)
        smoothed.append(s)
        line, = ax1.plot(steps, s, label=f"{label} (EMA {args.smooth})")
        ax1.plot(steps, loss, alpha=0.2, color=line.get_color())
        ax2.plot(steps, [r["samples_per_s"] for r in rows], label=label, color=line.get_color())
    ax1.set_xlabel("step"), ax1.set_ylabel("loss"), ax1.legend(), ax1.grid(alpha=0.3)
    ax2.set_xlabel("step"), ax2.set_ylabel("samples/s"), ax2.legend(), ax2.grid(alpha=0.3)
    for fig, out in figs:
        if args.title:
            fig.suptitle(args.title)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        print(f"wrote {out}")
    sps = []
    for rows, label in zip(data, labels):
        rest = rows[1:] or rows
        batch = [r["samples_per_s"] * r["step_ms"] / 1000.0 for r in rest]  # samples in each step
        rate = sum(batch) / (sum(r["step_ms"] for r in rest) / 1000.0)
        sps.append(rate)
        med = lambda key: sorted(r.get(key, 0.0) for r in rest)[len(rest) // 2]  # noqa: E731
        print(f"{label}: {rate:.1f} samples/s (steps {rest[0]['step']}-{rest[-1]['step']}), median step "
              f"{med('step_ms'):.1f} ms, median data wait {med('data_wait_ms'):.2f} ms, median MFU {med('mfu'):.4f}")
    if len(smoothed) == 2:
        print(f"throughput ratio {labels[0]} / {labels[1]}: {sps[0] / sps[1]:.2f}x")
        n = min(len(smoothed[0]), len(smoothed[1]))
        rel = [abs(a - b) / abs(b) for a, b in zip(smoothed[0][:n], smoothed[1][:n])]
        worst = max(range(n), key=lambda i: rel[i])
        print(f"smoothed-loss max relative difference {rel[worst]:.4%} at step {data[0][worst]['step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
