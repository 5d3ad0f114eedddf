"""Steady-state table of trainer runs from their metrics.jsonl files (scripts/dev/gpu/*.sh).

    python3 scripts/dev/gpu/steady_state.py OUT_DIR RUN [RUN ...] [--skip-steps RUN:A-B ...]

Reads OUT_DIR/<RUN>_metrics.jsonl (one record per step, both trainers write the
same keys), keeps steps after 50 (warm-up, graph capture, compilation) and prints
per run the median samples/s, ms/step, MFU and data wait, the peak device memory
and the number of steps used, then every ratio of an lf-* run to each other run.
--skip-steps leaves out a step range of one run (e.g. around a profile-step,
whose per-phase synchronisation slows the steps it profiles). Missing runs are
named and left out.
"""
import argparse
import json
import statistics
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--skip-steps", nargs="*", default=[], help="RUN:A-B")
    args = ap.parse_args()
    skip = {}
    for s in args.skip_steps:
        run, _, span = s.partition(":")
        a, _, b = span.partition("-")
        skip[run] = (int(a), int(b))
    rows = {}
    for name in args.runs:
        f = Path(args.out) / f"{name}_metrics.jsonl"
        if not f.exists():
            print(f"{name}: no metrics")
            continue
        recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        lo, hi = skip.get(name, (0, -1))
        tail = [r for r in recs if r["step"] > 50 and not lo <= r["step"] <= hi]
        if not tail:
            print(f"{name}: fewer than 51 steps")
            continue
        rows[name] = (statistics.median(r["samples_per_s"] for r in tail), statistics.median(r["step_ms"] for r in tail),
                      statistics.median(r["mfu"] for r in tail), max(r.get("peak_mem_mb", 0) for r in recs), len(tail),
                      statistics.median(r["data_wait_ms"] for r in tail))
    print(f"{'run':18s} {'samples/s':>10s} {'ms/step':>8s} {'MFU':>6s} {'data ms':>8s} {'peak MB':>8s}")
    for name, (sps, ms, mfu, peak, n, dw) in rows.items():
        print(f"{name:18s} {sps:10.1f} {ms:8.1f} {mfu * 100:5.1f}% {dw:8.1f} {peak:8.0f}  ({n} steps)")
    for a in rows:
        for b in rows:
            if a.startswith("lf") and b != a:
                print(f"{a} / {b} = {rows[a][0] / rows[b][0]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
