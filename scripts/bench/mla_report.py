"""Issue #47's allocator comparison: what scripts/bench/mla_compare.sh's runs measured, and its table.

    python3 scripts/bench/mla_report.py run DIR --steps N --warmup W --limit-s S [--rc RC] [--stopped HOW]
    python3 scripts/bench/mla_report.py outcome DIR
    python3 scripts/bench/mla_report.py report STATE --ladder MODEL=MB,MB,... [--ladder ...] --allocators A,B,C
                                         --out DIR [--bitwise-steps N]

A run's folder DIR (one loongforge-train run, written by mla_compare.sh): train.log (stdout and stderr),
run/metrics.jsonl (one record per step), smi.csv (nvidia-smi's memory.used in MiB, one sample per
0.5 s, the first taken before the trainer started). `run` reads them, writes DIR/result.json and prints
one line; `outcome` prints the outcome of DIR/result.json (nothing when there is none); `report` reads
STATE/runs/MODEL/ALLOCATOR-mbN/result.json and STATE/bitwise/{caching,mla}/ and writes OUT/mla_compare.json
and OUT/mla_compare.md (also printed).

Note [Outcomes]
A run's outcome is one of
- ok: it finished the steps asked for (mla_compare.sh stops it after the last step's record, before
  its final checkpoint);
- oom: it exited on its own, non-zero, and the end of its log (the last LOG_TAIL_LINES lines, where the
  trainer's failure message stands) says the device ran out of memory (OOM_PATTERN:
  libtorch's and MLA's messages, the trainer's "out of memory" failure, cuBLAS / cuDNN allocation
  failures);
- failed: anything else that ended it early: another error, a signal from outside (137: perhaps the
  host's OOM killer, not the device's), or a failure in a step after which the trainer was writing its
  failure checkpoint (it logs the cause only after that write, so mla_compare.sh stops it there and the
  cause is unknown: never counted as out of memory);
- timeout: it did not finish within its own time limit (the script's RUN_LIMIT);
- cut: it was stopped because the call's time (LIMIT) ran out: no result; a later call runs it again.
Only ok counts as training; only oom counts as out of memory.

Note [What the numbers are]
- samples/s: the median of the per-step samples_per_s of the steps after the warm-up (steps > W: the
  eager micro-batches, the CUDA graph captures and the optimizer graph's are in the first 5 steps);
  none with fewer than 3 such steps.
- peak used GiB: the largest nvidia-smi memory.used sample of the run (the whole GPU: the allocator's
  reservations, the CUDA context, cuBLAS workspaces; 0.5 s samples, so a shorter peak can be missed).
- peak allocated GiB: the trainer's peak_mem_mb (the caching allocator's peak allocated bytes; MLA's
  peak bytes in use), over all steps.
- MLA's fields, from metrics.jsonl (src/engines/mla/device_allocator.cpp, scalars()):
  mla_cuda_malloc_after_step_1 (cumulative: the last record's), mla_fragmentation (1 - largest free
  block / free bytes over the pools: the largest value after the warm-up, and the last), mla_alloc_ms
  (the time spent in the allocator during that step: p50 and p99 by nearest rank over the steps after the
  warm-up, so with 7 steps p99 is their largest), mla_reserved_mb (largest), mla_persistent_mb /
  mla_activation_mb / mla_other_mb (in use by category at the last step).
A figure that was not measured is None in the JSON and "not measured" in the table; nothing is estimated.
"""
import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (the headline report: its metrics.jsonl reader and number format)
from report import load_jsonl  # noqa: E402

ALLOCATORS = ("caching", "expandable", "mla")
ALLOCATOR_NAMES = {"caching": "PyTorch caching allocator",
                   "expandable": "caching allocator, expandable_segments:True",
                   "mla": "MLA (mla.enable=true)"}
FINAL_OUTCOMES = ("ok", "oom", "failed", "timeout")  # "cut" is no result: run again
OOM_PATTERN = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|"
                         r"cudaErrorMemoryAllocation", re.IGNORECASE)
ERROR_PATTERN = re.compile(r"\[error\]|error:|Error|FAILED|Traceback|terminate called|Segmentation fault")
CAPTURE_FAILED = re.compile(r"as a CUDA graph failed")
TARGET_FRAGMENTATION = 0.03
TARGET_ALLOC_MS = 0.05
MIN_WINDOW_STEPS = 3
LOG_TAIL_LINES = 80  # where classify looks for the failure's message


# ------------------------------------------------------------------------------------------- reading

