"""The headline benchmark's table and charts (issue #41), from the run folders scripts/bench/headline.sh
leaves under RESULTS (each: launch.json, metrics.jsonl, monitor.jsonl, and phases.jsonl or profile.json).

    PYTHONPATH=scripts python3 scripts/bench/report.py RESULTS --out DIR

Writes DIR/headline.md (the table and its notes), DIR/headline.json (every number of the table) and
DIR/throughput.png, DIR/step_split.png. Per run, over its steady window (the steps after launch.json
"warm", less any steps a profile window slowed; the harness stops a run once it has "steady_target" of
them, or at its time budget, and launch.json "stop" says which):
- samples/s, wall clock (the headline figure): the window's samples over its summed step times (each
  trainer's step time runs from the end of one step to the end of the next, data wait included);
- samples/s with data ready: the median samples/s of the window's steps whose data wait was under 5% of
  the step (the compute-bound pace), with their count; LeRobot's wait is its DataLoader's next() (its
  processor pipeline, which its main process runs every step, counts as step work);
- data wait share: the window's data wait over its summed step times; over 20% the run is data-bound,
  and the notes say so in words;
- FLOPs/sample: analytic forward+backward FLOPs per sample of the model as that run trains it
  (scripts/model/flops.py, matmul-like work only); for LeRobot's trainer the gr00t-n1.7 config
  with its measured VL sequence length (LeRobot pads the Qwen3-VL chat prompt to the batch's longest;
  our trainers run 64 image tokens + max_text_len 32 text slots), the same horizon, dims and trainable
  set; MFU = samples/s (wall clock) x FLOPs/sample / the GPU's dense bf16 peak (and at the data-ready pace);
- step split: data wait (loongforge-train and the reference: waiting for the batch; LeRobot: its
  `dataloading_s`, the DataLoader wait plus its processor pipeline on the main process),
  forward+backward, optimizer (clipping + update), other = the step's wall time less the three (the
  median of each step's remainder where every step has its split, LeRobot's and the reference's, else
  the step's median less the parts' medians); loongforge-train's forward+backward and optimizer come
  from one `loongforge profile-step` window (its phases are synchronised there);
- peak GPU memory: NVML's memory of the run's processes (or the device's used memory less its idle
  value), and the trainer's own allocator peak; peak host memory: the process tree's PSS;
- launch -> first step: from the launch to the first metrics record (the monitor's clock);
- GPU utilisation: NVML's mean over the steady-state window;
- ratios against LeRobot's trainer (a) and the reference's optimized mode (b-opt) of the same model,
  fine-tuning mode and codec, per sample and per FLOP, wall clock and at the data-ready pace.
"""
import argparse
import json
import statistics as st
import sys
from pathlib import Path

READY_WAIT = 0.05    # a step "had its data ready" when its data wait was under this share of the step
DATA_BOUND = 0.20    # a window whose data wait share is over this is data-bound
PEAKS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12}   # dense bf16, NVIDIA's data sheets


def peak_flops(gpu: str):
    for k in ("H100 PCIe", "H100", "H200"):
        if k in gpu and (k != "H100" or "PCIe" not in gpu):
            return PEAKS[k], f"{k} dense bf16 {PEAKS[k] / 1e12:.0f} TFLOP/s"
    return None, "no GPU (CPU dry run): no MFU"


def flops_per_sample(config: str, sets, text_len=None) -> float:
    from model.config import apply_overrides, get_config
    from model.flops import flops_per_sample as fps
    cfg = apply_overrides(get_config(config), list(sets))
    if text_len is not None:
        cfg = apply_overrides(cfg, [f"max_text_len={max(2, int(round(text_len)))}"])
    f = fps(cfg)
    return float(f["forward_per_sample"]) + float(f["backward_per_sample"])


def load_jsonl(path: Path):
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass   # a line cut by the end of a call
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else None


