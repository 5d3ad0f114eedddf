"""Part (b) of the headline benchmark: scripts/reference/train_torch.py, run unchanged, with the time
of each step's phases written beside its metrics.jsonl.

    ref_phases.py --phases FILE -- <train_torch.py arguments>   (--mode baseline or optimized)

Three names are wrapped from outside, nothing of the trainer is edited: the module's `to_device`
(its first call in a step marks the end of the data wait: the micro-batches are fetched and their
draws added), torch.nn.utils.clip_grad_norm_ (forward+backward of every micro-batch ends there) and a
global optimizer step post-hook (the update ends there). On CUDA the marks are CUDA events on the
current stream, read after the trainer's own end-of-step synchronisation, so no synchronisation is
added; on the CPU the host clock. Per step FILE gets {step, fwd_bwd_ms, optimizer_ms}.
"""
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reference"))
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--phases" or args[2] != "--":
        raise SystemExit("usage: ref_phases.py --phases FILE -- <train_torch.py arguments>")
    out = open(args[1], "w")
    import torch
    import train_torch as tt

    marks, state = {}, {"step": 0, "started": False}
    cuda = torch.cuda.is_available()

    def mark(name):
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            marks[name] = e
        else:
            marks[name] = time.perf_counter()

    def ms(a, b):
        if a not in marks or b not in marks:
            return None
        if cuda:
            marks[b].synchronize()
            return marks[a].elapsed_time(marks[b])
        return (marks[b] - marks[a]) * 1000.0

    orig_to_device = tt.to_device

    def to_device(batch, device):
        if not state["started"]:
            state["started"] = True
            mark("start")
        return orig_to_device(batch, device)

    orig_clip = torch.nn.utils.clip_grad_norm_

    def clip(*a, **k):
        mark("clip")
        return orig_clip(*a, **k)

    orig_step = tt.Baseline.step

    def step(self, s):
        state["started"] = False
        marks.clear()
        rec = orig_step(self, s)
        out.write(json.dumps({"step": rec["step"], "fwd_bwd_ms": ms("start", "clip"),
                              "optimizer_ms": ms("clip", "optimizer_end")}) + "\n")
        out.flush()
        return rec

    tt.to_device = to_device
    torch.nn.utils.clip_grad_norm_ = clip
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(lambda opt, a, k: mark("optimizer_end"))
    tt.Baseline.step = step
    return tt.main(args[3:])


if __name__ == "__main__":
    sys.exit(main())