def read_records(path: Path) -> List[dict]:
    """The per-step records of a metrics.jsonl (events and lines cut short by a kill are left out)."""
    return [r for r in load_jsonl(path)
            if isinstance(r, dict) and "step" in r and "loss" in r and "samples_per_s" in r]


def read_smi_mib(path: Path) -> List[float]:
    """nvidia-smi memory.used samples (MiB), in order; lines that are no number are left out."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(float(line.strip().split(",")[0]))
            except ValueError:
                continue
    return out


def first_line(pattern: re.Pattern, text: str, last: bool = False) -> Optional[str]:
    hits = [ln.strip() for ln in text.splitlines() if pattern.search(ln)]
    if not hits:
        return None
    return (hits[-1] if last else hits[0])[:400]


# ------------------------------------------------------------------------------------------- one run

def classify(steps_done: int, steps_wanted: int, rc: Optional[int], stopped: str, log: str, limit_s: float):
    """(outcome, reason) of one run (Note [Outcomes]). rc: the exit status when the trainer exited on its
    own, None when the script stopped it; stopped: "" or after_last_step, failure_checkpoint, time_limit,
    call_limit."""
    if steps_done >= steps_wanted:
        return "ok", None
    if stopped == "call_limit":
        return "cut", f"stopped at step {steps_done} of {steps_wanted}: the call's time ran out (run it again)"
    if stopped == "time_limit":
        return "timeout", f"{steps_done} of {steps_wanted} steps within its {limit_s:.0f} s"
    if stopped == "failure_checkpoint":
        return "failed", (f"failed after {steps_done} steps and was writing its failure checkpoint when stopped; "
                          "the trainer logs the cause after that write (not counted as out of memory)")
    if rc is None:
        return "failed", f"stopped at step {steps_done} of {steps_wanted} ({stopped or 'no reason recorded'})"
    tail = "\n".join(log.splitlines()[-LOG_TAIL_LINES:])  # the failure's own message is at the end
    if rc != 0 and OOM_PATTERN.search(tail):
        reason = first_line(OOM_PATTERN, tail)
        memory = first_line(re.compile(r"^Memory: "), tail)
        return "oom", reason + (" " + memory if memory else "")
    if rc > 128:
        return "failed", f"killed by signal {rc - 128} after {steps_done} steps (not by this script)"
    if rc != 0:
        error = first_line(ERROR_PATTERN, tail, last=True) or "no error line"
        return "failed", f"exit {rc} after {steps_done} steps: {error}"
    return "failed", f"exit 0 after {steps_done} of {steps_wanted} steps"


def nearest_rank(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


def summarize(records: List[dict], smi_mib: List[float], warmup: int) -> dict:
    """The measured figures of one run (Note [What the numbers are]); None where not measured."""
    window = [r for r in records if r["step"] > warmup]
    enough = len(window) >= MIN_WINDOW_STEPS
    peak_alloc = [r["peak_mem_mb"] for r in records if "peak_mem_mb" in r]
    s = {"steps": len(records), "window_steps": len(window),
         "window": [window[0]["step"], window[-1]["step"]] if window else None,
         "samples_per_s": statistics.median(r["samples_per_s"] for r in window) if enough else None,
         "step_ms": statistics.median(r["step_ms"] for r in window) if enough and "step_ms" in window[0] else None,
         "peak_allocated_gib": max(peak_alloc) / 1024 if peak_alloc else None,
         "peak_used_gib": max(smi_mib) / 1024 if smi_mib else None,
         "idle_used_gib": smi_mib[0] / 1024 if smi_mib else None,
         "mla": None}
    mla = [r for r in records if "mla_reserved_mb" in r]
    if mla:
        mla_window = [r for r in mla if r["step"] > warmup]
        alloc_ms = [r["mla_alloc_ms"] for r in mla_window]
        last = mla[-1]
        s["mla"] = {"cuda_malloc_after_step_1": last["mla_cuda_malloc_after_step_1"],
                    "fragmentation_max": max(r["mla_fragmentation"] for r in mla_window) if mla_window else None,
                    "fragmentation_last": last["mla_fragmentation"],
                    "alloc_ms_p50": nearest_rank(alloc_ms, 0.5) if len(alloc_ms) >= MIN_WINDOW_STEPS else None,
                    "alloc_ms_p99": nearest_rank(alloc_ms, 0.99) if len(alloc_ms) >= MIN_WINDOW_STEPS else None,
                    "reserved_gib_max": max(r["mla_reserved_mb"] for r in mla) / 1024,
                    "persistent_mb": last["mla_persistent_mb"], "activation_mb": last["mla_activation_mb"],
                    "other_mb": last["mla_other_mb"]}
    return s


def result_of_run(d: Path, steps: int, warmup: int, limit_s: float, rc: Optional[int], stopped: str) -> dict:
    log = (d / "train.log").read_text(errors="replace") if (d / "train.log").exists() else ""
    records = read_records(d / "run" / "metrics.jsonl")
    outcome, reason = classify(len(records), steps, rc, stopped, log, limit_s)
    res = {"outcome": outcome, "reason": reason, "steps_wanted": steps, "rc": rc, "stopped": stopped or None,
           "graph_capture_failed": first_line(CAPTURE_FAILED, log)}
    res.update(summarize(records, read_smi_mib(d / "smi.csv"), warmup))
    return res


def outcome_of(d: Path) -> Optional[str]:
    f = d / "result.json"
    return json.loads(f.read_text())["outcome"] if f.exists() else None


# ------------------------------------------------------------------------------------------- decisions

def ladder_decision(ladder: Sequence[int], results: Dict[int, dict]) -> dict:
    """The largest micro-batch that trained: the first ok rung from the top, once every rung above it has
    a final outcome. results: {micro-batch: result}. Returns largest (None if not settled or none
    trained), settled, rungs [(micro-batch, outcome or "not run")], note."""
    rungs, largest, note = [], None, None
    for mb in sorted(ladder, reverse=True):
        r = results.get(mb)
        outcome = r["outcome"] if r and r["outcome"] in FINAL_OUTCOMES else "not run"
        if outcome == "not run" and largest is not None:
            outcome = "not needed"  # below the largest that trained
        rungs.append((mb, outcome))
        if largest is None and note is None:
            if outcome == "ok":
                largest = mb
            elif outcome == "not run":
                note = f"not settled: micro-batch {mb} has no result yet (not run, or cut by the call's time)"
    if largest is None and note is None:
        note = ("no micro-batch of the ladder trained: add smaller ones to MB_LADDER"
                if all(o == "oom" for _, o in rungs) else
                "no micro-batch of the ladder trained, not all for lack of memory (see the ladder and the notes)")
    if largest is not None and any(o in ("failed", "timeout") for mb, o in rungs if mb > largest):
        note = "a larger micro-batch failed otherwise than out of memory (see the ladder)"
    return {"largest": largest, "settled": largest is not None or note.startswith("no micro-batch"),
            "rungs": rungs, "note": note}


def bitwise_verdict(caching: List[dict], mla: List[dict], steps: int) -> dict:
    """Per-step losses (and gradient norms) of the caching allocator's run against MLA's, compared exactly."""
    n = min(len(caching), len(mla))
    if n < steps:
        return {"verdict": "incomplete", "steps_compared": n, "steps_wanted": steps}
    pairs = list(zip(caching[:steps], mla[:steps]))
    equal_losses = sum(a["loss"] == b["loss"] for a, b in pairs)
    equal_norms = sum(a.get("grad_norm") == b.get("grad_norm") for a, b in pairs)
    first = next(({"step": a["step"], "caching": a["loss"], "mla": b["loss"]}
                  for a, b in pairs if a["loss"] != b["loss"]), None)
    return {"verdict": "equal" if equal_losses == steps else "differ", "steps_compared": steps,
            "steps_wanted": steps, "losses_equal": equal_losses, "grad_norms_equal": equal_norms,
            "first_difference": first}


# ------------------------------------------------------------------------------------------- the report

def fmt(v, spec: str = ".1f", none: str = "not measured") -> str:
    return report.fmt(v, spec, none)


def bitwise_text(b: Optional[dict]) -> str:
    if b is None:
        return "not run"
    if b["verdict"] == "equal":
        return f"equal: {b['losses_equal']} of {b['steps_wanted']} losses (grad norms {b['grad_norms_equal']})"
    if b["verdict"] == "differ":
        d = b["first_difference"]
        return (f"DIFFER: {b['losses_equal']} of {b['steps_wanted']} losses equal, first at step {d['step']} "
                f"({d['caching']!r} vs {d['mla']!r})")
    return b.get("why") or f"incomplete: {b['steps_compared']} of {b['steps_wanted']} steps"


def row(model: str, alloc: str, decision: dict, best: Optional[dict], bitwise: str) -> List[str]:
    ladder = ", ".join(f"{mb} {o}" for mb, o in decision["rungs"])
    if decision["largest"] is None:
        cells = [decision["note"]] + ["not measured"] * 4
        mla_cells = ["not measured"] * 3 if alloc == "mla" else ["n/a"] * 3
    else:
        cells = [str(decision["largest"]) + (" *" if decision["note"] else ""), fmt(best["samples_per_s"]),
                 fmt(best["peak_used_gib"]), fmt(best["peak_allocated_gib"]),
                 f"{best['window'][0]}-{best['window'][1]}" if best["window"] else "none"]
        m = best["mla"]
        if alloc != "mla":
            mla_cells = ["n/a"] * 3
        elif m is None:
            mla_cells = ["not measured"] * 3
        else:
            mla_cells = [fmt(m["cuda_malloc_after_step_1"], ".0f"), fmt(m["fragmentation_max"], ".4f"),
                         f"{fmt(m['alloc_ms_p50'], '.4f')} / {fmt(m['alloc_ms_p99'], '.4f')}"]
    return [model, alloc] + cells + mla_cells + [bitwise, ladder]


HEADER = ["model", "allocator", "largest micro-batch", "samples/s (median)", "peak used GiB (nvidia-smi)",
          "peak allocated GiB (trainer)", "steps in the median", "cudaMalloc after step 1", "fragmentation (max)",
          "alloc ms p50 / p99", "losses vs caching (bitwise run)", "ladder (largest first)"]


def verdicts(model: str, rows: Dict[str, dict]) -> List[str]:
    """Sentences on issue #47's targets for one model, from measured figures only."""
    out = []
    m = rows.get("mla")
    others = {a: r for a, r in rows.items() if a != "mla" and r["decision"]["largest"] is not None}
    if m is None or m["decision"]["largest"] is None or not others or len(others) < len(rows) - 1:
        return [f"{model}: the comparison is not complete (each allocator's largest micro-batch is needed)."]
    best_mb = max(r["decision"]["largest"] for r in others.values())
    mla_mb = m["decision"]["largest"]
    word = "larger than" if mla_mb > best_mb else "the same as" if mla_mb == best_mb else "SMALLER than"
    out.append(f"{model}: MLA's largest micro-batch {mla_mb} is {word} the best of the other two ({best_mb}).")
    rates = {a: r["best"]["samples_per_s"] for a, r in others.items() if r["best"]["samples_per_s"] is not None}
    mla_rate = m["best"]["samples_per_s"]
    if rates and mla_rate is not None:
        a = max(rates, key=rates.get)
        ratio = mla_rate / rates[a]
        out.append(f"{model}: samples/s at each one's largest micro-batch: MLA {mla_rate:.1f} against {rates[a]:.1f} "
                   f"({a}, micro-batch {others[a]['decision']['largest']}): {ratio:.3f}x "
                   f"({'matches or beats' if ratio >= 1 else 'BELOW'} the best).")
    f = m["best"]["mla"]
    if f:
        def met(ok):
            return "met" if ok else "NOT met"
        malloc, frag, p99 = f["cuda_malloc_after_step_1"], f["fragmentation_max"], f["alloc_ms_p99"]
        text = f"{model}: MLA at micro-batch {mla_mb}: cudaMalloc after step 1 {malloc:.0f} (target 0: {met(malloc == 0)})"
        if frag is not None:
            text += f"; fragmentation at most {frag:.4f} (target <= {TARGET_FRAGMENTATION}: {met(frag <= TARGET_FRAGMENTATION)})"
        if p99 is not None:
            text += f"; allocation ms per step p99 {p99:.4f} (target <= {TARGET_ALLOC_MS}: {met(p99 <= TARGET_ALLOC_MS)})"
        out.append(text + ".")
    return out


