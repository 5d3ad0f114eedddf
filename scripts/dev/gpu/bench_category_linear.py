"""GR00T's 7 per-embodiment linears (state encoder 2, action encoder 3, action decoder 2),
forward+backward under CUDA bf16 autocast at batch 32, three ways (issue #11 item 4):
  gather   upstream's W[ids] gather + bmm (model/embodiment.py CategoryLinear, the reference)
  loop     one GEMM per distinct id in a Python loop (ids.unique: a host sync per layer)
  grouped  loongforge::category_linear's segment GEMMs (GroupedCategoryLinear)
at 1, 4 and 32 distinct embodiment ids, for the shapes of each --config.

Usage: python3 scripts/dev/gpu/bench_category_linear.py [--config n16-1b --config n16-3b] [--batch 32]

Each line: median ms of 50 forward+backward passes (CUDA events, scripts/dev/gpu/cuda_timing.py), and
the largest relative difference of the three outputs from gather's. The grouped line also gives
its speed-up over the faster of the other two.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cuda_timing import median_ms  # noqa: E402 -- scripts/dev/gpu/ is the script's own folder
from model.config import get_config  # noqa: E402
from model.embodiment import CategoryLinear, group_category_linears  # noqa: E402
from model.n16 import Embodiment  # noqa: E402


class LoopCategoryLinear(CategoryLinear):
    """One GEMM per distinct id (the rows of that id gathered); syncs with the host for ids.unique()."""

    def forward(self, x, ids):
        out = None
        for e in torch.unique(ids).tolist():
            rows = (ids == e).nonzero().squeeze(1)
            y = x[rows] @ self.weight[e] + self.bias[e]
            if out is None:
                out = y.new_empty(x.shape[0], x.shape[1], y.shape[-1])
            out[rows] = y
        return out


def as_loop(module):
    for m in module.modules():
        for name, child in list(m.named_children()):
            if type(child) is CategoryLinear:
                loop = LoopCategoryLinear.__new__(LoopCategoryLinear)
                torch.nn.Module.__init__(loop)
                loop.weight, loop.bias = child.weight, child.bias
                setattr(m, name, loop)
    return module


def bench_config(name: str, batch: int) -> None:
    cfg = get_config(name)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    emb = Embodiment(cfg).to(dev)
    H, h = cfg.action_horizon, cfg.embodiment_hidden
    state = torch.randn(batch, 1, cfg.max_state_dim, device=dev)
    actions = torch.randn(batch, H, cfg.max_action_dim, device=dev)
    timestep = torch.randint(0, 1000, (batch,), device=dev).float()
    feats = torch.randn(batch, H, h, device=dev, requires_grad=True)
    print(f"{name}: dit_width {cfg.dit_width}, embodiment_hidden {h}, {cfg.num_embodiments} slots, batch {batch}, "
          f"horizon {H}")

    def step(module, ids):
        def run():
            for p in module.parameters():
                p.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                s = module.state_encoder(state, ids)
                a = module.action_encoder(actions, timestep, ids)
                d = module.action_decoder(feats, ids)
            (s.float().mean() + a.float().mean() + d.float().mean()).backward()
            return s, a, d
        return run

    variants = {"gather": emb, "loop": as_loop(Embodiment(cfg).to(dev)), "grouped": Embodiment(cfg).to(dev)}
    group_category_linears(variants["grouped"])
    for v in ("loop", "grouped"):
        variants[v].load_state_dict(emb.state_dict())
    for distinct in (1, 4, 32):
        ids = torch.arange(batch, device=dev) % distinct * (cfg.num_embodiments // distinct)
        outs, times = {}, {}
        for v, module in variants.items():
            run = step(module, ids)
            outs[v] = [t.detach().float() for t in run()]
            times[v] = median_ms(run, 50, warmup=5)
        for v in variants:
            diff = max(((a - b).norm() / b.norm()).item() for a, b in zip(outs[v], outs["gather"]))
            extra = ""
            if v == "grouped":
                best = min(times["gather"], times["loop"])
                extra = f"   {best / times[v]:.2f}x the faster of gather and loop"
            print(f"  {distinct:2d} ids  {v:8s} {times[v]:7.3f} ms   rel diff {diff:.2e}{extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", default=None, help="model config(s) whose shapes to use")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    for name in args.config or ["n16-1b", "n16-3b"]:
        bench_config(name, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