def summarize(run: Path):
    launch = json.loads((run / "launch.json").read_text())
    s = {"name": run.name, **{k: launch.get(k) for k in ("trainer", "label", "model", "ft", "codec", "batch",
                                                          "exit", "cache_drop", "gpu", "model_config", "settings",
                                                          "stop", "budget_s", "steady_target")}}
    if launch.get("skipped"):
        s.update(steps=0, steady_steps=0, error=f"skipped: {launch['skipped']}")
        return s
    recs = load_jsonl(run / "metrics.jsonl")
    mon = load_jsonl(run / "monitor.jsonl")
    phases = {p["step"]: p for p in load_jsonl(run / "phases.jsonl")}
    warm = int(launch.get("warm", 0))
    skip = launch.get("skip_steps", [])
    prof = run / "profile.json"
    if prof.exists():   # the steps a `loongforge profile-step` window synchronised are left out
        try:
            p = json.loads(prof.read_text())
            skip = [int(p["first_step"]), int(p["last_step"])]
        except (ValueError, KeyError):
            pass
    steady = [r for r in recs if r["step"] > warm and not (skip and skip[0] <= r["step"] <= skip[1])]
    s.update(steps=len(recs), steady_steps=len(steady))
    if not steady:
        s["error"] = (f"{len(recs)} steps recorded, none after warm-up step {warm} (exit {launch.get('exit')}"
                      + (f", {stop_words(s)}" if s.get("stop") else "") + ")")
        return s
    trainer = launch["trainer"]
    batch = float(launch.get("batch") or 0)
    # the headline: the window's samples over its summed step times
    window_s = sum(r["step_ms"] for r in steady) / 1000.0
    s["window_s"] = window_s
    s["samples_per_s"] = batch * len(steady) / window_s if window_s > 0 and batch else None
    s["median_step_samples_per_s"] = med(r["samples_per_s"] for r in steady)
    waits = [float(r.get("data_wait_ms") or 0.0) for r in steady]   # LeRobot: its DataLoader's next()
    s["data_wait_share"] = sum(waits) / 1000.0 / window_s if window_s > 0 else None
    s["data_bound"] = bool(s["data_wait_share"] is not None and s["data_wait_share"] > DATA_BOUND)
    # the compute-bound pace: steps whose data was ready
    ready = [r for r, w in zip(steady, waits) if r["step_ms"] > 0 and w < READY_WAIT * r["step_ms"]]
    s["ready_steps"] = len(ready)
    s["ready_samples_per_s"] = med(r["samples_per_s"] for r in ready)
    s["step_ms"] = med(r["step_ms"] for r in steady)
    if trainer == "lerobot":
        s["data_ms"] = med(r["data_wait_ms"] + r["preprocess_ms"] for r in steady)
        s["data_loader_ms"] = med(r["data_wait_ms"] for r in steady)
        s["preprocess_ms"] = med(r["preprocess_ms"] for r in steady)
        s["fwd_bwd_ms"] = med(r.get("fwd_bwd_ms") for r in steady)
        s["optimizer_ms"] = med(r.get("optimizer_ms") for r in steady)
        s["seq_len"] = st.mean(r["seq_len"] for r in steady)
    else:
        s["data_ms"] = med(r.get("data_wait_ms") for r in steady)
        if phases:
            s["fwd_bwd_ms"] = med(phases[r["step"]]["fwd_bwd_ms"] for r in steady if r["step"] in phases)
            s["optimizer_ms"] = med(phases[r["step"]]["optimizer_ms"] for r in steady if r["step"] in phases)
        if prof.exists():
            try:
                ph = json.loads(prof.read_text())["phases"]
                per = {k: v["mean_ms_per_step"] for k, v in ph.items()}
                s["profile_phases_ms"] = per
                s["fwd_bwd_ms"] = sum(v for k, v in per.items() if "forward" in k or "backward" in k)
                s["optimizer_ms"] = sum(v for k, v in per.items() if "optimizer" in k)
            except (ValueError, KeyError):
                pass
    parts = [s.get(k) for k in ("data_ms", "fwd_bwd_ms", "optimizer_ms")]
    s["other_ms"] = s["step_ms"] - sum(p for p in parts if p is not None) if None not in parts else None
    # where every step has its own split (LeRobot's shim, the reference's phases), "other" is the median of
    # each step's remainder instead of the difference of medians
    per_step = []
    for r in steady:
        if trainer == "lerobot":
            got = [r["data_wait_ms"] + r["preprocess_ms"], r.get("fwd_bwd_ms"), r.get("optimizer_ms")]
        elif r["step"] in phases:
            got = [r.get("data_wait_ms"), phases[r["step"]].get("fwd_bwd_ms"), phases[r["step"]].get("optimizer_ms")]
        else:
            got = [None]
        if None not in got:
            per_step.append(r["step_ms"] - sum(got))
    if len(per_step) == len(steady):
        s["other_ms"] = med(per_step)
    s["trainer_peak_mem_mb"] = max((r.get("peak_mem_mb") or 0.0) for r in recs)
    gm = [m for m in mon if m.get("gpu_proc_mem_mb") is not None]
    if gm:
        s["gpu_peak_mb"] = max(m["gpu_proc_mem_mb"] for m in gm)
    elif any(m.get("gpu_mem_mb") is not None for m in mon):
        s["gpu_peak_mb"] = max(m["gpu_mem_mb"] for m in mon if m.get("gpu_mem_mb") is not None) - \
            float(launch.get("idle_gpu_mem_mb") or 0.0)
    host = [m["host_pss_mb"] for m in mon if m.get("host_pss_mb") is not None]
    s["host_peak_mb"] = max(host) if host else None
    first = next((m["t"] for m in mon if m.get("lines", 0) >= 1), None)
    s["first_step_s"] = first - launch["launch_t"] if first else None
    t0 = next((m["t"] for m in mon if m.get("lines", 0) > warm), None)
    t1 = next((m["t"] for m in mon if m.get("lines", 0) >= len(recs)), None)
    util = [m["gpu_util"] for m in mon if m.get("gpu_util") is not None and t0 and t1 and t0 <= m["t"] <= t1]
    s["gpu_util"] = st.mean(util) if util else None
    window = [m for m in mon if m.get("cpu_pct") is not None and t0 and t1 and t0 <= m["t"] <= t1]
    if window:  # the host's side of the window: the tree's cores, and the busiest thread (which one, most often)
        s["host_cpu_pct"] = st.mean(m["cpu_pct"] for m in window)
        s["top_thread_pct"] = st.median(m["top_thread_pct"] for m in window if m.get("top_thread_pct") is not None)
        names = [m["top_thread"] for m in window if m.get("top_thread")]
        s["top_thread"] = max(set(names), key=names.count) if names else None
    # FLOPs per sample of what this run trains
    if launch.get("model_config"):
        text = None
        if trainer == "lerobot":
            text = s["seq_len"] - launch.get("image_tokens", 64)
            s["flops_note"] = (f"LeRobot's sequence: {s['seq_len']:.1f} tokens (64 image + chat template + task "
                               f"text, padded to the batch's longest) against our {launch.get('our_seq_len', 96)}")
        s["flops_per_sample"] = flops_per_sample(launch["model_config"], launch.get("model_sets", []), text)
    return s