def build_report(state: Path, ladders: Dict[str, List[int]], allocators: Sequence[str], bitwise_steps: int) -> dict:
    bitwise_runs = {a: state / "bitwise" / a for a in ("caching", "mla")}
    bw_results = {a: json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else None
                  for a, d in bitwise_runs.items()}
    if all(r is not None and r["outcome"] == "ok" for r in bw_results.values()):
        bitwise = bitwise_verdict(read_records(bitwise_runs["caching"] / "run" / "metrics.jsonl"),
                                  read_records(bitwise_runs["mla"] / "run" / "metrics.jsonl"), bitwise_steps)
    elif all(r is None for r in bw_results.values()):
        bitwise = None
    else:
        bitwise = {"verdict": "incomplete", "steps_compared": 0, "steps_wanted": bitwise_steps,
                   "why": "; ".join(f"{a} run: {r['outcome']} ({r['reason']})" if r else f"{a} run: not run"
                                    for a, r in bw_results.items() if r is None or r["outcome"] != "ok")}
    models = {}
    for model, ladder in ladders.items():
        rows = {}
        for alloc in allocators:
            results = {}
            for mb in ladder:
                f = state / "runs" / model / f"{alloc}-mb{mb}" / "result.json"
                if f.exists():
                    results[mb] = json.loads(f.read_text())
            decision = ladder_decision(ladder, results)
            rows[alloc] = {"decision": decision, "runs": {str(mb): r for mb, r in results.items()},
                           "best": results[decision["largest"]] if decision["largest"] is not None else None}
        models[model] = {"ladder": ladder, "allocators": rows, "verdicts": verdicts(model, rows)}
    return {"models": models, "bitwise": bitwise}


