#!/usr/bin/env python3
"""Decoded samples/s of the data paths, side by side in one run, on the CPU:

  - loongforge's plain source (decode and build on the calling thread),
  - ADFE's asynchronous source with 1 and 2 decode threads (adfe.enable),
  - the reference PyTorch trainer's data path (scripts/reference/: a
    DataLoader whose workers decode the same mp4s through the ffmpeg CLI,
    collate, then the flow-matching draws in the main process) with 1 and 2
    workers,

each from a cold start (the source or the DataLoader with its workers is
made inside the timed region) over the same micro-batches of the same
converted dataset (training-semantics s2 order, seed 42, one rank).

    python3 scripts/bench_data.py [--data DIR] [--micro-batches 20] [--batch 8]
        [--image-size 64] [--repeats 1] [--json OUT]
    python3 scripts/bench_data.py --orders [--frame-cache-mb 2048 ...]

--orders measures instead the plain source under the uniform and the episode-aware order
(data.sampler=episode, 2 open episodes, a 64-sample buffer) with each frame cache size given:
samples/s and the videos decoded, same micro-batch count.

Caches at their defaults (loongforge 2048 MB of decoded, resized frames
shared by the decode threads; the reference 2 GiB of full-size RGB frames per
worker), so each video is decoded once per cache: a short run (20
micro-batches) is dominated by decoding, a full epoch (262 micro-batches of
8 samples on the bundled dataset) also by building samples.
The C++ side runs build/test/data/bench_data (built with the tests).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "reference"))


def native(binary, data, kind, threads, args, cache_mb, order=()):
    cmd = [str(binary), str(data), kind, str(threads), "4", str(args.micro_batches), str(args.batch),
           str(args.image_size), str(cache_mb)] + [str(x) for x in order]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def reference(data, workers, args, cache_bytes):
    import torch
    from lf_dataset import LFDataset, MicroBatchSampler, SampleBuilder, SampleDataset, collate_samples

    model_cfg = {"image_size": args.image_size, "max_state_dim": 64, "max_action_dim": 64, "max_action_horizon": 16,
                 "num_embodiments": 32, "use_imu": False, "use_audio": False, "num_views": 1}
    cfg = {"run": {"seed": 42}, "trainer": {"micro_batch_size": args.batch, "gradient_accumulation_steps": 1},
           "data": {"action_horizon": 16, "max_text_len": 32, "embodiment_id": 0, "shuffle": True,
                    "normalization": "min_max"}}
    t0 = time.perf_counter()
    builder = SampleBuilder(LFDataset(str(data)), model_cfg, cfg, cache_bytes=cache_bytes)
    loader = torch.utils.data.DataLoader(
        SampleDataset(builder), batch_sampler=MicroBatchSampler(builder, 0, 1, 0, args.micro_batches),
        collate_fn=collate_samples, num_workers=workers, persistent_workers=False,
        prefetch_factor=4 if workers > 0 else None)
    n = 0
    for s, b in enumerate(loader):
        b.update(builder.fm_draws(s, 0, 0, 1))
        n += b["images"].shape[0]
    del loader
    seconds = time.perf_counter() - t0
    return {"source": "reference DataLoader", "threads": workers, "samples": n, "seconds": seconds,
            "samples_per_s": n / seconds}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
    p.add_argument("--bench-binary", default=str(REPO / "build/test/data/bench_data"))
    p.add_argument("--micro-batches", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration; the median is reported")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--orders", action="store_true", help="uniform against episode-aware order (plain source)")
    p.add_argument("--frame-cache-mb", type=int, action="append", help="with --orders: cache sizes (default 2048)")
    args = p.parse_args()
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
        print(f"\nmachine: {platform.node()}, {os.cpu_count()} CPUs; {args.micro_batches} micro-batches x "
              f"{args.batch} samples, {args.image_size} px, median of {args.repeats}")
        return
    native_mb, ref_bytes = 2048, 2 << 30

    configs = [("loongforge plain (sync)", lambda: native(args.bench_binary, args.data, "sync", 0, args, native_mb)),
               ("loongforge ADFE, 1 decode thread",
                lambda: native(args.bench_binary, args.data, "adfe", 1, args, native_mb)),
               ("loongforge ADFE, 2 decode threads",
                lambda: native(args.bench_binary, args.data, "adfe", 2, args, native_mb)),
               ("reference DataLoader, 1 worker", lambda: reference(args.data, 1, args, ref_bytes)),
               ("reference DataLoader, 2 workers", lambda: reference(args.data, 2, args, ref_bytes))]
    rows = []
    for name, fn in configs:
        runs = sorted((fn() for _ in range(args.repeats)), key=lambda r: r["samples_per_s"])
        r = runs[len(runs) // 2]
        r["name"] = name
        rows.append(r)
        print(f"{name:36s} {r['samples_per_s']:9.1f} samples/s  ({r['samples']} samples in {r['seconds']:.2f} s)",
              flush=True)
    base = rows[0]["samples_per_s"]
    ref2 = rows[4]["samples_per_s"]
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
          f"{args.micro_batches} micro-batches x {args.batch} samples, {args.image_size} px; "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print("| path | samples/s | vs plain | vs reference, 2 workers |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / base:.2f}x | "
              f"{r['samples_per_s'] / ref2:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
