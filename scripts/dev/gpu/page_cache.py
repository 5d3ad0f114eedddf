"""Puts the shared libraries a GPU run maps out of (or into) the page cache, for attributing a first step.

    python3 scripts/dev/gpu/page_cache.py evict [--list FILE]
    python3 scripts/dev/gpu/page_cache.py read

The libraries: every .so under torch's package, the nvidia-* wheels' packages, /usr/local/cuda*/ and
build-gpu/, and the driver's libcuda. `evict` asks the kernel to drop their cached pages (posix_fadvise DONTNEED: a
file's pages still mapped by a running process stay); `read` reads them whole and prints the time and
rate (the storage's, for pages that were not cached). Both print the file count and bytes, and
`--list FILE` writes the paths.
"""
import argparse
import glob
import os
import sys
import time


def candidates() -> list[str]:
    import importlib.util

    spec = importlib.util.find_spec("torch")  # its install location, without importing it
    roots = glob.glob("/usr/local/cuda*/")
    if spec and spec.origin:
        torch_dir = os.path.dirname(spec.origin)
        roots += [torch_dir] + glob.glob(os.path.join(os.path.dirname(torch_dir), "nvidia"))
    roots += [os.path.join(os.path.dirname(__file__), "../../../build-gpu")]
    files = set()
    for r in roots:
        for dirpath, _, names in os.walk(r):
            files.update(os.path.join(dirpath, n) for n in names if ".so" in n)
    files.update(glob.glob("/usr/lib/x86_64-linux-gnu/libcuda.so*"))
    return sorted(os.path.realpath(p) for p in files if os.path.isfile(p))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["evict", "read"])
    ap.add_argument("--list")
    args = ap.parse_args()
    files = candidates()
    total = sum(os.path.getsize(p) for p in files)
    t0 = time.perf_counter()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            if args.action == "evict":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 16 << 20):
                    pass
        finally:
            os.close(fd)
    dt = time.perf_counter() - t0
    if args.list:
        with open(args.list, "w") as f:
            f.write("\n".join(files) + "\n")
    rate = f", {total / dt / 1e9:.2f} GB/s" if args.action == "read" else ""
    print(f"{args.action}: {len(files)} files, {total / 1e9:.2f} GB in {dt:.2f} s{rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
