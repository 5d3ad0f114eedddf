"""The reference PyTorch trainer: the numerical reference and the performance baseline.

Usage
    PYTHONPATH=scripts python scripts/reference/train_torch.py --config configs/n16-tiny.yaml \
        [--set trainer.max_steps=5 ...] [--mode parity|baseline|optimized] [--threads N] [--profile-steps A:B] \
        [--loongforge-train build/src/daemon/loongforge-train] [--out RUN_DIR]
    (or --effective-config FILE instead of --config/--set: a saved `--print-config` output,
     for machines without the loongforge-train binary)
    torchrun --nproc-per-node 2 scripts/reference/train_torch.py --mode baseline --config ...

Contract
- The effective config comes from `loongforge-train --config YAML --set ... --print-config`
  (defaults are defined once, in C++). Relative paths in it are taken from the
  current directory, as loongforge-train takes them.
- The model is the exported TorchScript file `model.path`: its
  loongforge/config.json builds the EAGER model (`model.registry.build_model`:
  N16Model, or Gr00tModel for gr00t-* configs), the scripted module's
  state_dict is loaded into it (names must match exactly) and requires_grad
  comes from loongforge/params.json `trainable`. n16-* models have no dropout;
  gr00t-* models have dropout in training unless exported with
  gr00t_dropout=0 and gr00t_state_dropout=0 (and N1.6's additive state noise
  unless gr00t_state_noise_scale=0), and those draws are not the ones
  loongforge-train makes (docs/models.md s5).
- `--mode parity` (default): one process, fp32 (TF32 off on CUDA), on
  `run.device`; micro-batches from `SampleBuilder.micro_batch` in the exact
  order, and the optimizer step of docs/training-semantics.md section 5
  written out op by op (forward all K micro-batches, weights
  num_valid_i * W / V as Python floats, backward in order, step loss summed in
  double, clipping by hand, HF-style schedule,
  torch.optim.AdamW(foreach=False, fused=False) with the two groups of
  model.registry.decay_flags, set_to_none). A NaN/Inf loss or gradient norm stops the run naming the step
  (exit status 3); parameters are not updated. Measured: with one intra-op
  thread, losses and gradient norms are bit-identical to loongforge-train's
  (n16-tiny, 40 steps, K=2); with more threads both trainers differ run to run
  in the last bit unless --deterministic (see its help).
- `--mode baseline`: what LeRobot / Isaac-GR00T users run. DDP when
  WORLD_SIZE > 1 (torchrun environment; gloo on CPU, nccl on CUDA), bf16
  autocast when precision resolves to bf16 (auto = bf16 on CUDA) with frozen
  weights stored in bf16, DataLoader workers (`adfe.decode_threads`) decoding
  videos, pin_memory and prefetch on CUDA, fused AdamW on CUDA,
  torch.nn.utils.clip_grad_norm_. Same samples and draws at every step for any
  split of the global batch B x K x W (section 2); section 5's weights use the
  job's V (all-reduced before backward), w_i = V_i * W / V, and DDP averages
  over ranks.
- `--mode optimized`: the strongest Python baseline: baseline mode plus
  `torch.compile(mode="reduce-overhead", dynamic=False)` of the model
  (Inductor kernels, forward and backward replayed as CUDA graphs), fused
  AdamW and the same prefetching DataLoader. Compilation happens in the first
  steps, which metrics.jsonl includes (compare steady-state steps).
- Writes RUN_DIR (default `<run.output_dir>/<run.name>-torch`; rank 0 only):
  `config.yaml` (the effective config), `metrics.jsonl` (one object per
  optimizer step, keys in METRIC_KEYS), `summary.json`; prints a progress line
  every `logging.interval_steps` steps and a final summary.
"""

