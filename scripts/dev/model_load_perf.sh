#!/usr/bin/env bash
# Where a TorchScript file's load goes on the CPU (Note [Staged model load] in src/model/staged_load.cpp):
# writes a scripted module of 48 fp32 tensors of 4096x4096 (3.2 GB) to /dev/shm, times torch.jit.load of it,
# then records it under `perf` and prints the top symbols (the kernel's page faults on the fresh memory
# lead). Needs perf and 7 GB of free memory; removes the file at the end.
#   bash scripts/dev/model_load_perf.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=$(cat "$repo/build/python-path" 2>/dev/null || echo python3)
file=/dev/shm/lf-model-load-perf.pt
maker=$(mktemp --suffix=.py)  # torch.jit.script reads the class's source: a file, not standard input
trap 'rm -f "$file" "$maker" /tmp/lf-model-load.perf' EXIT
cat > "$maker" <<'PY'
import sys, torch
class Big(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4096, 4096)) for _ in range(48)])
    def forward(self, x):
        return x
torch.jit.script(Big()).save(sys.argv[1])
PY
"$python" "$maker" "$file"
load="import sys, time, torch; t = time.perf_counter(); torch.jit.load(sys.argv[1]); print(f'torch.jit.load: {time.perf_counter() - t:.2f} s')"
"$python" -c "$load" "$file"
perf record -q -g -o /tmp/lf-model-load.perf "$python" -c "$load" "$file"
perf report -i /tmp/lf-model-load.perf --no-children --sort symbol 2>/dev/null | grep -E "^ +[0-9.]+%" | head -8
