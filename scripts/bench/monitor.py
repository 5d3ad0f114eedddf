"""Samples one benchmark run from outside, the same way for every trainer (issue #41's harness).

    monitor.py --pid PID --metrics FILE --out FILE.jsonl [--interval 0.2]
               [--warm W --steady K [--exclude-json FILE --exclude-max N]] [--budget S]

Until process PID exits, every --interval seconds it appends one JSON line:
    t                 wall clock (time.time())
    lines             records in the run's metrics.jsonl so far (one per finished step), so the
                      report can tell when each step ended and when the first one did
    host_pss_mb       the process tree's proportional set size (PSS, so pages that DataLoader
                      workers share are counted once), falling back to RSS where smaps is unreadable
    procs             processes in the tree
    cpu_pct           the tree's CPU time since the previous sample over the wall clock between them, in
                      % of one core (user + system; null on the first sample)
    top_thread_pct    the same for the busiest single thread of the tree (a step held on the host by one
                      Python thread shows near 100 here while the GPU idles), and top_thread its
                      "pid/tid name" (the thread's own name where Linux gives it, else its process's)
    gpu_util          NVML's utilisation of GPU 0 (% of the sample period a kernel ran)
    gpu_mem_mb        GPU 0's used memory (all processes; the report subtracts the idle value)
    gpu_proc_mem_mb   the memory NVML attributes to the tree's processes (None if NVML cannot
                      see them, e.g. in another PID namespace)
On a machine without NVML (the CPU dry run) the GPU fields are null.

The stop rule (the harness's measure-based window): with --steady K, once the run has K steady-state
steps (steps after the first W, less those inside the window that --exclude-json names with
first_step / last_step, i.e. a `loongforge profile-step` window; while that file is missing, stopping
waits for it until the run is N = --exclude-max steps past W + K), the monitor ends the run: with
--stop-signal TERM (the default) it sends SIGTERM to PID (the `timeout` wrapper forwards it to the
trainer's process group; the Python trainers end on it), with KILL it sends SIGKILL to every process of
PID's tree (loongforge-train answers SIGTERM by writing a final checkpoint, which for gr00t-n1.7-3b on the
first GPU run had not finished 30 s after the stop; its metrics are written step by step, so nothing the
report reads is lost). With --budget S it does the same S seconds after its start if the
rule has not fired. Its last line records {"stop": "steady" | "budget" | null,
"stop_step": the last step recorded when it fired, "steady_steps": K counted then}.
"""
import argparse
import json
import os
import signal
import time


def tree(psutil, pid):
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:   # ended, not yet reaped by its parent
            return []
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


def thread_name(pid, tid):
    """The thread's own name (Linux: /proc/PID/task/TID/comm, e.g. a DataLoader's or PyTorch's worker), or None."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip() or None
    except OSError:
        return None


class HostCpu:
    """CPU use of a process tree between two samples: the tree's total and its busiest thread's."""

    def __init__(self):
        self.t = None
        self.procs = {}     # pid -> user + system seconds
        self.threads = {}   # (pid, tid) -> user + system seconds

    def sample(self, procs):
        now, per_proc, per_thread, names = time.time(), {}, {}, {}
        for p in procs:
            try:
                c = p.cpu_times()
                per_proc[p.pid] = c.user + c.system
                name = p.name()
                for th in p.threads():
                    per_thread[(p.pid, th.id)] = th.user_time + th.system_time
                    names[(p.pid, th.id)] = name
            except Exception:   # the process ended between listing and reading
                pass
        rec = {"cpu_pct": None, "top_thread_pct": None, "top_thread": None}
        if self.t is not None and now > self.t:
            dt = now - self.t
            # a process or thread new since the last sample counts from 0 (its whole time is recent)
            rec["cpu_pct"] = 100.0 * sum(max(0.0, v - self.procs.get(k, 0.0)) for k, v in per_proc.items()) / dt
            deltas = {k: max(0.0, v - self.threads.get(k, 0.0)) for k, v in per_thread.items()}
            if deltas:
                top = max(deltas, key=deltas.get)
                rec["top_thread_pct"] = 100.0 * deltas[top] / dt
                rec["top_thread"] = f"{top[0]}/{top[1]} {thread_name(*top) or names[top]}"
        self.t, self.procs, self.threads = now, per_proc, per_thread
        return rec


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def stop_run(psutil, pid, how):
    """SIGTERM to pid, or SIGKILL to pid's tree, children first."""
    if how == "TERM":
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return
    for p in reversed(tree(psutil, pid)):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def read_steps(path):
    """The step numbers recorded in a metrics.jsonl so far (a line being written is skipped)."""
    steps = []
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    steps.append(int(json.loads(line)["step"]))
                except (ValueError, KeyError, TypeError):
                    pass
    except OSError:
        pass
    return steps