def markdown(rep: dict, meta: Dict[str, str]) -> str:
    lines = ["# MLA against the caching allocator and expandable_segments (issue #47)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    bw = bitwise_text(rep["bitwise"])
    for model, m in rep["models"].items():
        for alloc, r in m["allocators"].items():
            cell = bw if alloc == "mla" else "baseline" if alloc == "caching" else "not compared"
            lines.append("| " + " | ".join(row(model, alloc, r["decision"], r["best"], cell)) + " |")
    lines += ["", "Bitwise check (fp32, same seed and data order, caching allocator against MLA): " + bw, ""]
    for m in rep["models"].values():
        lines += [f"- {v}" for v in m["verdicts"]]
    notes = []
    for model, m in rep["models"].items():
        for alloc, r in m["allocators"].items():
            if r["decision"]["note"] and r["decision"]["largest"] is not None:
                notes.append(f"- {model}, {alloc}: * {r['decision']['note']}")
            for mb, run in sorted(r["runs"].items(), key=lambda kv: -int(kv[0])):
                if run["outcome"] != "ok":
                    notes.append(f"- {model}, {alloc}, micro-batch {mb}: {run['outcome']}: {run['reason']}")
                elif run.get("graph_capture_failed"):
                    notes.append(f"- {model}, {alloc}, micro-batch {mb}: trained, but {run['graph_capture_failed']}")
    if notes:
        lines += ["", "Runs that did not train, and why (from their logs):", ""] + notes
    lines += ["", "Allocators: " + "; ".join(f"{a} = {n}" for a, n in ALLOCATOR_NAMES.items()) + ".",
              "Columns: see Note [What the numbers are] in scripts/bench/mla_report.py; \"n/a\": MLA's own fields, "
              "which the other allocators do not have; \"not measured\": no such run finished."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- command line

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--limit-s", type=float, required=True)
    r.add_argument("--rc", default="", help="exit status; empty when the script stopped the trainer")
    r.add_argument("--stopped", default="")
    o = sub.add_parser("outcome")
    o.add_argument("dir", type=Path)
    p = sub.add_parser("report")
    p.add_argument("state", type=Path)
    p.add_argument("--ladder", action="append", default=[], help="MODEL=MB,MB,...")
    p.add_argument("--allocators", default=",".join(ALLOCATORS))
    p.add_argument("--bitwise-steps", type=int, default=50)
    p.add_argument("--meta", action="append", default=[], help="KEY=TEXT lines above the table")
    p.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        res = result_of_run(a.dir, a.steps, a.warmup, a.limit_s, int(a.rc) if a.rc != "" else None, a.stopped)
        (a.dir / "result.json").write_text(json.dumps(res, indent=1) + "\n")
        print(f"{a.dir.name}: {res['outcome']}, {res['steps']} steps, samples/s {fmt(res['samples_per_s'])}, "
              f"peak used {fmt(res['peak_used_gib'])} GiB" + (f"; {res['reason']}" if res["reason"] else ""))
    elif a.cmd == "outcome":
        print(outcome_of(a.dir) or "")
    else:
        ladders = {}
        for spec in a.ladder:
            model, _, mbs = spec.partition("=")
            ladders[model] = [int(x) for x in mbs.replace(",", " ").split()]
        rep = build_report(a.state, ladders, a.allocators.split(","), a.bitwise_steps)
        meta = dict(m.split("=", 1) for m in a.meta)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "mla_compare.json").write_text(json.dumps({"meta": meta, **rep}, indent=1) + "\n")
        text = markdown(rep, meta)
        (a.out / "mla_compare.md").write_text(text)
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
