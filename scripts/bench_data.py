#!/usr/bin/env python3
"""Decoded samples/s of the data paths, side by side in one run, on the CPU:

  - loongforge's plain source (decode and build on the calling thread),
  - ADFE's asynchronous source with N decode threads (adfe.enable),
  - the reference PyTorch trainer's data path (scripts/reference/: a
    DataLoader whose workers decode the same mp4s through the ffmpeg CLI,
    whole videos into a per-worker frame cache, collate, then the
    flow-matching draws in the main process) with N workers,
  - the same DataLoader with torchcodec (LeRobot's decoder) instead of the
    ffmpeg CLI, with N workers: each sample's frame is decoded as
    LeRobot 0.6.1's dataset decodes it (a torchcodec VideoDecoder per video
    file, seek_mode="approximate", kept per worker in an LRU of 100 as
    LeRobot's VideoDecoderCache; get_frames_at(indices=[round(ts * fps)])
    seeks to the keyframe before the frame and decodes up to it; no frame
    cache), then the reference's resize and normalisation (TorchcodecSampleBuilder),

each N of --threads (default 1,2), each from a cold start (the source or
the DataLoader with its workers is made inside the timed region) over the
same micro-batches of the same converted dataset (training-semantics s2
order, seed 42, one rank).

    python3 scripts/bench_data.py [--data DIR] [--micro-batches 20] [--batch 8]
        [--image-size 64] [--repeats 1] [--threads 1,2] [--json OUT] [--no-check]
        [--ffmpeg PROGRAM] [--bench-binary PATH] [--budget-s S]
    python3 scripts/bench_data.py --orders [--frame-cache-mb 2048 ...]

--data takes any converted dataset: the bundled h264 one (the default,
build/test-data/robot_sim.PickNPlace.lf) or the tests' AV1 copy
(build/test-data/robot_sim.PickNPlace.av1.lf, test/data/av1_fixture.cmake);
every row reads both. Before the timed rows, the torchcodec samples of the
first 2 micro-batches are checked against the reference's (--no-check skips
it): all non-image tensors equal, and the frames' max |diff| and PSNR are
printed (not bitwise: another decoder and YUV->RGB conversion).

--orders measures instead the plain source under the uniform and the episode-aware order
(data.sampler=episode, 2 open episodes, a 64-sample buffer) with each frame cache size given:
samples/s and the videos decoded, same micro-batch count.

Caches at their defaults (loongforge 2048 MB of decoded, resized frames
shared by the decode threads; the reference 2 GiB of full-size RGB frames per
worker), so each video is decoded once per cache: a short run (20
micro-batches) is dominated by decoding, a full epoch (262 micro-batches of
8 samples on the bundled dataset) also by building samples. torchcodec keeps
no frames, so its cost per sample is the seek: on the bundled h264 videos
(keyframes 250 frames apart) ~110 frames decoded per sample on average, on
the AV1 copy (-g 2, as LeRobot encodes) at most 2.
The first table's ratios are each row's samples/s over the plain source's,
the reference's and torchcodec's at the largest N (2 by default); a second
table puts ADFE, the reference and torchcodec side by side per N. --repeats N
reports the run at index N // 2 of the N sorted by samples/s (the faster of 2).
The header and --json name the machine's CPUs (os.cpu_count) and the ones this
process may run on (sched_getaffinity), the ffmpeg program the reference runs
and the FFmpeg libraries torchcodec loaded.

The C++ side runs build/test/data/bench_data (built with the tests;
--bench-binary for another build, e.g. build-gpu/test/data/bench_data).
The reference finds `ffmpeg` and `ffprobe` on PATH (lf_dataset.py); --ffmpeg
PROGRAM puts PROGRAM's folder first on PATH, for this process and its
DataLoader workers, and the script refuses to run without both programs (the
reference would fall back to OpenCV; --orders runs the C++ side only). torchcodec comes from
scripts/requirements-test.txt; the CPU wheel loads FFmpeg's shared libraries
through the dynamic loader: the system's, or LD_LIBRARY_PATH's (on the GPU
machine scripts/dev/gpu/build_ffmpeg_bench.sh makes both the programs and the
libraries; scripts/dev/gpu/issue12_decode.sh runs this script there).
--budget-s S cuts the row running S seconds after the script's start (SIGALRM;
a native row's process is killed) and skips the rows after it: the rows done
are still printed and written, the others listed as not run.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "reference"))
from lf_dataset import (LFDataset, MicroBatchSampler, SampleBuilder, SampleDataset, collate_samples,  # noqa: E402
                        have_ffmpeg_cli)


def native(binary, data, kind, threads, args, cache_mb, order=(), video_decode="whole"):
    cmd = [str(binary), str(data), kind, str(threads), "4", str(args.micro_batches), str(args.batch),
           str(args.image_size), str(cache_mb)] + [str(x) for x in order] + [f"video_decode={video_decode}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


MODEL_CFG = {"max_state_dim": 64, "max_action_dim": 64, "max_action_horizon": 16, "num_embodiments": 32,
             "use_imu": False, "use_audio": False, "num_views": 1}


def trainer_cfg(args):
    return {"run": {"seed": 42}, "trainer": {"micro_batch_size": args.batch, "gradient_accumulation_steps": 1},
            "data": {"action_horizon": 16, "max_text_len": 32, "embodiment_id": 0, "shuffle": True,
                     "normalization": "min_max"}}


class TorchcodecSampleBuilder(SampleBuilder):
    """The reference trainer's samples, except that each frame is decoded by torchcodec the way
    LeRobot 0.6.1's dataset decodes it (lerobot/datasets/video_utils.py, backend "torchcodec"):
    one VideoDecoder(seek_mode="approximate") per video file, kept in a per-process LRU of 100
    decoders (LeRobot's VideoDecoderCache default); per sample and camera the query timestamp
    (the presentation time of the frame the reference decodes, video_pts:<key>[video_frame:<key>[t]])
    becomes index round(ts * average_fps), get_frames_at(indices=[...]) seeks to the keyframe before
    it and decodes up to it, and the returned pts must lie within 1/fps - 1e-4 s of the query
    (LeRobot's default tolerance). No frame cache: every sample decodes its own frames. The
    (3, h, w) uint8 frame then goes through the reference's crop/resize/normalisation
    (lf_dataset.image_to_model), so the work after decoding is the same as the reference rows'."""

    DECODERS_KEPT = 100

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._decoders, self._decoders_pid = None, None

    def _decoder(self, path):
        import collections
        from torchcodec.decoders import VideoDecoder
        if self._decoders_pid != os.getpid():          # a DataLoader worker: its own decoders
            self._decoders, self._decoders_pid = collections.OrderedDict(), os.getpid()
        key = str(path)
        dec = self._decoders.get(key)
        if dec is None:
            dec = self._decoders[key] = VideoDecoder(key, seek_mode="approximate")
            while len(self._decoders) > self.DECODERS_KEPT:
                self._decoders.popitem(last=False)
        else:
            self._decoders.move_to_end(key)
        return dec

    def rgb_frame(self, e, camera, t):
        """(h, w, 3) uint8 view of frame video_frame:<key>[t] of episode position e, from torchcodec."""
        path, _ = self.ds.video_file(e, camera["camera_id"])
        frame = int(self.ds.array(e, "video_frame:" + camera["key"])[t, 0])
        ts = float(self.ds.array(e, "video_pts:" + camera["key"])[frame, 0])
        dec = self._decoder(path)
        got = dec.get_frames_at(indices=[round(ts * dec.metadata.average_fps)])
        tolerance = 1.0 / float(camera["fps"]) - 1e-4
        if abs(float(got.pts_seconds[0]) - ts) >= tolerance:
            raise RuntimeError(f"{path}: torchcodec returned pts {float(got.pts_seconds[0]):.4f} s for "
                               f"{ts:.4f} s (tolerance {tolerance:.4f} s)")
        return got.data[0].permute(1, 2, 0).numpy()                                   # (h, w, 3)


def dataloader(data, workers, args, cache_bytes, decoder="ffmpeg"):
    """The reference trainer's data path, cold: builder + DataLoader + workers made inside the timed
    region, the flow-matching draws added in the main process. decoder "ffmpeg": the reference's
    whole-video ffmpeg CLI decode into its per-worker frame cache; "torchcodec": per-sample seeks."""
    import torch

    builder_cls = TorchcodecSampleBuilder if decoder == "torchcodec" else SampleBuilder
    t0 = time.perf_counter()
    builder = builder_cls(LFDataset(str(data)), dict(MODEL_CFG, image_size=args.image_size), trainer_cfg(args),
                          cache_bytes=cache_bytes)
    loader = torch.utils.data.DataLoader(
        SampleDataset(builder), batch_sampler=MicroBatchSampler(builder, 0, 1, 0, args.micro_batches),
        collate_fn=collate_samples, num_workers=workers, persistent_workers=False,
        prefetch_factor=4 if workers > 0 else None)
    n = 0
    for s, b in enumerate(loader):
        builder.add_draws(b, s, 0, 0, 1)
        n += b["images"].shape[0]
    del loader
    seconds = time.perf_counter() - t0
    source = "torchcodec DataLoader" if decoder == "torchcodec" else "reference DataLoader"
    return {"source": source, "threads": workers, "samples": n, "seconds": seconds, "samples_per_s": n / seconds}


def check_torchcodec(data, args, micro_batches=2):
    """torchcodec's frames against the reference path's for the first micro-batches (same sample ids):
    every non-image tensor must be equal; prints the frame differences (uint8 RGB before the resize
    and the model images after it) and the PSNR of the RGB frames."""
    import numpy as np
    import torch

    cfg, mcfg = trainer_cfg(args), dict(MODEL_CFG, image_size=args.image_size)
    ref = SampleBuilder(LFDataset(str(data)), mcfg, cfg)
    tc = TorchcodecSampleBuilder(LFDataset(str(data)), mcfg, cfg)
    rgb_max, sq, count, img_max, samples, frames = 0, 0.0, 0, 0.0, 0, set()
    for i in range(micro_batches):
        for j in ref.micro_batch_indices(i, 0, 0, 1):
            a, b = ref.sample(j), tc.sample(j)
            for k in a:
                if k != "images" and not torch.equal(a[k], b[k]):
                    raise SystemExit(f"bench_data.py: torchcodec sample {j}: {k} differs from the reference's")
            img_max = max(img_max, float((a["images"] - b["images"]).abs().max()))
            e, t = ref.ds.locate(j)
            for c in ref.cameras:
                x = ref.rgb_frame(e, c, t).astype(np.int32)
                y = tc.rgb_frame(e, c, t).astype(np.int32)
                d = x - y
                rgb_max, sq, count = max(rgb_max, int(np.abs(d).max())), sq + float((d * d).sum()), count + d.size
                frames.add((e, int(ref.ds.array(e, "video_frame:" + c["key"])[t, 0])))
            samples += 1
    mse = sq / count
    psnr = float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
    print(f"torchcodec vs reference frames, {samples} samples ({len(frames)} distinct frames, "
          f"{len({e for e, _ in frames})} videos): RGB uint8 max |diff| {rgb_max}, mean squared diff {mse:.3f}, "
          f"PSNR {psnr:.1f} dB; model images ({args.image_size} px, -1..1) max |diff| {img_max:.4f}; "
          "all other sample tensors equal", flush=True)
    return {"samples": samples, "rgb_max_abs_diff": rgb_max, "rgb_mse": mse, "psnr_db": psnr,
            "image_max_abs_diff": img_max}


class RowCut(Exception):
    """Raised by SIGALRM in the main process when --budget-s runs out during a row."""


def within_budget(fn, deadline):
    """fn() with SIGALRM set for the deadline (time.monotonic()); RowCut if it passes. The timer is
    not inherited by DataLoader workers (fork); subprocess.run kills its child on the exception."""
    if deadline is None:
        return fn()
    left = deadline - time.monotonic()
    if left <= 0:
        raise RowCut

    def on_alarm(signum, frame):
        raise RowCut

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def use_ffmpeg(program):
    """Puts PROGRAM's folder first on PATH (inherited by the DataLoader workers), where the reference
    (lf_dataset.have_ffmpeg_cli, decode_ffmpeg) looks for ffmpeg and ffprobe."""
    folder = Path(program).resolve().parent
    for name in ("ffmpeg", "ffprobe"):
        if not os.access(folder / name, os.X_OK):
            sys.exit(f"bench_data.py: --ffmpeg {program}: no executable {folder / name} (the reference runs both)")
    os.environ["PATH"] = str(folder) + os.pathsep + os.environ.get("PATH", "")


def ffmpeg_info():
    """The ffmpeg program the reference rows run and its version line."""
    path = shutil.which("ffmpeg")
    out = subprocess.run([path, "-hide_banner", "-version"], capture_output=True, text=True).stdout
    return {"path": path, "version": (out.splitlines() or ["?"])[0]}


def loaded_ffmpeg_libraries():
    """The FFmpeg shared libraries mapped into this process (torchcodec's, once it is imported)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(x for x in paths if Path(x).name.startswith(("libavcodec.so", "libavformat.so", "libavutil.so",
                                                             "libavfilter.so", "libavdevice.so", "libswscale.so",
                                                             "libswresample.so")))


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
    p.add_argument("--bench-binary", default=str(REPO / "build/test/data/bench_data"))
    p.add_argument("--micro-batches", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration; the median is reported (of an even count, the faster of the middle two)")
    p.add_argument("--threads", default="1,2",
                   help="comma-separated counts: ADFE decode threads, reference and torchcodec DataLoader workers "
                        "(one row each); the first table's ratios are against the largest (default 1,2)")
    p.add_argument("--ffmpeg", help="the ffmpeg program the reference rows run (ffprobe beside it): its folder goes "
                                    "first on PATH (default: ffmpeg on PATH)")
    p.add_argument("--budget-s", type=float, help="cut the row running this many seconds after the start and skip "
                                                  "the rest; the rows done are still reported")
    p.add_argument("--span", action="store_true",
                   help="also ADFE rows with data.video_decode=span (each miss decodes only the keyframe span of "
                   "the frame it needs)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--no-check", action="store_true", help="skip the torchcodec-against-reference frame check")
    p.add_argument("--orders", action="store_true", help="uniform against episode-aware order (plain source)")
    p.add_argument("--frame-cache-mb", type=int, action="append", help="with --orders: cache sizes (default 2048)")
    args = p.parse_args()
    started = time.monotonic()
    deadline = None if args.budget_s is None else started + args.budget_s
    try:
        counts = [int(x) for x in args.threads.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        sys.exit(f"bench_data.py: --threads {args.threads!r}: give distinct counts >= 1, comma-separated (e.g. 1,2,4)")
    top = max(counts)
    cpus, usable = os.cpu_count(), len(os.sched_getaffinity(0))
    if not Path(args.bench_binary).exists():
        sys.exit(f"bench_data.py: {args.bench_binary} not found: cmake --build build --target bench_data")
    if args.orders:
        print("| frame cache MB | order | samples/s | videos decoded | frames decoded |")
        print("|---|---|---|---|---|")
        for mb in args.frame_cache_mb or [2048]:
            for name, order in (("uniform", ()), ("episode (2 open, buffer 64)", ("episode", 2, 64))):
                runs = sorted((native(args.bench_binary, args.data, "sync", 0, args, mb, order)
                               for _ in range(args.repeats)), key=lambda r: r["samples_per_s"])
                r = runs[len(runs) // 2]
                print(f"| {mb} | {name} | {r['samples_per_s']:.1f} | {r['videos_decoded']} | {r['frames_decoded']} |",
                      flush=True)
        print(f"\nmachine: {platform.node()}, {cpus} CPUs ({usable} usable); {args.micro_batches} micro-batches x "
              f"{args.batch} samples, {args.image_size} px, median of {args.repeats}")
        return
    native_mb, ref_bytes = 2048, 2 << 30
    if args.ffmpeg:
        use_ffmpeg(args.ffmpeg)
    if not have_ffmpeg_cli():
        sys.exit("bench_data.py: no ffmpeg and ffprobe on PATH, which the reference rows run (without them "
                 "lf_dataset.py falls back to OpenCV): install FFmpeg or pass --ffmpeg PROGRAM")
    ffmpeg = ffmpeg_info()
    try:
        import torchcodec
    except ImportError:
        sys.exit("bench_data.py: torchcodec is not installed: pip install -r scripts/requirements-test.txt")
    tc_libs = loaded_ffmpeg_libraries()
    tc_avcodec = next((x for x in tc_libs if Path(x).name.startswith("libavcodec")), "none mapped")
    print(f"data: {args.data}; torchcodec {torchcodec.__version__} on {tc_avcodec}; reference ffmpeg "
          f"{ffmpeg['path']} ({ffmpeg['version']}); {cpus} CPUs, {usable} usable by this process; "
          f"counts {','.join(map(str, counts))}", flush=True)
    check = None
    if not args.no_check:
        try:
            check = within_budget(lambda: check_torchcodec(args.data, args), deadline)
        except RowCut:
            print(f"torchcodec check cut at the budget ({args.budget_s:.0f} s)", flush=True)

    configs = [("loongforge plain (sync)", lambda: native(args.bench_binary, args.data, "sync", 0, args, native_mb))]
    configs += [(f"loongforge ADFE, {plural(n, 'decode thread')}",
                 lambda n=n: native(args.bench_binary, args.data, "adfe", n, args, native_mb)) for n in counts]
    if args.span:
        configs += [(f"loongforge ADFE span, {plural(n, 'decode thread')}",
                     lambda n=n: native(args.bench_binary, args.data, "adfe", n, args, native_mb, (), "span"))
                    for n in counts]
    configs += [(f"reference DataLoader, {plural(n, 'worker')}", lambda n=n: dataloader(args.data, n, args, ref_bytes))
                for n in counts]
    configs += [(f"torchcodec DataLoader, {plural(n, 'worker')}",
                 lambda n=n: dataloader(args.data, n, args, ref_bytes, "torchcodec")) for n in counts]
    rows, not_run = [], []
    for name, fn in configs:
        if not_run:
            not_run.append(name)
            continue
        t0 = time.monotonic()
        try:
            runs = sorted((within_budget(fn, deadline) for _ in range(args.repeats)), key=lambda r: r["samples_per_s"])
        except RowCut:
            print(f"{name:36s} cut at the budget ({args.budget_s:.0f} s) after {time.monotonic() - t0:.1f} s; "
                  "the rows after it are skipped", flush=True)
            not_run.append(name)
            continue
        r = runs[len(runs) // 2]
        r["name"] = name
        rows.append(r)
        print(f"{name:36s} {r['samples_per_s']:9.1f} samples/s  ({r['samples']} samples in {r['seconds']:.2f} s)",
              flush=True)
    by_name = {r["name"]: r["samples_per_s"] for r in rows}
    ref_top = f"reference DataLoader, {plural(top, 'worker')}"
    tc_top = f"torchcodec DataLoader, {plural(top, 'worker')}"

    def ratio(x, name):
        return f"{x / by_name[name]:.2f}x" if name in by_name else "n/a"

    load = os.getloadavg()[0]
    print(f"\nmachine: {platform.node()}, {cpus} CPUs ({usable} usable by this process), "
          f"{platform.processor() or platform.machine()}; "
          f"{args.micro_batches} micro-batches x {args.batch} samples, {args.image_size} px; "
          f"load average {load:.2f} at the end; data {Path(args.data).name}")
    print(f"| path | samples/s | vs plain | vs reference, {plural(top, 'worker')} | "
          f"vs torchcodec, {plural(top, 'worker')} |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['samples_per_s']:.1f} | {ratio(r['samples_per_s'], 'loongforge plain (sync)')} | "
              f"{ratio(r['samples_per_s'], ref_top)} | {ratio(r['samples_per_s'], tc_top)} |")
    for name in not_run:
        print(f"| {name} | not run (budget) | | | |")
    kinds = [("ADFE", "loongforge ADFE")] + ([("ADFE span", "loongforge ADFE span")] if args.span else [])
    print("\n| threads / workers | " + " | ".join(f"{k} samples/s" for k, _ in kinds) + " | reference | torchcodec | " +
          " | ".join(f"{k} / reference | {k} / torchcodec" for k, _ in kinds) + " |")
    print("|---|" + "---|" * (3 * len(kinds) + 2))
    for n in counts:
        ours = [by_name.get(f"{prefix}, {plural(n, 'decode thread')}") for _, prefix in kinds]
        ref_n, tc_n = f"reference DataLoader, {plural(n, 'worker')}", f"torchcodec DataLoader, {plural(n, 'worker')}"
        cells = [f"{by_name[k]:.1f}" if k in by_name else "n/a" for k in (ref_n, tc_n)]
        vs = [f"{'n/a' if a is None else ratio(a, ref_n)} | {'n/a' if a is None else ratio(a, tc_n)}" for a in ours]
        print(f"| {n} | " + " | ".join("n/a" if a is None else f"{a:.1f}" for a in ours) +
              f" | {cells[0]} | {cells[1]} | " + " | ".join(vs) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "data": str(args.data), "check": check, "rows": rows, "not_run": not_run,
            "machine": {"node": platform.node(), "cpu_count": cpus, "usable_cpus": usable,
                        "processor": platform.processor() or platform.machine(), "load_average_end": load},
            "counts": counts, "micro_batches": args.micro_batches, "batch": args.batch, "image_size": args.image_size,
            "repeats": args.repeats, "budget_s": args.budget_s, "bench_binary": str(args.bench_binary),
            "ffmpeg": ffmpeg, "torchcodec": {"version": torchcodec.__version__, "ffmpeg_libraries": tc_libs},
            "seconds": time.monotonic() - started}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
