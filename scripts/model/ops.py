"""Loads LoongForge's custom operators (libloongforge_ops.so: include/loongforge/ops/ops.hpp)
into this Python process, so model code can call torch.ops.loongforge.* exactly as
loongforge-train runs them.

    from model import ops
    ops.load()                       # idempotent; raises with the fix when the library is missing
    torch.ops.loongforge.category_linear(x, weight, bias, ids)

The library is $LOONGFORGE_OPS_LIBRARY when set, else the newest build*/src/ops/libloongforge_ops.so
of this checkout (scripts/setup.sh builds build/; the GPU scripts build-gpu/)."""
import os
from pathlib import Path
from typing import Optional

import torch

REPO = Path(__file__).resolve().parents[2]
LIBRARY = "libloongforge_ops.so"
_loaded: Optional[Path] = None


def library_path() -> Path:
    env = os.environ.get("LOONGFORGE_OPS_LIBRARY")
    if env:
        p = Path(env)
        if not p.is_file():
            raise RuntimeError(f"LOONGFORGE_OPS_LIBRARY={env}: no such file (build the target loongforge_ops)")
        return p
    found = sorted(REPO.glob(f"build*/src/ops/{LIBRARY}"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not found:
        raise RuntimeError(f"LoongForge's operator library {LIBRARY} was not found under {REPO}/build*/src/ops/: "
                           "build it (`cmake --build build --target loongforge_ops`, scripts/setup.sh does) "
                           "or point LOONGFORGE_OPS_LIBRARY at it")
    return found[0]


def load() -> Path:
    """Loads the library once per process; returns its path."""
    global _loaded
    if _loaded is None:
        path = library_path()
        torch.ops.load_library(str(path))
        _loaded = path
    return _loaded


def load_if_built() -> bool:
    """load() when the library exists (before torch.jit.load of a model file that may call
    loongforge:: operators); False when it was not built. A library that fails to load raises."""
    try:
        library_path()
    except RuntimeError:
        return False
    load()
    return True
