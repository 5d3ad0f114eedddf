"""The optimizer's memory-bandwidth floor on this GPU (issue #43 item 5).

The floor of one AdamW step is the bytes it must move divided by the GPU's copy bandwidth:
  - bf16 working copies (precision.bf16_weights, the GPU default) with bf16 gradients, per trainable
    parameter: read fp32 master, bf16 gradient, fp32 m and v (14 B); write fp32 master, m, v and the
    bf16 working copy (14 B); plus the gradient norm's read of the bf16 gradient (2 B): 30 B;
  - fp32 parameters: read p, g, m, v (16 B), write p, m, v (12 B), norm read (4 B): 32 B.
The copy bandwidth is measured here: a device-to-device copy of a large buffer (bytes read + written per
second, the median of CUDA-event timings). Prints one JSON line: the bandwidth, and for --params N the
floor in ms for both layouts, and with --copies C (how many of them are bf16 working copies; the run
line's "bf16 working copies" count of elements) the floor of that mix, so a trainer's measured optimizer
time (profile-step's optimizer phase) can be stated as a multiple of it.
  python3 scripts/dev/gpu/optimizer_floor.py --params 1.6205e9 --copies 1.2927e9
"""
import argparse
import json

import torch

from cuda_timing import median_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, required=True, help="trainable parameters")
    ap.add_argument("--copies", type=float, default=None, help="of them, bf16 working copies (elements)")
    ap.add_argument("--gib", type=float, default=4.0, help="size of the copied buffer (GiB)")
    a = ap.parse_args()
    n = int(a.gib * (1 << 30)) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), iters=20, warmup=3)
    bw = 2 * 4 * n / (ms / 1e3)  # bytes read + written per second
    out = {"gpu": torch.cuda.get_device_name(), "copy_gib": a.gib, "copy_ms": round(ms, 3),
           "copy_bandwidth_gb_per_s": round(bw / 1e9, 1), "params": a.params}
    for name, per in (("bf16_copies", 30), ("fp32", 32)):
        out[f"floor_ms_{name}"] = round(per * a.params / bw * 1e3, 2)
    if a.copies is not None:
        out["copies"] = a.copies
        out["floor_ms_mixed"] = round((30 * a.copies + 32 * (a.params - a.copies)) / bw * 1e3, 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
