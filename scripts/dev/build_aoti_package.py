#!/usr/bin/env python3
"""Builds the host library of a C++-only AOTInductor package, here, into a package
the trainer loads (trainer.compiled_step).

    python3 scripts/dev/build_aoti_package.py IN.pt2 OUT.pt2 [--opt-level O0]

IN is what `scripts/compile_step.py --cpp-only` wrote (on the machine that trains:
its kernels are compiled there); OUT is IN plus the library built from IN's
generated wrapper source and objects, so OUT is what compile_step.py without
--cpp-only would have written. Why: for n16-3b the wrapper's C++ compile alone
runs for more than 236 s of a device call (docs/benchmarks.md, 2026-12-01), while
the CPU machine's time is not rationed. (libtorch's package loader would build a
missing library itself, at load time: in the training run, where it costs the
same.)

Contract
- IN's compile and link flags (the *_compile_flags.json / *_linker_flags.json
  AOTInductor records) are used as recorded, except paths into the recording
  machine's Python and torch installation: include and library folders under a
  `.../site-packages/torch/` or a Python include folder are replaced by this
  machine's (the same torch version is required: refused otherwise, naming both),
  and `--opt-level` (default: as recorded) replaces the -O flag; a recorded
  compiler that is not here is replaced by $CXX (default g++).
- OUT is written atomically (OUT.partial, then renamed); IN is not modified.
- The package keeps its metadata (compile_step.py's manifest), so the trainer's
  checks of model, precision and device apply unchanged.
"""
import argparse
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

import torch
from torch._inductor.cpp_builder import BuildOptionsBase, CppBuilder
from torch.utils import cpp_extension

def fail(msg: str) -> None:
    print(f"build_aoti_package: error: {msg}", file=sys.stderr)
    sys.exit(2)


def local_paths(paths, kind):
    """Paths of the recording machine's torch / Python installation mapped to this machine's."""
    ours = {"include": cpp_extension.include_paths(), "lib": cpp_extension.library_paths()}[kind]
    torch_root = str(Path(torch.__file__).parent)
    py_include = sysconfig.get_paths()["include"]
    out = []
    for p in paths:
        m = re.search(r"site-packages/torch(/.*)?$", p)
        if m:
            q = torch_root + (m.group(1) or "")
            out.append(q if os.path.isdir(q) else p)
        elif re.search(r"/include/python3\.\d+$", p):
            out.append(py_include)
        else:
            out.append(p)
    for p in ours:  # this torch's own folders, in case the recording named others
        if p not in out:
            out.append(p)
    return out


def build_options(path: Path, opt_level: str):
    flags = json.loads(path.read_text())
    flags.pop("use_relative_path", None)  # set by the builder itself
    if flags.get("compiler") and not shutil.which(flags["compiler"]):  # another machine's path (/opt/gcc/bin/g++)
        flags["compiler"] = os.environ.get("CXX", "g++")
    if "include_dirs" in flags:
        flags["include_dirs"] = local_paths(flags["include_dirs"], "include")
    if "libraries_dirs" in flags:
        flags["libraries_dirs"] = local_paths(flags["libraries_dirs"], "lib")
    if opt_level and "cflags" in flags:
        flags["cflags"] = [opt_level if re.fullmatch(r"O[0-3s]", c) else c for c in flags["cflags"]]
    return BuildOptionsBase(**flags)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", help="a package written by scripts/compile_step.py --cpp-only")
    ap.add_argument("out", help="the package to write (.pt2)")
    ap.add_argument("--opt-level", choices=["O0", "O1", "O2", "O3"], default="",
                    help="the wrapper's optimisation level (default: as recorded in the package)")
    args = ap.parse_args()
    src, out = Path(args.package), Path(args.out)
    try:
        with zipfile.ZipFile(src) as z:
            names = z.namelist()
            work = Path(tempfile.mkdtemp(prefix="aoti-build-"))
            z.extractall(work)
    except (OSError, zipfile.BadZipFile) as e:
        fail(f"{src}: not a package ({e.__class__.__name__}: {e})")
    model_dirs = sorted({m.group(0) for m in (re.match(r".*?/data/aotinductor/[^/]+", n) for n in names) if m})
    if len(model_dirs) != 1:
        fail(f"{src}: expected one model under data/aotinductor/ in the archive, found {model_dirs or 'none'}")
    mdir = work / model_dirs[0]
    files = sorted(p.name for p in mdir.iterdir())
    if any(f.endswith(".so") for f in files):
        fail(f"{src}: already holds a built library ({[f for f in files if f.endswith('.so')]}); nothing to build")
    wrappers = [f for f in files if f.endswith(".wrapper.cpp")]
    if len(wrappers) != 1:
        fail(f"{src}: expected one *.wrapper.cpp (a --cpp-only package), found {wrappers or 'none'}")
    for f in (f for f in files if f.endswith("_metadata.json")):
        manifest = json.loads((mdir / f).read_text()).get("loongforge")
        recorded = json.loads(manifest).get("torch") if manifest else None
        if recorded and recorded != torch.__version__:
            fail(f"{src} was generated with torch {recorded}, this machine has {torch.__version__}: its wrapper "
                 "must be built against the torch it was generated with")
    stem = mdir / wrappers[0][: -len(".cpp")]
    for suffix in ("_compile_flags.json", "_linker_flags.json"):
        if not Path(str(stem) + suffix).exists():
            fail(f"{src}: {stem.name}{suffix} missing; was it written by compile_step.py --cpp-only?")
    t0 = time.time()
    obj = CppBuilder(name=str(stem), sources=str(stem) + ".cpp",
                     BuildOption=build_options(Path(str(stem) + "_compile_flags.json"), args.opt_level))
    obj.build()
    objects = [str(mdir / f) for f in files if f.endswith(".o")]
    lib = CppBuilder(name=stem.name, sources=[obj.get_target_file_path()] + objects,
                     BuildOption=build_options(Path(str(stem) + "_linker_flags.json"), ""), output_dir=str(mdir))
    lib.build()
    so = Path(lib.get_target_file_path())
    built_s = time.time() - t0
    tmp = out.with_name(out.name + ".partial")
    with zipfile.ZipFile(tmp, "w") as z:
        for n in names:
            if n.endswith("/"):
                continue
            z.write(work / n, n)
        z.write(so, str(so.relative_to(work)))
    os.replace(tmp, out)
    print(f"built {so.name} ({so.stat().st_size / 1e6:.1f} MB) in {built_s:.0f} s -> {out} "
          f"({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