import argparse
import contextlib
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import yaml
from torch import Tensor

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for p in (str(REPO / "scripts"), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from lf_dataset import (DataError, MicroBatchSampler, SampleBuilder, SampleDataset, open_builder,  # noqa: E402
                        collate_samples)
from model import ops  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.registry import build_model, decay_flags  # noqa: E402

warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=DeprecationWarning)

DEFAULT_BINARY = REPO / "build" / "src" / "daemon" / "loongforge-train"
PEAK_FLOPS_H200_BF16 = 989e12   # docs/architecture.md s10: MFU is against dense bf16 peak
METRIC_KEYS = ["step", "loss", "lr", "grad_norm", "num_valid", "samples_per_s", "tokens_per_s", "mfu",
               "data_wait_ms", "step_ms", "peak_mem_mb"]


def decode_workers(cfg) -> int:
    """DataLoader workers: adfe.decode_threads, whose 0 (the default) means what loongforge-train's ADFE takes
    (adfe::default_decode_threads): this process's CPUs, divided by LOCAL_WORLD_SIZE when set, less two, at least 1."""
    n = int(cfg_get(cfg, "adfe.decode_threads"))
    if n > 0:
        return n
    cpus = len(os.sched_getaffinity(0)) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, cpus - 2)


class NonFiniteError(RuntimeError):
    """Loss or gradient norm is NaN/Inf (trainer.stop_on_nonfinite)."""


# ---------------------------------------------------------------------------- config