def excluded_window(path):
    """(first_step, last_step) of a profile window's JSON, or None while it is missing or incomplete."""
    try:
        with open(path) as f:
            p = json.load(f)
        return int(p["first_step"]), int(p["last_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def steady_count(steps, warm, window):
    return sum(1 for s in steps if s > warm and not (window and window[0] <= s <= window[1]))


def should_stop(steps, warm, steady, window, exclude_pending, exclude_max):
    """True when the run has `steady` steady-state steps; a pending exclusion window holds the stop back
    until the run is exclude_max steps past warm + steady."""
    if steady <= 0 or steady_count(steps, warm, window) < steady:
        return False
    if exclude_pending and window is None:
        return bool(steps) and max(steps) >= warm + steady + exclude_max
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--warm", type=int, default=0, help="warm-up steps (not counted as steady)")
    ap.add_argument("--steady", type=int, default=0, help="stop the run once it has this many steady steps (0: never)")
    ap.add_argument("--exclude-json", default=None, help="a JSON with first_step/last_step to leave out of the count")
    ap.add_argument("--exclude-max", type=int, default=0, help="steps the stop waits for a missing --exclude-json")
    ap.add_argument("--budget", type=float, default=0.0, help="stop the run this many seconds after the start (0: never)")
    ap.add_argument("--stop-signal", choices=("TERM", "KILL"), default="TERM",
                    help="TERM: SIGTERM to --pid; KILL: SIGKILL to every process of its tree")
    args = ap.parse_args(argv)
    t_start = time.time()
    stop, stop_step, n_steady = None, None, None
    import psutil
    nv, handle = None, None
    try:
        import pynvml as nv
        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        nv, handle = None, None
    cpu = HostCpu()
    with open(args.out, "w") as out:
        while psutil.pid_exists(args.pid):
            procs = tree(psutil, args.pid)
            if not procs:
                break
            mb, fallback = host_mb(procs)
            rec = {"t": time.time(), "lines": count_lines(args.metrics), "host_pss_mb": mb,
                   "host_rss_fallback": fallback, "procs": len(procs),
                   "gpu_util": None, "gpu_mem_mb": None, "gpu_proc_mem_mb": None, **cpu.sample(procs)}
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
            if stop is None and (args.steady > 0 or args.budget > 0):
                steps = read_steps(args.metrics)
                window = excluded_window(args.exclude_json) if args.exclude_json else None
                why = None
                if should_stop(steps, args.warm, args.steady, window, bool(args.exclude_json), args.exclude_max):
                    why = "steady"
                elif args.budget > 0 and time.time() - t_start > args.budget:
                    why = "budget"
                if why:
                    stop, stop_step, n_steady = why, (max(steps) if steps else 0), steady_count(steps, args.warm, window)
                    out.write(json.dumps({"t": time.time(), "stop": stop, "stop_step": stop_step,
                                          "steady_steps": n_steady}) + "\n")
                    out.flush()
                    stop_run(psutil, args.pid, args.stop_signal)
            time.sleep(args.interval)
        out.write(json.dumps({"t": time.time(), "lines": count_lines(args.metrics), "exited": True, "stop": stop,
                              "stop_step": stop_step, "steady_steps": n_steady}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
