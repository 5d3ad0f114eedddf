"""Which bad call of loongforge's custom operators crashes the process instead of raising
(python_masked_patch_embed_gpu's bad-argument cases died with SIGSEGV on the GPU machine, sessions 54-55).

Each case runs in a child process; its exit code and last line are printed:
  rc 0 and "raised: ..." : the operator's error came back as a Python RuntimeError
  rc -11                 : the process died of a segmentation fault while the error was thrown
Cases: masked_patch_embed with CPU tensors and with CUDA tensors; category_linear's bad call likewise;
a plain libtorch TORCH_CHECK (torch.ops.aten) for comparison.

  PYTHONPATH=scripts python3 scripts/dev/gpu/op_throw_probe.py
"""
import subprocess
import sys

CASES = {
    "aten, cuda": "torch.ops.aten.mm(torch.ones(2, 3, device='cuda'), torch.ones(2, 3, device='cuda'))",
    "masked_patch_embed, cpu": "torch.ops.loongforge.masked_patch_embed(torch.ones(3, 8, 8), torch.ones(5, 3, 4, 4), "
                               "None, torch.ones(1, 2, dtype=torch.long))",
    "masked_patch_embed, cuda": "torch.ops.loongforge.masked_patch_embed(torch.ones(3, 8, 8, device='cuda'), "
                                "torch.ones(5, 3, 4, 4, device='cuda'), None, "
                                "torch.ones(1, 2, dtype=torch.long, device='cuda'))",
    "category_linear, cpu": "torch.ops.loongforge.category_linear(torch.ones(4, 9), torch.ones(2, 10, 3), torch.zeros(2, 3), "
                            "torch.zeros(4, dtype=torch.long))",
    "category_linear, cuda": "torch.ops.loongforge.category_linear(torch.ones(4, 9, device='cuda'), "
                             "torch.ones(2, 10, 3, device='cuda'), torch.zeros(2, 3, device='cuda'), "
                             "torch.zeros(4, dtype=torch.long, device='cuda'))",
}
BODY = """
import torch
from model import ops
ops.load()
try:
    {call}
    print("no error")
except Exception as e:
    print("raised:", type(e).__name__, str(e).splitlines()[0][:160])
"""

# Which C++ runtime the process maps once torch and the operator library are loaded (two copies of
# libstdc++ or libgcc_s, or a library of another compiler's, are the usual cause of a throw that crashes).
MAPS = r"""
import torch
from model import ops
print("library", ops.load())
libs = set()
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if any(k in path for k in ("libstdc++", "libgcc_s", "libc10.so", "libloongforge_ops", "libcudart")):
        libs.add(path)
print("mapped:", *sorted(libs), sep="\n  ")
"""
r = subprocess.run([sys.executable, "-c", MAPS], capture_output=True, text=True, timeout=120)
print(r.stdout.strip() or r.stderr.strip()[-500:])
lib = next((l.split()[1] for l in r.stdout.splitlines() if l.startswith("library")), None)
if lib:
    ldd = subprocess.run(["ldd", lib], capture_output=True, text=True)
    print("ldd (C++ runtime, torch, CUDA):", *[l.strip() for l in ldd.stdout.splitlines()
                                             if any(k in l for k in ("stdc++", "gcc_s", "c10", "torch", "cudart"))],
          sep="\n  ")

for name, call in CASES.items():
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", BODY.format(call=call)],
                       capture_output=True, text=True, timeout=120)
    last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or [""])[-1]
    print(f"{name:28s} rc {r.returncode:4d}  {last[:200]}")
