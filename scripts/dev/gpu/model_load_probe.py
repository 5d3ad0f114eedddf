"""Where a model file's load goes (issue #43 item 6, time to the first step): the parts of what
loongforge-train's "model" startup phase does (Model::load = torch::jit::load onto the device, then the
frozen weights cast to bf16), timed one by one on this machine, in one process:
  read      the file's bytes into memory (the storage's read speed; page cache as it is)
  load_cpu  torch.jit.load(map_location="cpu")
  to_cuda   that module's parameters and buffers to the GPU (Module.to)
  load_cuda torch.jit.load(map_location="cuda") (what the trainer does)
  pinned    the same bytes host to device from pinned memory (the copy's floor)
Prints one JSON line.
  python3 scripts/dev/gpu/model_load_probe.py /dev/shm/g17d0.pt
"""
import json
import os
import sys
import time

import torch


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, round(time.perf_counter() - t, 3)


def main() -> int:
    path = sys.argv[1]
    out = {"gpu": torch.cuda.get_device_name(), "file_gb": round(os.path.getsize(path) / 1e9, 2)}
    with open(path, "rb") as f:
        _, out["read_s"] = timed(f.read)
    m, out["load_cpu_s"] = timed(lambda: torch.jit.load(path, map_location="cpu"))
    tensors = list(m.parameters()) + list(m.buffers())
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    out["tensors"], out["tensor_gb"] = len(tensors), round(nbytes / 1e9, 2)
    _, out["to_cuda_s"] = timed(lambda: m.to("cuda"))
    del m
    torch.cuda.empty_cache()
    m, out["load_cuda_s"] = timed(lambda: torch.jit.load(path, map_location="cuda"))
    del m
    torch.cuda.empty_cache()
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    _, out["pinned_h2d_s"] = timed(lambda: dev.copy_(host, non_blocking=True))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
