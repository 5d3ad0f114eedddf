"""Per-step losses of two runs' metrics.jsonl (scripts/dev/gpu/*.sh):

    python3 scripts/dev/gpu/compare_losses.py LOG_DIR RUN BASELINE

Reads LOG_DIR/<RUN>_metrics.jsonl and LOG_DIR/<BASELINE>_metrics.jsonl and prints, over their common
steps, how many losses are equal and the largest and median relative difference to the baseline's.
"""
import json
import sys
from pathlib import Path


def losses(d: Path, run: str) -> list[float]:
    return [json.loads(line)["loss"] for line in (d / f"{run}_metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> int:
    d, run, base = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    a, b = losses(d, run), losses(d, base)
    n = min(len(a), len(b))
    if not n:
        print(f"losses, {run} against {base}: no common steps")
        return 0
    rel = sorted(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n]))
    same = sum(x == y for x, y in zip(a[:n], b[:n]))
    print(f"losses, {run} against {base}: {n} steps, {same} equal, max relative difference {rel[-1]:.3g}, "
          f"median {rel[n // 2]:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