class _ConfigLoader(yaml.SafeLoader):
    """safe_load plus floats without a dot ("3e-04", "1e+09"): YAML 1.1, which PyYAML
    implements, reads those as strings, and loongforge-train prints them that way."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789"))


def effective_config(binary: Path, config: str, sets: List[str]) -> Tuple[Dict, str]:
    """Runs `loongforge-train --config C --set ... --print-config` -> (nested dict, YAML text)."""
    if not Path(binary).exists():
        raise FileNotFoundError(f"loongforge-train not found at '{binary}': build it (cmake --build build) "
                                "or pass --loongforge-train PATH")
    cmd = [str(binary), "--config", config]
    for s in sets:
        cmd += ["--set", s]
    cmd.append("--print-config")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise ValueError(f"loongforge-train rejected the config (exit {p.returncode}):\n{p.stderr.strip()}")
    return yaml.load(p.stdout, Loader=_ConfigLoader), p.stdout


def cfg_get(cfg: Dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


# ---------------------------------------------------------------------------- model


def load_model(path: str) -> Tuple[torch.nn.Module, ModelConfig, Dict]:
    """Exported TorchScript file -> (eager N16Model with its weights on CPU, config, extra files)."""
    names = ["config.json", "params.json", "flops.json", "batch_spec.json"]
    extra = {"loongforge/" + n: "" for n in names}
    try:
        ops.load_if_built()  # model files with category_linear=grouped call loongforge:: operators
        scripted = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"model.path '{path}': cannot load TorchScript file ({e}); export it with "
                         "scripts/model/export.py") from None
    if not extra["loongforge/config.json"] or not extra["loongforge/params.json"]:
        raise ValueError(f"model.path '{path}': no loongforge/config.json or params.json; re-export it "
                         "with scripts/model/export.py")
    mcfg = ModelConfig.from_json(extra["loongforge/config.json"])
    params = json.loads(extra["loongforge/params.json"])
    model = build_model(mcfg, device=torch.device("meta"))
    sd = scripted.state_dict()
    # a loaded TorchScript module lists its non-persistent buffers too (the prompt's ids, the ViT's
    # rotary tables, ...): derived from the config, they take the file's values, which its TorchScript runs
    derived = {f"{m}.{b}" if m else b for m, mod in model.named_modules() for b in mod._non_persistent_buffers_set}
    want, have = set(model.state_dict().keys()) | derived, set(sd.keys())
    if want != have:
        raise ValueError(f"model.path '{path}': state_dict names differ from model.registry.build_model's "
                         f"(missing {sorted(want - have)[:5]}, unexpected {sorted(have - want)[:5]}); "
                         "re-export with the current scripts/model")
    model.load_state_dict({k: v for k, v in sd.items() if k not in derived}, strict=True, assign=True)
    for name in derived:
        owner, _, buf = name.rpartition(".")
        (model.get_submodule(owner) if owner else model).register_buffer(buf, sd[name], persistent=False)
    del scripted
    named = dict(model.named_parameters())
    if [p["name"] for p in params] != list(named):
        raise ValueError(f"model.path '{path}': params.json does not list the model's parameters in order")
    decay = decay_flags(model)
    for p in params:
        if p.get("decay") != decay[p["name"]]:
            raise ValueError(f"model.path '{path}': params.json gives {p['name']} decay {p.get('decay')}, "
                             f"model.registry.decay_flags says {decay[p['name']]}; re-export with scripts/model/export.py")
    for p in params:
        if list(named[p["name"]].shape) != p["shape"]:
            raise ValueError(f"model.path '{path}': {p['name']} has shape {list(named[p['name']].shape)}, "
                             f"params.json says {p['shape']}")
        named[p["name"]].requires_grad_(bool(p["trainable"]))
    flops = json.loads(extra["loongforge/flops.json"]) if extra["loongforge/flops.json"] else {}
    spec = json.loads(extra["loongforge/batch_spec.json"]) if extra["loongforge/batch_spec.json"] else {}
    # the data processing the weights expect (training-semantics s3); absent: the dataset form
    return model, mcfg, {"params": params, "flops": flops, "processor": spec.get("processor")}


# ---------------------------------------------------------------------------- the step pieces (section 5)


def lr_at(s: int, cfg: Dict) -> float:
    """HF get_*_schedule_with_warmup for 0-based step s (step 0 has lr 0 when warmup > 0)."""
    lr = float(cfg_get(cfg, "optimizer.lr"))
    T = int(cfg_get(cfg, "trainer.max_steps"))
    ws = int(cfg_get(cfg, "schedule.warmup_steps"))
    Wu = ws if ws > 0 else math.ceil(float(cfg_get(cfg, "schedule.warmup_ratio")) * T)
    if s < Wu:
        return lr * s / max(1, Wu)
    p = (s - Wu) / max(1, T - Wu)
    name = cfg_get(cfg, "schedule.name")
    if name == "cosine":
        f = max(0.0, 0.5 * (1.0 + math.cos(math.pi * p)))
    elif name == "linear":
        f = max(0.0, 1.0 - p)
    elif name == "constant":
        f = 1.0
    else:
        raise ValueError(f"schedule.name={name}: expected cosine, linear or constant")
    mr = float(cfg_get(cfg, "schedule.min_lr_ratio"))
    return lr * (mr + (1.0 - mr) * f)


def make_optimizer(model: torch.nn.Module, cfg: Dict, fused: bool) -> torch.optim.Optimizer:
    """AdamW, two groups from model.registry.decay_flags (dim >= 2, not a bias, not a norm weight:
    decay; the rest not), trainable parameters in named_parameters order."""
    flags = decay_flags(model)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if flags[n]]
    no_decay = [p for n, p in trainable if not flags[n]]
    wd = float(cfg_get(cfg, "optimizer.weight_decay"))
    betas = (float(cfg_get(cfg, "optimizer.beta1")), float(cfg_get(cfg, "optimizer.beta2")))
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if fused else {"foreach": False, "fused": False}
    return torch.optim.AdamW(groups, lr=0.0, betas=betas, eps=float(cfg_get(cfg, "optimizer.eps")), **kw)


def clip_gradients(params: List[Tensor], clip: float) -> Tensor:
    """Section 5 clipping, op by op; returns the total norm before clipping (0-dim tensor).
    `clip / (total + 1e-6)` is evaluated as Python evaluates it (and as
    torch.nn.utils.clip_grad_norm_ does): `(total + 1e-6).reciprocal() * clip`. A true
    division (C++'s `clip / t` = full(clip).div_(t)) can differ in the last bit; the C++
    trainer writes the reciprocal form on purpose."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norms = [torch.linalg.vector_norm(g, 2) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms), 2)
    if clip > 0:
        coef = torch.clamp((total + 1e-6).reciprocal() * clip, max=1.0)
        for g in grads:
            g.mul_(coef)
    return total


def effective_tokens(batch: Dict[str, Tensor], mcfg: ModelConfig) -> int:
    """Effective (non-padding) tokens of a micro-batch, the tokens_per_s numerator, as
    loongforge-train counts them: per sample, the VL tokens (vision tokens of all views +
    imu/audio tokens when the model has them + real text tokens, i.e. text_mask) plus the
    DiT tokens (1 state token + the valid action tokens: rows k with any
    action_mask[k, j] = 1, i.e. not past the episode end). Padding is not counted."""
    B, V = batch["images"].shape[0], batch["images"].shape[1]
    per_sample = V * mcfg.tokens_per_view + (mcfg.imu_tokens if mcfg.use_imu else 0) + \
        (mcfg.audio_tokens if mcfg.use_audio else 0) + 1
    text = int(batch["text_mask"].sum())
    actions = int((batch["action_mask"].amax(dim=-1) > 0).sum())
    return B * per_sample + text + actions


def peak_mem_mb(device: torch.device) -> float:
    """CUDA: max allocated by the caching allocator; CPU: the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def to_device(batch: Dict[str, Tensor], device: torch.device) -> Dict[str, Tensor]:
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# ---------------------------------------------------------------------------- run log


class RunLog:
    """metrics.jsonl, progress lines and summary.json (written by rank 0 only)."""

    def __init__(self, run_dir: Optional[Path], total_steps: int, interval: int, config_text: str):
        self.run_dir, self.total, self.interval = run_dir, total_steps, max(1, interval)
        self.start = time.perf_counter()
        self.records: List[Dict] = []
        self.metrics = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(config_text)
            self.metrics = open(run_dir / "metrics.jsonl", "w")

    def record(self, r: Dict) -> None:
        self.records.append(r)
        if self.metrics is None:
            return
        self.metrics.write(json.dumps({k: r[k] for k in METRIC_KEYS}) + "\n")
        self.metrics.flush()
        s = r["step"]
        if s % self.interval == 0 or s == 1 or s == self.total:
            elapsed = time.perf_counter() - self.start
            eta = elapsed / s * (self.total - s)
            print(f"step {s}/{self.total}  loss {r['loss']:.5g}  lr {r['lr']:.3g}  "
                  f"{r['samples_per_s']:.1f} samples/s  data {r['data_wait_ms']:.1f} ms  "
                  f"elapsed {fmt_duration(elapsed)}  ETA {fmt_duration(eta)}", flush=True)

    @contextlib.contextmanager
    def stop_on_nonfinite(self, extra: Dict):
        """Writes summary.json with status "nonfinite" before a NonFiniteError leaves the run."""
        try:
            yield
        except NonFiniteError as e:
            self.finish({**extra, "status": "nonfinite", "error": str(e)})
            raise

    def finish(self, extra: Dict) -> Dict:
        """mean_samples_per_s = samples / step time over steps 2.. (step 1 warms up), or step 1 alone."""
        wall = time.perf_counter() - self.start
        steady = self.records[1:] or self.records
        samples = sum(r["samples_per_s"] * r["step_ms"] / 1000.0 for r in steady)
        secs = sum(r["step_ms"] / 1000.0 for r in steady)
        summary = {"status": "ok", "steps": len(self.records),
                   "final_loss": self.records[-1]["loss"] if self.records else None,
                   "mean_samples_per_s": samples / secs if secs > 0 else 0.0,
                   "wall_time_s": wall, **extra}
        if self.run_dir is not None:
            self.metrics.close()
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
            print(f"done: {summary['steps']} steps, final loss {summary['final_loss']}, "
                  f"{summary['mean_samples_per_s']:.2f} samples/s, wall {fmt_duration(wall)} "
                  f"-> {self.run_dir}", flush=True)
        return summary


def fmt_duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def check_finite(step: int, loss: float, total: float, cfg: Dict) -> bool:
    """True when the step may update parameters."""
    if math.isfinite(loss) and math.isfinite(total):
        return True
    msg = (f"non-finite at optimizer step {step + 1} (0-based {step}): loss {loss}, grad_norm {total}; "
           "parameters were not updated")
    if bool(cfg_get(cfg, "trainer.stop_on_nonfinite")):
        raise NonFiniteError(msg + " (trainer.stop_on_nonfinite)")
    print(f"warning: {msg}; skipping the update", file=sys.stderr, flush=True)
    return False


# ---------------------------------------------------------------------------- shared setup


def resolve_device(cfg: Dict, local_rank: int = 0) -> torch.device:
    want = cfg_get(cfg, "run.device")
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("run.device=cuda but no GPU is visible; use --set run.device=cpu")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def default_run_dir(cfg: Dict) -> Path:
    return Path(cfg_get(cfg, "run.output_dir")) / (str(cfg_get(cfg, "run.name")) + "-torch")


def flops_per_sample(info: Dict) -> float:
    f = info.get("flops", {})
    return float(f.get("forward_per_sample", 0)) + float(f.get("backward_per_sample", 0))


def step_record(s: int, lr: float, loss: float, total: float, num_valid: float, samples: int, tokens: int,
                data_s: float, step_s: float, device: torch.device, world: int, fps: float) -> Dict:
    """samples_per_s and tokens_per_s are global (all ranks) over this step's wall time;
    mfu = per-GPU model FLOPs/s against 989 TFLOP/s dense bf16, 0 on CPU."""
    sps = samples / step_s if step_s > 0 else 0.0
    mfu = sps / world * fps / PEAK_FLOPS_H200_BF16 if device.type == "cuda" else 0.0
    return {"step": s + 1, "loss": loss, "lr": lr, "grad_norm": total, "num_valid": num_valid,
            "samples_per_s": sps, "tokens_per_s": tokens / step_s if step_s > 0 else 0.0, "mfu": mfu,
            "data_wait_ms": data_s * 1000.0, "step_ms": step_s * 1000.0, "peak_mem_mb": peak_mem_mb(device)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- parity mode


def loss_weights(nv: List[float], V: float, world: int) -> List[float]:
    """Section 5: w_i = V_i * W / V (Python floats), 1/K each when V == 0; V is the job's total."""
    K = len(nv)
    return [n * world / V for n in nv] if V != 0 else [1.0 / K] * K


def parity_step(model, batches: List[Dict[str, Tensor]]) -> Tuple[float, float]:
    """Section 5 forward/backward on one rank: forward all K, then backward(loss_i * w_i) in order.
    -> (step_loss, V), step_loss = sum_i loss_i * w_i accumulated in double, in order
    (as loongforge-train: step_loss += loss.item<double>() * w)."""
    outs = [model(b) for b in batches]
    nv = [float(o["num_valid"]) for o in outs]
    V = sum(nv)
    w = loss_weights(nv, V, 1)
    step_loss = 0.0
    for o, wi in zip(outs, w):
        (o["loss"] * wi).backward()
        step_loss += float(o["loss"].detach()) * wi
    return step_loss, V


def run_parity(cfg: Dict, cfg_text: str, run_dir: Path) -> Dict:
    device = resolve_device(cfg)
    if cfg_get(cfg, "precision.mode") == "bf16":
        print("warning: --mode parity runs fp32; precision.mode=bf16 is ignored", file=sys.stderr)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model, mcfg, info = load_model(cfg_get(cfg, "model.path"))
    model.to(device).train()
    builder = open_builder(cfg_get(cfg, "data.path"), mcfg, cfg, processor=info["processor"])
    builder.sampler(0, 1)   # refuses a dataset smaller than one global batch before any work
    opt = make_optimizer(model, cfg, fused=False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    T = int(cfg_get(cfg, "trainer.max_steps"))
    log = RunLog(run_dir, T, int(cfg_get(cfg, "logging.interval_steps")), cfg_text)
    extra = {"mode": "parity", "device": str(device), "precision": "fp32", "threads": torch.get_num_threads(),
             "world_size": 1}
    with log.stop_on_nonfinite(extra):
        for s in range(T):
            log.record(parity_train_step(s, cfg, model, mcfg, builder, opt, trainable, device,
                                         flops_per_sample(info)))
    return log.finish({**extra, "video_decodes": builder.cache.decodes})


def parity_train_step(s: int, cfg: Dict, model, mcfg: ModelConfig, builder: SampleBuilder, opt,
                      trainable: List[Tensor], device: torch.device, fps: float) -> Dict:
    """Optimizer step s (0-based) exactly as section 5 -> its metrics record."""
    K = int(cfg_get(cfg, "trainer.gradient_accumulation_steps"))
    t0 = time.perf_counter()
    batches = [to_device(builder.micro_batch(s, i, 0, 1), device) for i in range(K)]
    t1 = time.perf_counter()
    lr = lr_at(s, cfg)
    step_loss, V = parity_step(model, batches)
    total = clip_gradients(trainable, float(cfg_get(cfg, "trainer.grad_clip_norm")))
    total_f = float(total)
    if check_finite(s, step_loss, total_f, cfg):
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    opt.zero_grad(set_to_none=True)
    sync(device)
    t2 = time.perf_counter()
    tokens = sum(effective_tokens(b, mcfg) for b in batches)
    return step_record(s, lr, step_loss, total_f, V, builder.B * K, tokens, t1 - t0, t2 - t0, device, 1, fps)


# ---------------------------------------------------------------------------- baseline mode


def dist_env() -> Tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


class Baseline:
    """Everything one rank of the baseline holds: DDP model, loader, optimizer."""

    def __init__(self, cfg: Dict, optimized: bool = False):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.cfg, self.dist = cfg, dist
        self.rank, self.world, local = dist_env()
        self.device = resolve_device(cfg, local)
        if self.world > 1:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                    rank=self.rank, world_size=self.world)
        precision = cfg_get(cfg, "precision.mode")
        self.precision = ("bf16" if self.device.type == "cuda" else "fp32") if precision == "auto" else precision
        bf16 = self.precision == "bf16"

        model, self.mcfg, info = load_model(cfg_get(cfg, "model.path"))
        if bf16:   # GR00T's layout: trainable weights fp32, frozen ones bf16
            for p in model.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(torch.bfloat16)
        model.to(self.device).train()
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.ddp = None
        if self.world > 1:
            self.ddp = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.net = self.ddp if self.ddp is not None else model
        self.optimized = optimized
        if optimized:
            self.net = torch.compile(self.net, mode="reduce-overhead", dynamic=False)
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if bf16 \
            else contextlib.nullcontext
        self.fps = flops_per_sample(info)

        self.builder = open_builder(cfg_get(cfg, "data.path"), self.mcfg, cfg, processor=info["processor"])
        self.builder.sampler(self.rank, self.world)
        self.T = int(cfg_get(cfg, "trainer.max_steps"))
        self.K = int(cfg_get(cfg, "trainer.gradient_accumulation_steps"))
        self.workers = decode_workers(cfg)
        self.loader = torch.utils.data.DataLoader(
            SampleDataset(self.builder),
            batch_sampler=MicroBatchSampler(self.builder, self.rank, self.world, 0, self.T),
            collate_fn=collate_samples, num_workers=self.workers, pin_memory=self.device.type == "cuda",
            persistent_workers=self.workers > 0,
            prefetch_factor=int(cfg_get(cfg, "adfe.prefetch_factor")) if self.workers > 0 else None)
        self.it = iter(self.loader)
        self.opt = make_optimizer(model, cfg, fused=self.device.type == "cuda")
        # CUDA graph trees hand a backward graph's outputs over as .grad; with accumulation the next
        # micro-batch's replay overwrites the memory such a .grad lives in, and adding into it fails
        # ("accessing tensor output of CUDAGraphs that has been overwritten", pytorch/pytorch#169545).
        # Gradients that exist before the first backward are added into in place instead, so the
        # optimized mode with accumulation keeps them allocated and zeroes them after each step.
        self.keep_grads = optimized and self.K > 1 and self.device.type == "cuda"
        if self.keep_grads:
            for p in self.trainable:
                p.grad = torch.zeros_like(p)

    def step(self, s: int) -> Dict:
        cfg, K, device = self.cfg, self.K, self.device
        t0 = time.perf_counter()
        batches = []
        for i in range(K):
            b = next(self.it)
            self.builder.add_draws(b, s, i, self.rank, self.world)
            batches.append(b)
        t1 = time.perf_counter()
        nv = [float(b["action_mask"].sum()) for b in batches]   # = the model's num_valid, known before forward
        V_rank = sum(nv)
        V = V_rank
        if self.world > 1:   # the job's count of valid elements, before any backward
            v = torch.tensor([V_rank], dtype=torch.float64, device=device)
            self.dist.all_reduce(v)
            V = float(v.item())
        w = loss_weights(nv, V, self.world)
        step_loss = torch.zeros((), dtype=torch.float64, device=device)   # sum of loss_i * w_i in double
        for i, b in enumerate(batches):
            sync_ctx = self.ddp.no_sync() if self.ddp is not None and i < K - 1 else contextlib.nullcontext()
            with sync_ctx:
                if self.optimized:
                    torch.compiler.cudagraph_mark_step_begin()
                with self.autocast():
                    out = self.net(to_device(b, device))
                scaled = out["loss"].float() * w[i]
                scaled.backward()
            step_loss += out["loss"].detach().double() * w[i]
        clip = float(cfg_get(cfg, "trainer.grad_clip_norm"))
        if clip > 0:
            total = torch.nn.utils.clip_grad_norm_(self.trainable, clip)
        else:
            total = torch.nn.utils.get_total_norm([p.grad for p in self.trainable if p.grad is not None])
        tokens = sum(effective_tokens(b, self.mcfg) for b in batches)
        stats = torch.stack([step_loss.cpu(), torch.tensor(V_rank, dtype=torch.float64),
                             torch.tensor(float(tokens), dtype=torch.float64)])   # (3,)
        if self.world > 1:   # loss: sum over ranks / W; num_valid and tokens: sums
            stats = stats.to(device)
            self.dist.all_reduce(stats)
            stats = stats.cpu()
        loss_f, total_f = float(stats[0]) / self.world, float(total)
        lr = lr_at(s, cfg)
        if check_finite(s, loss_f, total_f, cfg):
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.opt.step()
        self.opt.zero_grad(set_to_none=not self.keep_grads)
        sync(device)
        t2 = time.perf_counter()
        return step_record(s, lr, loss_f, total_f, float(stats[1]), self.builder.B * K * self.world,
                           int(stats[2]), t1 - t0, t2 - t0, device, self.world, self.fps)

    def close(self) -> None:
        del self.it, self.loader
        if self.world > 1:
            self.dist.destroy_process_group()


def run_baseline(cfg: Dict, cfg_text: str, run_dir: Path, optimized: bool = False,
                 profile_steps: Optional[Tuple[int, int]] = None) -> Dict:
    from kernel_profile import KernelProfile, describe
    prof = KernelProfile(*profile_steps) if profile_steps else None
    bl = Baseline(cfg, optimized)
    try:
        log = RunLog(run_dir if bl.rank == 0 else None, bl.T, int(cfg_get(cfg, "logging.interval_steps")),
                     cfg_text)
        extra = {"mode": "optimized" if optimized else "baseline", "device": str(bl.device),
                 "precision": bl.precision,
                 "threads": torch.get_num_threads(), "world_size": bl.world, "decode_workers": bl.workers}
        with log.stop_on_nonfinite(extra):
            for s in range(bl.T):
                if prof:
                    prof.before(s)
                record = bl.step(s)
                if prof:
                    prof.after(s)
                    if prof.summary() is not None and s == profile_steps[1] - 1 and bl.rank == 0:
                        run_dir.mkdir(parents=True, exist_ok=True)
                        (run_dir / "kernels.json").write_text(json.dumps(prof.summary(), indent=1))
                        print(describe(prof.summary()), flush=True)
                log.record(record)
        return log.finish(extra)
    finally:
        bl.close()


# ---------------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Reference PyTorch trainer (parity reference and baseline).")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="YAML config, as for loongforge-train")
    src.add_argument("--effective-config", metavar="FILE",
                     help="the output of `loongforge-train --print-config` saved earlier, for machines without "
                          "the binary (--set does not apply to it)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (repeatable), passed to loongforge-train --print-config")
    ap.add_argument("--mode", choices=["parity", "baseline", "optimized"], default="parity")
    ap.add_argument("--loongforge-train", default=str(DEFAULT_BINARY), help="loongforge-train binary")
    ap.add_argument("--out", default=None, help="run directory (default <run.output_dir>/<run.name>-torch)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True): on CPU with > 1 thread the per-embodiment "
                         "weight[ids] backward (index_put_ accumulate) is otherwise nondeterministic in the last "
                         "bit; bit parity with loongforge-train then needs the same setting there")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's default, "
                                                         "as loongforge-train)")
    ap.add_argument("--profile-steps", default=None, metavar="A:B",
                    help="baseline / optimized on CUDA: tally the device kernels of steps A..B-1 as `loongforge "
                         "profile-step --kernels` does (scripts/reference/kernel_profile.py) into "
                         "<run dir>/kernels.json and the log; those steps' times include the profiler")
    args = ap.parse_args(argv)
    try:
        if args.effective_config:
            if args.sets:
                raise ValueError("--set needs --config: apply overrides when printing the effective config")
            text = Path(args.effective_config).read_text()
            cfg = yaml.load(text, Loader=_ConfigLoader)
        else:
            cfg, text = effective_config(Path(args.loongforge_train), args.config, args.sets)
        # The command line wins over the config's run.threads / run.deterministic,
        # which loongforge-train applies the same way.
        threads = args.threads or int(cfg_get(cfg, "run.threads"))
        if threads > 0:
            torch.set_num_threads(threads)
        if args.deterministic or bool(cfg_get(cfg, "run.deterministic")):
            torch.use_deterministic_algorithms(True)
        run_dir = Path(args.out) if args.out else default_run_dir(cfg)
        profile = None
        if args.profile_steps:
            if args.mode == "parity":
                raise ValueError("--profile-steps is for --mode baseline or optimized")
            try:
                profile = tuple(int(v) for v in args.profile_steps.split(":"))
                assert len(profile) == 2
            except (ValueError, AssertionError):
                raise ValueError(f"--profile-steps {args.profile_steps}: expected A:B, two step numbers") from None
        if args.mode == "parity":
            run_parity(cfg, text, run_dir)
        else:
            run_baseline(cfg, text, run_dir, optimized=args.mode == "optimized", profile_steps=profile)
    except NonFiniteError as e:
        print(f"train_torch: error: {e}", file=sys.stderr)
        return 3
    except (ValueError, FileNotFoundError, KeyError, DataError) as e:
        print(f"train_torch: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
