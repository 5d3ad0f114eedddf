"""Compiles a model file's training micro-step with AOTInductor for
loongforge-train's compiled runner (trainer.compiled_step; issue #11 item 6).

    python3 scripts/compile_step.py MODEL.pt --batch-size 32 --device cuda --precision bf16 --out STEP.pt2
        [--action-horizon H] [--text-width W]

Contract
- The package computes, for one micro-batch, what the plain runner computes
  (src/fusion/step_runner.cpp): the model's forward (under CUDA bf16
  autocast with --precision bf16), then the gradients of
  (loss.float() * w).to(loss.dtype) with respect to every trainable
  parameter. Inputs, in this order: the trainable parameters, the frozen
  parameters (both in the model file's params.json order; bf16: trainable
  fp32, frozen bf16, the trainer's layout), the batch tensors in the order
  of the manifest's "batch", then w (a 0-dim float32 tensor). Outputs:
  loss, num_valid, then one gradient per trainable parameter.
- The batch includes every draw the model's forward could make itself, in
  the forward's order: fm_t, fm_noise, and for a GR00T head its state_drop
  (B,) when its state dropout is above 0 and state_noise (B, 1, w) when its
  state noise scale is (model/batch.py head_draw_keys). The trainer's batch
  carries fm_t and fm_noise; the compiled runner draws the others from the
  generator the model would use, in that order, with the model's ops (the
  manifest's "draws": fm_t's form, noise_s, beta_alpha, state_dropout,
  state_noise_scale), so the random stream is the plain runner's
  (src/fusion/compiled_runner.cpp, Note [Compiled step draws]).
- The package's metadata "loongforge" holds the manifest (JSON): format,
  device, precision, the SHA-256 of the model file's config.json and
  params.json (the graph depends on the architecture, names, shapes and
  freezing, not on weight values: a package serves every checkpoint of the
  model), the hash of the model code the package was traced from (this
  checkout's scripts/model/, export.model_code_hash; a model file whose
  loongforge/code.json names other code is refused here), the parameter names, the batch keys with dtype and shape,
  the draws' forms, the trainable parameters taken as bf16 working copies ("bf16_weights",
  --bf16-weights: their inputs and gradients are bf16, as a run with precision.bf16_weights makes them;
  empty: every trainable parameter fp32, and the run keeps no copies) and the torch version.
  loongforge-train refuses a package whose manifest does
  not match its model, device, precision or torch, naming the difference.
- Dropout masks (a GR00T head's gr00t_dropout, the presets' 0.2) are drawn
  inside the package, from the default generator of the device when it is
  called: Inductor's fallback_random keeps every random op ATen's (CPU:
  bernoulli_; CUDA: native_dropout, not decomposed under fallback_random),
  which draw from that generator and, in a CUDA graph, from its graph-safe
  Philox seed and offset read at each replay. The trainer seeds that
  generator per (run seed, step, micro-batch, rank) before each call or
  replay (src/fusion/step_runner.cpp, Note [Micro-step draws]). The
  manifest's "dropout" names the model's rates and says where the masks
  come from.
- --text-width W: the batches' text slot is W tokens wide (text_tokens, text_mask: (B, W)) instead of the
  model's own max_text_len, as DMF cuts it (src/engines/dmf/dmf.cpp, Note [DMF and the package]). Only for a
  model whose export says its result does not depend on the slot's width (model/batch.py text_slot_cut).
- Compiling n16-1b at batch 32 for an H200 took 215 s there (docs/benchmarks.md).
"""
import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import ops  # noqa: E402
from model.batch import batch_spec, example_batch  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.gr00t_head import head_config_for  # noqa: E402
from model.export import model_code_hash  # noqa: E402
from model.registry import build_model  # noqa: E402

FORMAT = 1


def manifest_hash(config_text: str, params_text: str) -> str:
    """SHA-256 over the model file's config.json and params.json as stored (the C++ side hashes the same bytes)."""
    h = hashlib.sha256()
    h.update(config_text.encode())
    h.update(b"\0")
    h.update(params_text.encode())
    return h.hexdigest()


