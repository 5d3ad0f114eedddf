"""Samples one benchmark run from outside, the same way for every trainer (issue #41's harness).

    monitor.py --pid PID --metrics FILE --out FILE.jsonl [--interval 0.2]

Until process PID exits, every --interval seconds it appends one JSON line:
    t                 wall clock (time.time())
    lines             records in the run's metrics.jsonl so far (one per finished step), so the
                      report can tell when each step ended and when the first one did
    host_pss_mb       the process tree's proportional set size (PSS, so pages that DataLoader
                      workers share are counted once), falling back to RSS where smaps is unreadable
    procs             processes in the tree
    gpu_util          NVML's utilisation of GPU 0 (% of the sample period a kernel ran)
    gpu_mem_mb        GPU 0's used memory (all processes; the report subtracts the idle value)
    gpu_proc_mem_mb   the memory NVML attributes to the tree's processes (None if NVML cannot
                      see them, e.g. in another PID namespace)
On a machine without NVML (the CPU dry run) the GPU fields are null.
"""
import argparse
import json
import os
import time


def tree(psutil, pid):
    try:
        p = psutil.Process(pid)
        return [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def host_mb(procs):
    total, fallback = 0.0, False
    for p in procs:
        try:
            try:
                total += p.memory_full_info().pss
            except (AttributeError, PermissionError, OSError):
                total += p.memory_info().rss
                fallback = True
        except Exception:   # the process ended between listing and reading
            pass
    return total / 2**20, fallback


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    args = ap.parse_args(argv)
    import psutil
    nv, handle = None, None
    try:
        import pynvml as nv
        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        nv, handle = None, None
    with open(args.out, "w") as out:
        while psutil.pid_exists(args.pid):
            procs = tree(psutil, args.pid)
            if not procs:
                break
            mb, fallback = host_mb(procs)
            rec = {"t": time.time(), "lines": count_lines(args.metrics), "host_pss_mb": mb,
                   "host_rss_fallback": fallback, "procs": len(procs),
                   "gpu_util": None, "gpu_mem_mb": None, "gpu_proc_mem_mb": None}
            if handle is not None:
                try:
                    rec["gpu_util"] = nv.nvmlDeviceGetUtilizationRates(handle).gpu
                    rec["gpu_mem_mb"] = nv.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                    pids = {p.pid for p in procs}
                    used = [q.usedGpuMemory for q in nv.nvmlDeviceGetComputeRunningProcesses(handle)
                            if q.pid in pids and q.usedGpuMemory is not None]
                    rec["gpu_proc_mem_mb"] = sum(used) / 2**20 if used else None
                except Exception as e:  # keep sampling the host side
                    rec["nvml_error"] = str(e)[:200]
            out.write(json.dumps(rec) + "\n")
            out.flush()
            time.sleep(args.interval)
        out.write(json.dumps({"t": time.time(), "lines": count_lines(args.metrics), "exited": True}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
