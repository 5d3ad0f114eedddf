"""The device kernels of some of the reference trainer's steps, tallied as
`loongforge profile-step --kernels` tallies loongforge-train's (train_torch.py
--profile-steps A:B; docs/benchmarks.md).

    prof = KernelProfile(first=60, end=76)
    for s in range(steps):
        prof.before(s); step(s); prof.after(s)
    summary = prof.summary()     # None until step end - 1 has run

- torch.profiler with CUDA activity only records the kernels of steps [first, end);
  each kernel's device time and launches are summed per name, then per kind.
- kind_of(name) is src/trainer/cuda_activity.cpp's kind_of, the same rules in the
  same order (first match wins), so the two trainers' tables compare kind by kind.
- summary(): {"steps", "kernel_ms_per_step", "launches_per_step", "by_kind": {kind:
  {"ms_per_step", "launches_per_step"}}, "top": [{"name", "kind", "ms_per_step",
  "launches_per_step"}] (the 25 with the most device time)}.
- Needs a CUDA device: the profiler's CUDA activity is what is counted.
"""
from typing import Dict, Optional

import torch


def kind_of(name: str) -> str:
    """What a device kernel is, by its name (cuda_activity.cpp's rules, first match wins)."""
    def has(*parts):
        return any(p in name for p in parts)
    if has("flash", "fmha", "attention", "sdpa"):
        return "attention"
    if has("nvjet", "gemm", "cutlass", "xmma", "cublas"):
        return "gemm"
    if name.startswith("triton_"):
        return "triton"
    if has("layer_norm", "rms_norm", "LayerNorm"):
        return "norm"
    if has("reduce", "Reduce"):
        return "reduction"
    if has("copy", "Copy"):
        return "copy"
    if has("elementwise", "Elementwise", "vectorized"):
        return "elementwise"
    if has("multi_tensor", "fused_adam", "FusedAdam"):
        return "optimizer"
    return "other"


class KernelProfile:
    def __init__(self, first: int, end: int):
        if not 0 <= first < end:
            raise ValueError(f"--profile-steps {first}:{end}: needs 0 <= A < B")
        if not torch.cuda.is_available():
            raise ValueError("--profile-steps counts CUDA kernels and needs a CUDA device")
        self.first, self.end = first, end
        self._prof = None
        self._summary: Optional[Dict] = None

    def before(self, step: int) -> None:
        if step == self.first:
            torch.cuda.synchronize()
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._prof.__enter__()

    def after(self, step: int) -> None:
        if step == self.end - 1 and self._prof is not None:
            torch.cuda.synchronize()
            self._prof.__exit__(None, None, None)
            self._summary = self._tally(self._prof)
            self._prof = None

    def _tally(self, prof) -> Dict:
        steps = self.end - self.first
        names: Dict[str, list] = {}
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA or "memcpy" in e.name.lower() \
                    or "memset" in e.name.lower():
                continue
            t = names.setdefault(e.name, [0.0, 0])
            t[0] += e.device_time_total / 1000.0   # us -> ms
            t[1] += 1
        kinds: Dict[str, list] = {}
        for name, (ms, n) in names.items():
            k = kinds.setdefault(kind_of(name), [0.0, 0])
            k[0] += ms
            k[1] += n
        top = sorted(names.items(), key=lambda kv: -kv[1][0])[:25]
        return {"steps": steps,
                "kernel_ms_per_step": sum(v[0] for v in names.values()) / steps,
                "launches_per_step": sum(v[1] for v in names.values()) / steps,
                "by_kind": {k: {"ms_per_step": v[0] / steps, "launches_per_step": v[1] / steps}
                            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])},
                "top": [{"name": n[:160], "kind": kind_of(n), "ms_per_step": v[0] / steps,
                         "launches_per_step": v[1] / steps} for n, v in top]}

    def summary(self) -> Optional[Dict]:
        return self._summary


def describe(summary: Dict) -> str:
    """A few lines for the log."""
    lines = [f"kernels over {summary['steps']} steps: {summary['kernel_ms_per_step']:.2f} ms and "
             f"{summary['launches_per_step']:.0f} launches per step"]
    lines += [f"  {k:12} {v['ms_per_step']:8.2f} ms {v['launches_per_step']:7.0f} launches"
              for k, v in summary["by_kind"].items()]
    lines += [f"  {t['ms_per_step']:8.2f} ms {t['launches_per_step']:5.0f} x [{t['kind']}] {t['name'][:100]}"
              for t in summary["top"][:12]]
    return "\n".join(lines)