def stop_words(r):
    """How the run's window ended, in words."""
    k, n = r.get("steady_target"), r.get("steady_steps")
    if r.get("stop") == "steady":
        return f"stopped by the rule at {n} steady steps"
    if r.get("stop") == "budget":
        return (f"stopped by its time budget ({r.get('budget_s')} s) after {n} steady steps"
                + (f", fewer than the rule's {k}" if k and n is not None and n < k else ""))
    if r.get("exit") not in (0, None):
        return f"ended with exit status {r['exit']} after {n} steady steps"
    return f"ran to its step limit ({n} steady steps)"


def data_words(r):
    """Whether the run was data-bound, in words (None when it was not)."""
    if not r.get("data_bound"):
        return None
    n = r.get("ready_steps") or 0
    ready = (f"its {n} step{'s' if n != 1 else ''} with data ready ran at {r['ready_samples_per_s']:.1f} "
             "samples/s (median)" if n else "none of its steps had its data ready")
    wait = "its DataLoader's next()" if r.get("trainer") == "lerobot" else "waiting for the batch"
    return (f"data-bound: {100 * r['data_wait_share']:.0f}% of its steady window went to {wait}; "
            f"{r['samples_per_s']:.1f} samples/s wall clock, while {ready}")


def fmt(v, spec=".1f", none="-", unit=""):
    return none if v is None else format(v, spec) + unit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p for p in args.results.iterdir() if (p / "launch.json").exists())
    rows = [summarize(r) for r in runs]
    gpu = next((r["gpu"] for r in rows if r.get("gpu")), "") or ""
    peak, peak_name = peak_flops(gpu)
    order = {"lerobot": 0, "ref-base": 1, "ref-opt": 2}
    rows.sort(key=lambda r: (r.get("model") or "", r.get("ft") or "", r.get("codec") or "",
                             order.get(r.get("trainer"), 3), r["name"]))
    for r in rows:
        for pace, key in (("", "samples_per_s"), ("_ready", "ready_samples_per_s")):
            if r.get(key) and r.get("flops_per_sample") and peak:
                r["mfu" + pace] = r[key] * r["flops_per_sample"] / peak
        same = [o for o in rows if (o.get("model"), o.get("ft"), o.get("codec")) ==
                (r.get("model"), r.get("ft"), r.get("codec"))]
        for key, base in (("vs_lerobot", "lerobot"), ("vs_ref_opt", "ref-opt")):
            b = next((o for o in same if o.get("trainer") == base), None)
            for pace, sps in (("", "samples_per_s"), ("_ready", "ready_samples_per_s")):
                if b and r.get(sps) and b.get(sps):
                    r[key + pace] = r[sps] / b[sps]
                    if r.get("flops_per_sample") and b.get("flops_per_sample"):
                        r[key + pace + "_per_flop"] = (r[sps] * r["flops_per_sample"]) / (b[sps] * b["flops_per_sample"])
    (args.out / "headline.json").write_text(json.dumps({"gpu": gpu, "peak": peak_name, "rows": rows}, indent=1))

    def pair(r, key):   # "wall clock / data ready" ratios: vs_lerobot[_per_flop] and vs_lerobot_ready[_per_flop]
        base, _, flop = key.partition("_per_flop")
        ready = base + "_ready" + ("_per_flop" if _ else "")
        return f"{fmt(r.get(key), '.2f', unit='x')} / {fmt(r.get(ready), '.2f', unit='x')}"

    head = ("| run | samples/s, wall clock | samples/s, data ready (steps) | data wait % | vs (a) | vs (b)-opt | "
            "GFLOP/sample | vs (a) per FLOP | vs (b)-opt per FLOP | MFU | step ms | data ms | fwd+bwd ms | "
            "optimizer ms | other ms | peak GPU MB (NVML / allocator) | peak host MB | launch -> 1st step s | "
            "GPU util % | steady steps (ended by) |")
    ncol = head.count("|") - 1
    lines = [f"# Headline benchmark ({gpu or 'CPU dry run'}; MFU against {peak_name})", "",
             "samples/s, wall clock (the headline): the steady window's samples over its summed step times. "
             "Data ready: the median of the window's steps whose data wait was under 5% of the step (the "
             "compute-bound pace) and their count. Ratios: wall clock / data ready. Steady window: the steps "
             "after the warm-up; a run stops once it has the rule's number of them, or at its time budget "
             "(last column).", "", head, "|" + "---|" * ncol]
    for r in rows:
        if "error" in r or not r.get("samples_per_s"):
            lines.append(f"| {r['name']} | {r.get('error', 'no steps')} |" + " |" * (ncol - 2))
            continue
        ended = {"steady": "rule", "budget": "budget"}.get(r.get("stop"), "step limit" if r.get("exit") == 0 else
                                                             f"exit {r.get('exit')}")
        lines.append(
            f"| {r['name']} | {fmt(r['samples_per_s'])} | {fmt(r.get('ready_samples_per_s'))} ({r.get('ready_steps', 0)}) | "
            f"{fmt(r.get('data_wait_share') is not None and 100 * r['data_wait_share'], '.0f')} | "
            f"{pair(r, 'vs_lerobot')} | {pair(r, 'vs_ref_opt')} | {fmt((r.get('flops_per_sample') or 0) / 1e9 or None)} | "
            f"{pair(r, 'vs_lerobot_per_flop')} | {pair(r, 'vs_ref_opt_per_flop')} | "
            f"{fmt(r.get('mfu') and 100 * r['mfu'], '.1f', unit='%')} | {fmt(r['step_ms'])} | {fmt(r.get('data_ms'))} | "
            f"{fmt(r.get('fwd_bwd_ms'))} | {fmt(r.get('optimizer_ms'))} | {fmt(r.get('other_ms'))} | "
            f"{fmt(r.get('gpu_peak_mb'), '.0f')} / {fmt(r.get('trainer_peak_mem_mb'), '.0f')} | "
            f"{fmt(r.get('host_peak_mb'), '.0f')} | {fmt(r.get('first_step_s'))} | {fmt(r.get('gpu_util'), '.0f')} | "
            f"{r['steady_steps']} ({ended}) |")
    notes = ["", "Notes:"]
    unbuilt = args.results / "unbuilt_engines.txt"  # written by headline.sh before every engine was built
    if unbuilt.exists() and unbuilt.read_text().strip():
        notes.append("- Engines not in this build (loongforge-train's answer to --set <engine>.enable=true): "
                     + " / ".join(x.strip() for x in unbuilt.read_text().splitlines() if x.strip()))
    for r in rows:
        if r.get("settings"):
            notes.append(f"- {r['name']}: loongforge-train --set {r['settings'].replace('--set ', '')}.")
        words = data_words(r)
        if words:
            notes.append(f"- {r['name']}: {words}.")
        if r.get("steady_steps") and "error" not in r:
            notes.append(f"- {r['name']}: {stop_words(r)}.")
        if r.get("flops_note"):
            notes.append(f"- {r['name']}: {r['flops_note']}; FLOPs/sample computed at that length.")
        if r.get("host_cpu_pct") is not None:
            notes.append(f"- {r['name']}: host CPU over the steady window: the process tree {r['host_cpu_pct']:.0f}% of "
                         f"one core (mean), its busiest thread {r['top_thread_pct']:.0f}% (median; most often "
                         f"{r.get('top_thread')}).")
        if r.get("cache_drop"):
            notes.append(f"- {r['name']}: page cache before the run: {r['cache_drop']}.")
        if r.get("exit") not in (0, None) and "error" in r:
            notes.append(f"- {r['name']}: exit status {r['exit']}.")
    (args.out / "headline.md").write_text("\n".join(lines + notes) + "\n")
    print("\n".join(lines + notes))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ok = [r for r in rows if r.get("samples_per_s")]
        if ok:
            fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(ok)), 4))
            ax.bar(range(len(ok)), [r["samples_per_s"] for r in ok], color=["C1" if r["trainer"] == "lerobot" else
                                                                              "C0" if r["trainer"].startswith("ref")
                                                                              else "C2" for r in ok])
            ready = [(i, r["ready_samples_per_s"]) for i, r in enumerate(ok) if r.get("ready_samples_per_s")]
            if ready:
                ax.scatter([i for i, _ in ready], [v for _, v in ready], marker="_", s=400, color="k", zorder=3,
                           label="steps with data ready (median)")
                ax.legend(fontsize=7)
            ax.set_xticks(range(len(ok)), [r["name"] for r in ok], rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("samples/s per GPU (bars: wall clock)")
            ax.set_title(f"Throughput ({gpu or 'CPU dry run'})")
            fig.tight_layout()
            fig.savefig(args.out / "throughput.png", dpi=120)
            fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(ok)), 4))
            bottom = [0.0] * len(ok)
            for r in ok:   # a run without a split shows the rest of its step as one "not split" part
                r["_unsplit"] = (r["step_ms"] - (r.get("data_ms") or 0.0)) if r.get("fwd_bwd_ms") is None else 0.0
            for key, label in (("data_ms", "data wait"), ("fwd_bwd_ms", "forward+backward"),
                               ("optimizer_ms", "optimizer"), ("other_ms", "other"), ("_unsplit", "not split")):
                vals = [max(0.0, r.get(key) or 0.0) for r in ok]
                ax.bar(range(len(ok)), vals, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_xticks(range(len(ok)), [r["name"] for r in ok], rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("ms per step (medians)")
            ax.legend(fontsize=7)
            ax.set_title("Step-time split")
            fig.tight_layout()
            fig.savefig(args.out / "step_split.png", dpi=120)
    except ImportError as e:
        print(f"report: no charts ({e})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
