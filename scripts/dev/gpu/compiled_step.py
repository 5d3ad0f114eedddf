"""Issue #11 item 6: Inductor-compiled kernels for the joint forward+backward,
measured against what loongforge-train runs today.

Builds the training micro-step of a model config as one function
  (trainable params, frozen params, batch) -> (loss, num_valid, grads...)
traces it with make_fx into one aten graph (forward and backward), exports it,
compiles it with AOTInductor into a package, loads the package and checks it
against eager autograd (loss and every gradient), then times, at the trainers'
bf16 layout (trainable fp32, frozen bf16, autocast):
  eager       the model's forward + backward, Python eager
  script      the TorchScript module's forward + backward (loongforge-train's path)
  script+cg   the same captured as one CUDA graph (loongforge-train's graph runner)
  script-fuse the TorchScript module with the graph executor's optimization on
              (profiling executor, NNC/TensorExpr fuser on the GPU, JIT autocast):
              loongforge-train switches it off for bitwise parity with eager; this
              row measures what it would give (loss and gradients checked against eager)
  script-fuse+cg  the same captured as one CUDA graph
  aoti        the AOTInductor package's run()
  aoti+cg     the same captured as one CUDA graph
  compile-ro  torch.compile(mode="reduce-overhead") forward + backward (the
              reference trainer's --mode optimized)
Usage (GPU machine):
  PYTHONPATH=scripts python3 scripts/dev/gpu/compiled_step.py --config n16-1b --batch 32 \
      [--iters 30] [--package /dev/shm/step.pt2 [--load]] [--skip compile-ro,...]
On the H200 image (torch 2.11.0+cu130, 2026-12-01) the n16-1b package compiles
(215 s) but loading it crashes: SIGSEGV inside the package's wrapper.so, in
std::regex compilation under torch::aot_inductor::parse_device_str called by
the AOTInductorModel constructor (cuda-gdb backtrace in docs/benchmarks.md).
Medians of --iters CUDA-event timings after warm-up, one process, same inputs.
"""
import argparse
import sys
import time
from pathlib import Path

import torch
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.batch import example_batch  # noqa: E402
from model.config import get_config  # noqa: E402
from model.registry import build_model  # noqa: E402
from cuda_timing import median_ms  # noqa: E402 -- scripts/dev/gpu/ is the script's own folder


def timed(fn, iters: int) -> float:
    return median_ms(fn, iters, warmup=3)


def graphed(fn):
    """fn captured as one CUDA graph after warm-up on a side stream; returns replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


CLASSES = (("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")), ("attention", ("flash", "fmha", "attention")),
           ("copy/cast", ("copy", "cat", "index")), ("norm", ("norm",)), ("triton fused", ("triton",)),
           ("reduce", ("reduce",)), ("elementwise", ("elementwise", "vectorized")))


def kernel_classes(name: str, fn, iters: int = 3) -> None:
    """Device time per iteration of fn by kernel class (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    by, count = {}, 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        count += 1
        low = e.name.lower()
        cls = next((c for c, keys in CLASSES if any(k in low for k in keys)), "other")
        by[cls] = by.get(cls, 0.0) + e.device_time / 1000.0 / iters
    total = sum(by.values())
    print(f"{name}: {count / iters:.0f} kernels, {total:.2f} ms device time per forward+backward: " +
          ", ".join(f"{c} {t:.2f}" for c, t in sorted(by.items(), key=lambda kv: -kv[1])), flush=True)


def accumulating(scripted, batch):
    """A bf16 forward+backward of `scripted` that accumulates into preallocated
    gradients (what a captured graph replays)."""
    for p in scripted.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)

    def acc():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = scripted(batch)
        out["loss"].float().backward()
    return acc


