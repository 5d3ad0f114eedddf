"""Data wait while checkpoints are written (issue #12's target: <= 1% of step time), from one
loongforge-train run's log and metrics (scripts/dev/gpu/issue11_step.sh, run lf-graphs-adfe-ckpt).

    python3 scripts/dev/gpu/ckpt_data_wait.py LOG_DIR RUN [--baseline RUN]

Reads LOG_DIR/RUN.log for the writes ("checkpoint <dir>/epoch_E_step_S: X MB in Y s", logged at the
first step boundary after the write ended) and LOG_DIR/RUN_metrics.jsonl (one record per step). A
write submitted after step S overlaps the steps after S until their summed wall time (step_ms +
checkpoint_stall_ms) reaches its Y seconds; a write the run ended before (killed after its last step)
overlaps every step after S. Prints, for the steps inside writes and for those outside (after step
50), the steps, the summed step time, the summed data wait and its share of step time, and the
median data wait, and the median step time (step_ms: a step's own time, not the stall of a write's
staging); the same for --baseline (a run without checkpoints), steps after 50.
"""
import argparse
import json
import re
import statistics
from pathlib import Path

WRITE = re.compile(r"checkpoint \S*epoch_\d+_step_(\d+): ([\d.e+]+) MB in ([\d.e+]+) s")


def records(log_dir: Path, run: str):
    f = log_dir / f"{run}_metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def writes(log_dir: Path, run: str):
    """[(step, MB, seconds or None)] in submission order: the interval's steps from the config log
    line are not needed, the log names each finished write; a submitted but unfinished one is found
    from the metrics (checkpoint_stall_ms > 0 marks the step that submitted a snapshot)."""
    done = {}
    for line in (log_dir / f"{run}.log").read_text(errors="replace").splitlines():
        m = WRITE.search(line)
        if m:
            done[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return done


def share(recs):
    wall = sum(r["step_ms"] + r.get("checkpoint_stall_ms", 0.0) for r in recs)
    wait = sum(r["data_wait_ms"] for r in recs)
    med = statistics.median(r["data_wait_ms"] for r in recs) if recs else 0.0
    step = statistics.median(r["step_ms"] for r in recs) if recs else 0.0
    return len(recs), wall, wait, (wait / wall if wall else 0.0), med, step


def row(name, recs):
    n, wall, wait, frac, med, step = share(recs)
    print(f"{name:34s} {n:6d} {wall / 1000:9.2f} {wait:10.1f} {frac * 100:7.2f}% {med:9.2f} {step:9.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log_dir")
    ap.add_argument("run")
    ap.add_argument("--baseline", default="")
    ap.add_argument("--submitted", type=int, nargs="*", default=None,
                    help="steps that submitted a write (default: those with checkpoint_stall_ms > 0)")
    args = ap.parse_args()
    d = Path(args.log_dir)
    recs = records(d, args.run)
    by_step = {r["step"]: r for r in recs}
    done = writes(d, args.run)
    submitted = args.submitted if args.submitted is not None else sorted(
        r["step"] for r in recs if r.get("checkpoint_stall_ms", 0.0) > 0 and r["step"] != recs[-1]["step"])
    inside = set()
    for s in submitted:
        seconds = done.get(s, (0.0, None))[1]
        t, step = 0.0, s + 1
        while step in by_step and (seconds is None or t < seconds * 1000):
            inside.add(step)
            t += by_step[step]["step_ms"] + by_step[step].get("checkpoint_stall_ms", 0.0)
            step += 1
    for s in submitted:
        mb, sec = done.get(s, (None, None))
        print(f"write after step {s}: " + (f"{mb:.1f} MB in {sec:.1f} s" if sec is not None else "not finished by the end"))
    print(f"{'steps':34s} {'n':>6s} {'wall s':>9s} {'wait ms':>10s} {'share':>8s} {'median ms':>9s} {'step ms':>9s}")
    row(f"{args.run}: inside a write", [r for r in recs if r["step"] in inside])
    row(f"{args.run}: outside (after step 50)", [r for r in recs if r["step"] > 50 and r["step"] not in inside])
    if args.baseline:
        row(f"{args.baseline} (after step 50)", [r for r in records(d, args.baseline) if r["step"] > 50])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