def draws(cfg: ModelConfig) -> dict:
    """How the model's forward draws the batch keys it may be given (see the contract): the compiled runner
    draws the absent ones so. fm_t: n16.py's (s - u^(1/alpha)) / s, gr00t.py's (1 - u^(1/alpha)) * s."""
    out = {"fm_time": "upstream" if cfg.gr00t_head else "n16", "noise_s": cfg.noise_s, "beta_alpha": cfg.beta_alpha}
    if cfg.gr00t_head:
        head = head_config_for(cfg)
        out.update(state_dropout=head.state_dropout, state_noise_scale=head.state_noise_scale)
    return out


def fail(msg: str) -> None:
    print(f"compile_step: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_records(path: str):
    """config.json, params.json and code.json ("" when absent) of a model file written by
    scripts/model/export.py, read from its zip archive (torch.jit.save's extra/ folder)."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            names = {n.split("/extra/", 1)[1]: n for n in z.namelist() if "/extra/loongforge/" in n}
            if "loongforge/config.json" not in names or "loongforge/params.json" not in names:
                fail(f"{path}: not a LoongForge model file (no loongforge/config.json and params.json records; "
                     "write it with scripts/model/export.py)")
            text = {k: z.read(v).decode() for k, v in names.items()}
    except (OSError, zipfile.BadZipFile) as e:
        fail(f"{path}: not a LoongForge model file ({e.__class__.__name__}: {e})")
    return text["loongforge/config.json"], text["loongforge/params.json"], text.get("loongforge/code.json", "")


def read_bf16_weights(path: str, trainable: list) -> list:
    """The names of --bf16-weights FILE, checked against the model's trainable parameters; in parameter order."""
    try:
        names = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        fail(f"--bf16-weights {path}: cannot read it as JSON: {e}")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        fail(f"--bf16-weights {path}: expected a JSON list of parameter names (a run folder's bf16_weights.json)")
    unknown = sorted(set(names) - set(trainable))
    if unknown:
        fail(f"--bf16-weights {path}: {len(unknown)} name(s) are no trainable parameter of this model, e.g. "
             f"'{unknown[0]}': take the bf16_weights.json of a run of this model file")
    wanted = set(names)
    return [n for n in trainable if n in wanted]


def dropout(cfg: ModelConfig) -> dict:
    """The manifest's "dropout": the model's dropout rates above 0 (config key: rate) and where the
    masks come from (see the contract)."""
    rates = {k: v for k, v in cfg.to_dict().items()
             if "dropout" in k and k not in ("gr00t_dropout", "gr00t_state_dropout") and isinstance(v, (int, float))
             and v > 0}
    if cfg.gr00t_head and head_config_for(cfg).dropout > 0:  # the state dropout is an input (state_drop)
        rates["gr00t_dropout"] = head_config_for(cfg).dropout
    return {"rates": rates, "masks": "drawn in the graph from the default generator (ATen's ops)" if rates else "none"}


def views_as_reshapes(gm):
    """Every aten.view of the traced step becomes aten.reshape.

    The step is traced on real tensors, so a reshape becomes a view wherever the real tensor's strides
    allow one; torch.export then runs the graph again on fake tensors, whose strides come from the ops'
    meta functions. Where those disagree with the real kernel's output layout (seen on an H100: the view
    of a [4, 48, 2, 32] tensor that the fake run laid out head-major, gr00t-n1.7-tiny in fp32), the view
    is refused and the export fails. A reshape is a view wherever a view works and a copy elsewhere: the
    same values either way.
    """
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm


def sample_stacks(every_s: float) -> None:
    """Every `every_s` seconds a daemon thread prints where the main thread is (its innermost
    frames), under the GIL. (faulthandler's watchdog reads them without the GIL; a 3b compile
    crashed while it was printing, its likely cause: docs/benchmarks.md 2026-12-01.)"""
    import threading
    import traceback
    main_id = threading.main_thread().ident
    t0 = time.time()

    def loop():
        while True:
            time.sleep(every_s)
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return
            inner = traceback.extract_stack(frame)[-12:]
            where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(inner))
            print(f"[{time.time() - t0:.0f} s] main thread in: {where}", file=sys.stderr, flush=True)

    threading.Thread(target=loop, name="stack-sampler", daemon=True).start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model file written by scripts/model/export.py")
    ap.add_argument("--batch-size", type=int, required=True, help="trainer.micro_batch_size")
    ap.add_argument("--action-horizon", type=int, default=None,
                    help="data.action_horizon: actions per sample in the batches the trainer will feed "
                         "(default: the model's own horizon)")
    ap.add_argument("--text-width", type=int, default=None,
                    help="tokens of the batches' text slot (default: the model's max_text_len); DMF's width")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16", help="precision.mode (bf16: CUDA only)")
    ap.add_argument("--out", required=True, help="package to write (.pt2)")
    ap.add_argument("--bf16-weights", metavar="FILE", default=None,
                    help="a JSON list of trainable parameters the package takes as bf16 working copies: the "
                         "bf16_weights.json loongforge-train writes in its run folder when it keeps them "
                         "(precision.bf16_weights); needs --precision bf16")
    ap.add_argument("--stacks-every", type=float, default=0.0, metavar="S",
                    help="print the main thread's innermost Python frames to stderr every S seconds (0: never): "
                         "where a long compile spends its time, even when it is killed before it ends")
    ap.add_argument("--cpp-only", action="store_true",
                    help="package the generated C++ sources and compiled kernels without building the host "
                         "library (AOTInductor's package_cpp_only): the long host C++ compile of a large model "
                         "can then run on another machine (scripts/dev/build_aoti_package.py)")
    args = ap.parse_args()
    if args.stacks_every > 0:
        sample_stacks(args.stacks_every)
    if args.precision == "bf16" and args.device != "cuda":
        fail("--precision bf16 needs --device cuda (the trainer runs bf16 autocast on CUDA only)")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but torch sees no GPU; compile on the machine that trains")
    dev = torch.device(args.device)
    bf16 = args.precision == "bf16"

    # Only the file's records are read (not its weights: the graph does not depend on their values,
    # and loading 12 GB of n16-3b took a minute on the H200); the trace runs on freshly built weights.
    have_ops = ops.load_if_built()  # model files with category_linear=grouped call loongforge:: operators
    config_text, params_text, code_text = read_records(args.model)
    # The package is traced from this checkout's model code (build_model below), which must be the
    # code that exported the model file: the trainer runs the file's TorchScript when it falls back.
    model_code = model_code_hash()["sha256"]
    if code_text and json.loads(code_text).get("sha256") != model_code:
        fail(f"{args.model} was exported by other model code than this checkout's scripts/model/ (code.json "
             "differs); re-export it with scripts/model/export.py here, or compile in the checkout that exported it")
    cfg = ModelConfig.from_json(config_text)
    params = json.loads(params_text)

    if cfg.category_linear == "grouped" and not have_ops:
        fail(f"{args.model} calls LoongForge's operators (category_linear=grouped), which are not built; build the "
             "target loongforge_ops or set LOONGFORGE_OPS_LIBRARY (scripts/model/ops.py)")
    with torch.device(dev):  # initialised where it runs: values are irrelevant to the graph (see above)
        model = build_model(cfg)
    trainable = [p["name"] for p in params if p["trainable"]]
    frozen = [p["name"] for p in params if not p["trainable"]]
    named = dict(model.named_parameters())
    if list(named) != [p["name"] for p in params]:
        fail(f"{args.model}: params.json does not list the model's parameters in order")
    copies = read_bf16_weights(args.bf16_weights, trainable) if args.bf16_weights else []
    if copies and not bf16:
        fail("--bf16-weights needs --precision bf16 (working copies exist only in bf16 runs)")
    model.to(dev).train()
    for n, p in named.items():
        p.requires_grad_(n in set(trainable))
        # the trainer's frozen weights are bf16 in a bf16 run, and so are its working copies: their gradients
        # come out bf16, as the TorchScript step's do
        if bf16 and (n in set(frozen) or n in set(copies)):
            p.data = p.data.to(torch.bfloat16)

    if args.action_horizon is not None and args.action_horizon < 1:
        fail(f"--action-horizon must be at least 1, got {args.action_horizon}")
    width = cfg.max_text_len if args.text_width is None else args.text_width
    if not 1 <= width <= cfg.max_text_len:
        fail(f"--text-width must be in [1, {cfg.max_text_len}] (the model's text slot), got {width}")
    if width != cfg.max_text_len and not batch_spec(cfg)["text_slot_cut"]:
        fail(f"--text-width {width}: {args.model} ({cfg.name}) gives a result that depends on the width of its "
             f"text slot (model/batch.py text_slot_cut), so its package takes the whole slot ({cfg.max_text_len})")
    batch_cfg = dataclasses.replace(cfg, max_text_len=width)  # the batch's shapes only; the model is cfg's
    batch = {k: v.to(dev) for k, v in example_batch(batch_cfg, args.batch_size, seed=0, with_fm=True,
                                                       horizon=args.action_horizon).items()}
    keys = list(batch)
    nt, nf = len(trainable), len(frozen)

    def step(*flat):
        from torch.func import functional_call
        tp = dict(zip(trainable, flat[:nt]))
        fp = dict(zip(frozen, flat[nt:nt + nf]))
        b = dict(zip(keys, flat[nt + nf:nt + nf + len(keys)]))
        w = flat[-1]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = functional_call(model, {**tp, **fp}, (b,))
        loss = out["loss"]
        weighted = (loss.float() * w).to(loss.dtype)
        grads = torch.autograd.grad(weighted, [tp[n] for n in trainable])
        return (loss.detach(), out["num_valid"].detach(), *grads)

    w = torch.tensor(0.5, dtype=torch.float32, device=dev)
    leaves = [named[n].detach().requires_grad_(True) for n in trainable]
    flat = leaves + [named[n].detach() for n in frozen] + [batch[k] for k in keys] + [w]
    plain = [x.detach() for x in flat]
    t0 = time.time()
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = views_as_reshapes(make_fx(step)(*flat))
    t1 = time.time()
    print(f"traced: {len(gm.graph.nodes)} graph nodes in {t1 - t0:.0f} s", flush=True)
    del leaves, flat
    if dev.type == "cuda":  # the trace ran the step: give its blocks back (a trainer may share this GPU)
        torch.cuda.empty_cache()
    ep = torch.export.export(gm, tuple(plain))
    t2 = time.time()
    print(f"exported in {t2 - t1:.0f} s; compiling", flush=True)
    manifest = {
        "format": FORMAT,
        "device": args.device,
        "precision": args.precision,
        "model_hash": manifest_hash(config_text, params_text),
        "model_name": cfg.name,
        "model_code": model_code,
        "trainable": trainable,
        "frozen": frozen,
        "bf16_weights": copies,
        "batch": [[k, str(batch[k].dtype).replace("torch.", ""), list(batch[k].shape)] for k in keys],
        "draws": draws(cfg),
        "dropout": dropout(cfg),
        "torch": torch.__version__,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".partial.pt2")
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(tmp),
        # fallback_random: the masks are ATen's draws from the default generator (see the contract), not
        # Inductor's own seeded kernels.
        inductor_configs={"aot_inductor.metadata": {"loongforge": json.dumps(manifest)}, "fallback_random": True,
                          **({"aot_inductor.package_cpp_only": True} if args.cpp_only else {})})
    Path(path).replace(out)
    t3 = time.time()
    print(f"compiled {cfg.name} micro-step (batch {args.batch_size}, text {width}, {args.device}, {args.precision}): "
          f"{len(gm.graph.nodes)} graph nodes; trace {t1 - t0:.0f} s, export {t2 - t1:.0f} s, "
          f"compile {t3 - t2:.0f} s -> {out} ({out.stat().st_size / 1e6:.1f} MB)")
    if args.stacks_every > 0:
        from torch._dynamo.utils import compile_times
        print(compile_times(repr="str"))  # Inductor's own time per phase
    return 0


if __name__ == "__main__":
    sys.exit(main())