def top_ops(name: str, fn, iters: int = 3, rows: int = 30) -> None:
    """Device time per iteration by aten op (self time: an op's own kernels, not its
    children's), eager launches so that every kernel has its op; the attribution a
    fused kernel has to beat."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    avgs = [a for a in prof.key_averages() if a.self_device_time_total > 0]
    avgs.sort(key=lambda a: -a.self_device_time_total)
    total = sum(a.self_device_time_total for a in avgs) / 1000.0 / iters
    print(f"{name}: device time by op, {total:.2f} ms per forward+backward (self time, top {rows}):", flush=True)
    for a in avgs[:rows]:
        print(f"  {a.self_device_time_total / 1000.0 / iters:7.2f} ms  {a.count // iters:5d} calls  {a.key}", flush=True)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / a.float().norm().clamp(min=1e-30)).item()


def script_fuse(model, batch, ref, tn, named, args, rows) -> None:
    """The script rows with TorchScript's own optimizing executor and fuser on."""
    saved = (torch._C._get_graph_executor_optimize(), torch._C._jit_texpr_fuser_enabled(),
             torch._C._jit_can_fuse_on_gpu())
    torch._C._set_graph_executor_optimize(True)
    torch._C._jit_set_profiling_executor(True)
    torch._C._jit_set_texpr_fuser_enabled(True)
    torch._C._jit_override_can_fuse_on_gpu(True)
    torch._C._jit_set_autocast_mode(True)
    try:
        scripted = torch.jit.script(model)
        params = dict(scripted.named_parameters())

        def fb():
            for p in scripted.parameters():
                p.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = scripted(batch)
            loss = out["loss"].float()
            loss.backward()
            return loss.detach()
        for _ in range(4):  # profiling runs, then the optimized plan
            loss = fb()
        graph = torch.jit.last_executed_optimized_graph()
        kinds = [n.kind() for n in graph.nodes()]
        fused = sum(k in ("prim::TensorExprGroup", "prim::FusionGroup", "prim::CudaFusionGroup") for k in kinds)
        grads = [params[n].grad for n in tn]
        missing = sum(g is None for g in grads)
        worst = max((rel(a, b) for a, b in zip(ref[2:], grads) if b is not None), default=float("nan"))
        print(f"script-fuse: {fused} fusion groups, {sum(k == 'prim::DifferentiableGraph' for k in kinds)} "
              f"differentiable graphs in the last optimized graph; loss {loss.item():.6f} vs eager "
              f"{ref[0].item():.6f}; max relative gradient difference {worst:.2e} ({missing} missing)", flush=True)
        rows["script-fuse"] = timed(fb, args.iters)
        try:
            replay = graphed(accumulating(scripted, batch))
            rows["script-fuse+cg"] = timed(replay, args.iters)
            if args.profile:
                kernel_classes("script-fuse+cg", replay)
        except RuntimeError as e:  # a fuser kernel that cannot be captured is itself a finding
            print(f"script-fuse+cg: capture failed: {str(e).splitlines()[0]}", flush=True)
    except Exception as e:  # noqa: BLE001 -- report and go on to the other rows
        print(f"script-fuse: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    finally:
        torch._C._set_graph_executor_optimize(saved[0])
        torch._C._jit_set_texpr_fuser_enabled(saved[1])
        torch._C._jit_override_can_fuse_on_gpu(saved[2])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="n16-1b")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--package", default="/dev/shm/step.pt2")
    ap.add_argument("--skip", default="", help="comma-separated rows to skip")
    ap.add_argument("--load", action="store_true", help="load --package as it is (built by an earlier run)")
    ap.add_argument("--profile", action="store_true",
                    help="device time by kernel class for script+cg and compile-ro, by aten op for script")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    cfg = get_config(args.config)
    model = build_model(cfg).to(dev).train()
    named = dict(model.named_parameters())
    tn = [n for n, p in named.items() if p.requires_grad]
    fn = [n for n, p in named.items() if not p.requires_grad]
    for n in fn:
        named[n].data = named[n].data.to(torch.bfloat16)
    batch = {k: v.to(dev) for k, v in example_batch(cfg, args.batch, seed=0).items()}
    keys = list(batch)
    nt, nf = len(tn), len(fn)
    print(f"config {cfg.name}, batch {args.batch}, torch {torch.__version__}, {torch.cuda.get_device_name()}; "
          f"{nt} trainable / {nf} frozen tensors")

    def step(*flat):
        tp = dict(zip(tn, flat[:nt]))
        fp = dict(zip(fn, flat[nt:nt + nf]))
        b = dict(zip(keys, flat[nt + nf:]))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = functional_call(model, {**tp, **fp}, (b,))
        loss = out["loss"].float()
        grads = torch.autograd.grad(loss, [tp[n] for n in tn])
        return (loss.detach(), out["num_valid"].detach(), *grads)

    leaves = [named[n].detach().requires_grad_(True) for n in tn]
    flat = leaves + [named[n].detach() for n in fn] + [batch[k] for k in keys]
    plain = [x.detach() for x in flat]
    ref = step(*flat)

    def fwd_bwd(m):
        for p in m.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(batch)
        out["loss"].float().backward()

    rows = {}
    if "eager" not in skip:
        rows["eager"] = timed(lambda: fwd_bwd(model), args.iters)
    if "script" not in skip:
        scripted = torch.jit.script(model)
        rows["script"] = timed(lambda: fwd_bwd(scripted), args.iters)
        replay = graphed(accumulating(scripted, batch))
        rows["script+cg"] = timed(replay, args.iters)
        if args.profile:
            kernel_classes("script+cg", replay)
            top_ops("script", lambda: fwd_bwd(scripted))
        del scripted, replay
    if "script-fuse" not in skip:
        script_fuse(model, batch, ref, tn, named, args, rows)
    if "aoti" not in skip and args.load:
        path = args.package
    elif "aoti" not in skip:
        t0 = time.time()
        gm = make_fx(step)(*flat)
        t1 = time.time()
        ep = torch.export.export(gm, tuple(plain))
        t2 = time.time()
        path = torch._inductor.aoti_compile_and_package(ep, package_path=args.package)
        t3 = time.time()
        print(f"aoti: make_fx {t1 - t0:.0f} s ({len(gm.graph.nodes)} nodes), export {t2 - t1:.0f} s, "
              f"compile {t3 - t2:.0f} s -> {path} ({Path(path).stat().st_size / 1e6:.1f} MB)", flush=True)
        del gm, ep
    if "aoti" not in skip:
        runner = torch._inductor.aoti_load_package(path)
        outs = runner(*plain)
        print(f"aoti vs eager autograd: loss {ref[0].item():.6f} vs {outs[0].item():.6f}; "
              f"max relative gradient difference (norm) {max(rel(a, b) for a, b in zip(ref[2:], outs[2:])):.2e}; "
              f"global {rel(torch.cat([g.flatten() for g in ref[2:]]), torch.cat([g.flatten() for g in outs[2:]])):.2e}",
              flush=True)
        rows["aoti"] = timed(lambda: runner(*plain), args.iters)
        rows["aoti+cg"] = timed(graphed(lambda: runner(*plain)), args.iters)
        del runner
    if "compile-ro" not in skip:
        model.zero_grad(set_to_none=True)
        compiled = torch.compile(model, mode="reduce-overhead")

        def it():
            torch.compiler.cudagraph_mark_step_begin()
            fwd_bwd(compiled)
        t0 = time.time()
        it()
        torch.cuda.synchronize()
        print(f"compile-ro: first call {time.time() - t0:.0f} s", flush=True)
        rows["compile-ro"] = timed(it, args.iters)
        if args.profile:
            kernel_classes("compile-ro", it)
    base = rows.get("script+cg")
    print(f"\n{'forward+backward':14s} {'ms':>8s} {'vs script+cg':>13s}")
    for k, v in rows.items():
        print(f"{k:14s} {v:8.2f} {base / v if base else float('nan'):12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
