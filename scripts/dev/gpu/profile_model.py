"""Where the time of one training micro-step goes (issue #11): forward + backward
of an exported model file on the GPU, eager Python and TorchScript, in the
trainers' bf16 layout (trainable weights fp32, frozen ones bf16, autocast).

Usage (GPU machine):
    PYTHONPATH=scripts python3 scripts/dev/gpu/profile_model.py --model /dev/shm/n16-1b.pt \
        [--batch 32] [--iters 20] [--trace OUT.json] [--top 30] [--script-only]

Prints
- ms per forward+backward (median of --iters, CUDA events) for the eager model
  built from the file's config (what the reference trainer runs) and for the
  TorchScript module itself (what loongforge-train runs);
- with --compiled, the same for the eager model under torch.compile (the
  reference's optimized mode less its CUDA graphs, whose launch gaps the
  "cuda graph" row shows for TorchScript);
- a per-region split of the eager forward (vision+LM under the frozen layout,
  action head + embodiment MLPs) and the backward;
- the top kernels/ops by device time from torch.profiler over 3 iterations, and
  the number of kernel launches per iteration;
- with --copy-sources N, for the TorchScript module: its copy/cast and elementwise
  kernels by the ATen op that launched them and that op's two callers (with the
  launching op's input shapes), the N largest by device time: where the copies
  loongforge-train's kernel profile shows come from.
Nothing here is a benchmark of a trainer: no data loading, no optimizer.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model import ops  # noqa: E402
from model.batch import example_batch  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.n16 import N16Model  # noqa: E402
from model.registry import build_model  # noqa: E402
from cuda_timing import median_ms  # noqa: E402 -- scripts/dev/gpu/ is the script's own folder


def load(path: str, device: torch.device, with_eager: bool = True):
    extra = {"loongforge/config.json": "", "loongforge/params.json": ""}
    ops.load_if_built()  # model files with category_linear=grouped call loongforge:: operators
    scripted = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    cfg = ModelConfig.from_json(extra["loongforge/config.json"])
    trainable = {p["name"]: p["trainable"] for p in json.loads(extra["loongforge/params.json"])}
    eager = None
    if with_eager:
        eager = build_model(cfg)
        eager.load_state_dict(scripted.state_dict())
    for m in (x for x in (eager, scripted) if x is not None):
        for n, p in m.named_parameters():
            p.requires_grad_(trainable[n])
            if not trainable[n]:
                p.data = p.data.to(torch.bfloat16)
        m.to(device).train()
    return cfg, eager, scripted


def fwd_bwd(model, batch):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(batch)
    out["loss"].float().backward()
    return out


def zero(model):
    for p in model.parameters():
        p.grad = None


def timed(fn, iters: int) -> float:
    return median_ms(fn, iters)


def regions(model, batch, iters: int):
    """Eager forward split: encode_vl (vision + LM), the rest, then backward (the n16 models); the
    GR00T models' forward and backward (their head's path has other steps)."""
    if type(model) is not N16Model:
        return forward_backward(model, batch, iters)
    res = {"encode_vl": [], "head": [], "backward": []}
    for _ in range(iters):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        zero(model)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ev[0].record()
            vl, vl_mask = model.encode_vl(batch)
            ev[1].record()
            actions = batch["actions"]
            ids = batch["embodiment_id"]
            t = batch["fm_t"]
            noise = batch["fm_noise"]
            t3 = t.view(-1, 1, 1)
            noisy = (1.0 - t3) * noise + t3 * actions
            timestep = torch.floor(t * model.num_buckets)
            emb = model.embodiment
            st = emb.state_encoder(batch["state"].unsqueeze(1), ids)
            at = emb.action_encoder(noisy, timestep, ids)
            feats = model.action_head(vl, vl_mask, st, at, timestep)
            pred = emb.action_decoder(feats, ids)
            loss = (((pred - (actions - noise).to(pred.dtype)) ** 2) * batch["action_mask"]).sum()
            ev[2].record()
        loss.float().backward()
        ev[3].record()
        torch.cuda.synchronize()
        res["encode_vl"].append(ev[0].elapsed_time(ev[1]))
        res["head"].append(ev[1].elapsed_time(ev[2]))
        res["backward"].append(ev[2].elapsed_time(ev[3]))
    return {k: statistics.median(v) for k, v in res.items()}


def forward_backward(model, batch, iters: int):
    res = {"forward": [], "backward": []}
    for _ in range(iters):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        zero(model)
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch)["loss"]
        ev[1].record()
        loss.float().backward()
        ev[2].record()
        torch.cuda.synchronize()
        res["forward"].append(ev[0].elapsed_time(ev[1]))
        res["backward"].append(ev[1].elapsed_time(ev[2]))
    return {k: statistics.median(v) for k, v in res.items()}


KINDS = (  # (kind, substrings of the kernel name), first match wins
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "wgmma")),
    ("norm", ("layer_norm", "rms_norm", "layernorm", "rmsnorm", "norm_")),
    ("copy/cast", ("copy", "memcpy", "to_copy", "cat_", "catarray")),
    ("reduce", ("reduce", "sum_", "softmax")),
    ("fill", ("fill", "memset", "zero")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "triton_")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--trace", default="")
    ap.add_argument("--script-only", action="store_true", help="only the TorchScript rows (no eager model)")
    ap.add_argument("--copy-sources", type=int, default=0, metavar="N",
                    help="also the TorchScript module's copy/cast and elementwise kernels by the ATen op (and its "
                         "two callers) that launched them, the N largest by device time")
    ap.add_argument("--compiled", action="store_true",
                    help="also the eager model under torch.compile (Inductor, as the reference's --mode optimized "
                         "compiles it, without its CUDA graphs so the profiler sees the kernels)")
    args = ap.parse_args()
    if args.compiled and args.script_only:
        ap.error("--compiled compiles the eager model, which --script-only leaves out")
    # As loongforge-train runs TorchScript: the graph executor's optimizations off
    # (with them on, autocast around a scripted forward can crash; docs/architecture.md s9).
    torch._C._set_graph_executor_optimize(False)
    dev = torch.device("cuda")
    cfg, eager, scripted = load(args.model, dev, with_eager=not args.script_only)
    batch = {k: v.to(dev) for k, v in example_batch(cfg, args.batch, seed=0).items()}
    print(f"config {cfg.name}, batch {args.batch}, torch {torch.__version__}, {torch.cuda.get_device_name()}")

    models = (("torchscript", scripted),) if args.script_only else (("eager", eager), ("torchscript", scripted))
    if args.compiled:
        t0 = time.time()
        compiled = torch.compile(eager, dynamic=False)
        zero(eager)
        fwd_bwd(compiled, batch)
        torch.cuda.synchronize()
        print(f"torch.compile of the eager model: first forward+backward {time.time() - t0:.1f} s")
        models += (("compiled", compiled),)
    for name, m in models:
        for _ in range(5):
            zero(m)
            fwd_bwd(m, batch)
        torch.cuda.synchronize()

        def it(m=m):
            zero(m)
            fwd_bwd(m, batch)
        print(f"{name:12s} forward+backward {timed(it, args.iters):8.2f} ms (median of {args.iters})")
    # The TorchScript module's forward+backward captured as one CUDA graph (as
    # loongforge-train's graph runner does): device time without launch gaps.
    m = scripted
    for p in m.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fwd_bwd(m, batch)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fwd_bwd(m, batch)
    print(f"{'cuda graph':12s} forward+backward {timed(graph.replay, args.iters):8.2f} ms (TorchScript module, "
          f"one replay; median of {args.iters})")
    for p in m.parameters():
        p.grad = None
    del graph
    if not args.script_only:
        r = regions(eager, batch, args.iters)
        print("eager regions (ms, median): " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))

    from torch.profiler import ProfilerActivity, profile
    for name, m in models:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                zero(m)
                fwd_bwd(m, batch)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.device_time for e in kernels) / 3 / 1000.0
        print(f"\n== {name}: {len(kernels) / 3:.0f} device events per iteration, {total:.2f} ms device time")
        by = {}
        for e in kernels:
            k = e.name[:90]
            n, t = by.get(k, (0, 0.0))
            by[k] = (n + 1, t + e.device_time / 1000.0 / 3)
        cats = {}
        for k, (n, t) in by.items():
            c = kernel_category(k)
            cn, ct = cats.get(c, (0, 0.0))
            cats[c] = (cn + n / 3, ct + t)
        print("by kind: " + ", ".join(f"{c} {t:.2f} ms ({t / total * 100:.1f}%, x{n:.0f})"
                                      for c, (n, t) in sorted(cats.items(), key=lambda kv: -kv[1][1])))
        for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[: args.top]:
            print(f"{t:8.2f} ms {t / total * 100:5.1f}%  x{n / 3:5.0f}  {k}")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.top, max_name_column_width=60))
        if args.trace and name == "eager":
            prof.export_chrome_trace(args.trace)
    if args.copy_sources > 0:
        copy_sources(scripted, batch, args.copy_sources)
    return 0


def copy_sources(m, batch, top: int) -> None:
    """The copy/cast and elementwise kernels of one forward+backward of m by launching op (see the
    module docstring)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        zero(m)
        fwd_bwd(m, batch)
        torch.cuda.synchronize()
    by = {}
    for e in prof.events():
        for k in e.kernels:
            kind = kernel_category(k.name)
            if kind not in ("copy/cast", "elementwise"):
                continue
            chain, p = [e.name], e.cpu_parent
            while p is not None and len(chain) < 3:
                chain.append(p.name)
                p = p.cpu_parent
            shapes = [s for s in (e.input_shapes or []) if s][:2]
            key = (kind, " <- ".join(chain), str(shapes))
            n, t = by.get(key, (0, 0.0))
            by[key] = (n + 1, t + k.duration / 1000.0)
    for kind in ("copy/cast", "elementwise"):
        rows = sorted(((t, n, c, sh) for (kd, c, sh), (n, t) in by.items() if kd == kind), reverse=True)
        print(f"\n== {kind} kernels of one TorchScript forward+backward: {sum(r[1] for r in rows)} launches, "
              f"{sum(r[0] for r in rows):.2f} ms; by launching op (<- callers), input shapes")
        for t, n, c, sh in rows[:top]:
            print(f"{t:8.3f} ms x{n:5d}  {c}  {sh}")


if __name__ == "__main__":
    sys.exit(main())
