"""Median milliseconds of a GPU callable by CUDA events, shared by the scripts/dev/gpu/ measurements."""
import statistics

import torch


def median_ms(fn, iters: int, warmup: int = 0) -> float:
    """Runs fn `warmup` times, then `iters` times each between two CUDA events; returns the median ms."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)
