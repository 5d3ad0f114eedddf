"""The headline benchmark's dataset (issue #41): the bundled PickNPlace episodes replicated to N
episodes with varied task texts and crops, in the LeRobot format each trainer reads.

    make_dataset.py replicate --src CARRY_DATA --codec h264|av1 --episodes N --out DIR
        A LeRobot v2.1 dataset at DIR (per-episode parquet and mp4, meta/info.json, episodes.jsonl,
        tasks.jsonl, episodes_stats.jsonl from LeRobot's own statistics functions (the camera's from
        its sampled, decoded frames, as compute_episode_stats computes them), plus
        Isaac-GR00T's modality.json and stats.json, which scripts/convert_lerobot.py reads).
        Episode i is the carried source episode e = i % S (S = 5) in that codec's variant number
        (i // S) % K_e of the K_e carried for e (prepare_carry.sh encoded them on the CPU machine;
        the GPU machine has no encoder): its mp4 is a real copy of the variant's file (not a link, so that every
        episode is its own file on disk and is read cold after the page cache is dropped), its
        parquet the source rows with episode_index, index and task ids renumbered and timestamps
        written as LeRobot's recorder writes them (frame_index / fps, the video's own frame times;
        see below), and its task text one of TASK_FORMS filled with the source episode's object
        (4 to 20 words).
        Timestamps: the bundled Isaac-GR00T parquet files start at 1/fps (0.05 s) while their videos'
        first frame is at 0. LeRobot's reader looks a row's frame up by its timestamp, so on those
        rows it would read each row's next frame, and past an episode's end the next episode's first
        frame (in a shared v3.0 file) or a frame that does not exist (IndexError at the end of a
        file: check-v30 found it). scripts/convert_lerobot.py measures and removes such an offset
        itself, so every trainer reads the same frame for each row either way.
        Needs lerobot on the path (compute_episode_stats).

    make_dataset.py v30 --root DIR [--max-file-s 240]
        LeRobot 0.6.1's own v2.1 -> v3.0 conversion (lerobot/scripts/convert_dataset_v21_to_v30.py,
        convert_dataset, offline): DIR becomes the v3.0 dataset lerobot-train reads, DIR_old the
        v2.1 one that scripts/convert_lerobot.py converts for the other trainers (the same
        episodes, rows and frames). The converter concatenates episodes into shared mp4s until a
        file would reach its video_file_size_in_mb (LeRobot's default 200 MB holds 3.5 hours of
        these 256 x 256 h264 episodes); that argument is set here from the dataset's own bytes
        per second of video so that a file holds about --max-file-s seconds, as a recording of
        full-size frames does at LeRobot's default size. Why it matters: LeRobot's torchcodec
        path compares query and decoded timestamps as float32 tensors against a 1e-4 s
        tolerance, and float32 spacing passes 1e-4 s from 1024 s into a file (2048 s onwards:
        2.4e-4), so long files fail with FrameTimestampError. Data files keep LeRobot's default
        size (their timestamps restart with every episode). Prints each video file's length and
        refuses a file longer than 512 s.

    make_dataset.py check-v30 --root DIR [--per-file 3]
        Reads, through LeRobot's own LeRobotDataset (its default decoder and 1e-4 s tolerance),
        the first frame of each video file's last episode and the last --per-file - 1 frames of
        the file: the latest timestamps of every file, where a float32 tolerance error would be.

    make_dataset.py check-ref --lf DIR
        Decodes the first episode's video with the reference trainer's own reader
        (scripts/reference/lf_dataset.py decode_video: the ffmpeg CLI, else OpenCV, else PyAV)
        and says which path it took (run with scripts/reference on PYTHONPATH).
"""
import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

CAMERA = "observation.images.ego_view"
OBJECTS = ["squash", "ketchup", "candle", "bar", "spray"]   # the source episodes' objects, in order
TASK_FORMS = [
    "pick the {o} from the counter and place it in the plate",
    "grab the {o} and put it on the plate",
    "pick up the {o}",
    "take the {o} off the counter, then set it down gently in the middle of the plate",
    "move the {o} to the plate",
    "lift the {o} from the kitchen counter and place it carefully on the white plate next to the sink",
    "put the {o} in the plate",
    "reach for the {o} with the right hand, pick it up from the counter and drop it into the plate",
    "place the {o} on the plate",
    "the {o} is on the counter: pick it up and place it in the plate without touching anything else",
    "carry the {o} to the plate",
    "pick the {o} and place it in the plate, then move the arm back to its resting position",
]


def replicate(src: Path, codec: str, n: int, out: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lerobot.datasets.compute_stats import compute_episode_stats

    manifest = json.loads((src / "variants.json").read_text())
    files = {(v["variant"], v["episode"]): src / v["file"] for v in manifest["videos"] if v["codec"] == codec}
    if not files:
        raise SystemExit(f"{src}/variants.json: no {codec} videos; run scripts/bench/prepare_carry.sh")
    variants = sorted({k for k, _ in files})
    of_episode = {e: sorted(k for k, f in files if f == e) for e in {f for _, f in files}}
    info = json.loads((src / "meta/info.json").read_text())
    sources = sorted(p for p in (src / "data").glob("episode_*.parquet"))
    S = len(sources)
    tables = [pq.read_table(p) for p in sources]
    if out.exists():
        shutil.rmtree(out)
    (out / "meta").mkdir(parents=True)
    # tasks: index 0 is "valid" (the source's annotation.human.validity task), then the varied texts
    rng = random.Random(41)
    tasks, task_of = ["valid"], []
    for i in range(n):
        text = rng.choice(TASK_FORMS).format(o=OBJECTS[i % S])
        if text not in tasks:
            tasks.append(text)
        task_of.append(tasks.index(text))
    feats = {k: v for k, v in info["features"].items() if v["dtype"] not in ("video", "image")}
    vstats = {}

    def video_stats(path):
        """LeRobot's per-episode camera statistics (compute_episode_stats' image branch: its sampled
        frames, per channel, divided by 255), from the variant's decoded frames."""
        if path not in vstats:
            import av
            from lerobot.datasets.compute_stats import get_feature_stats, sample_indices
            with av.open(str(path)) as c:
                frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
            arr = np.stack([frames[j] for j in sample_indices(len(frames))]).transpose(0, 3, 1, 2)
            st = get_feature_stats(arr, axis=(0, 2, 3), keepdims=True)
            vstats[path] = {k: (v if k == "count" else np.squeeze(v / 255.0, axis=0)) for k, v in st.items()}
        return vstats[path]
    t0, index, episodes, stats_lines, total = time.perf_counter(), 0, [], [], 0
    chunk_size = int(info.get("chunks_size", 1000))
    fps = float(info["fps"])
    for i in range(n):
        e = i % S
        if e not in of_episode:
            raise SystemExit(f"{src}/variants.json: no {codec} video of source episode {e}")
        k = of_episode[e][(i // S) % len(of_episode[e])]
        t = tables[e]
        L = t.num_rows
        cols = {name: t.column(name) for name in t.column_names}
        cols["episode_index"] = pa.array(np.full(L, i, dtype=np.int64))
        cols["index"] = pa.array(np.arange(index, index + L, dtype=np.int64))
        cols["timestamp"] = pa.array(np.arange(L, dtype=np.float64) / fps).cast(t.schema.field("timestamp").type)
        cols["task_index"] = pa.array(np.full(L, task_of[i], dtype=np.int64))
        if "annotation.human.action.task_description" in cols:
            cols["annotation.human.action.task_description"] = pa.array(np.full(L, task_of[i], dtype=np.int64))
        if "annotation.human.validity" in cols:
            cols["annotation.human.validity"] = pa.array(np.zeros(L, dtype=np.int64))
        table = pa.table([cols[c] for c in t.column_names], names=t.column_names)
        chunk = i // chunk_size
        dpath = out / f"data/chunk-{chunk:03d}/episode_{i:06d}.parquet"
        dpath.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, dpath)
        vpath = out / f"videos/chunk-{chunk:03d}/{CAMERA}/episode_{i:06d}.mp4"
        vpath.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[(k, e)], vpath)
        data = {}
        for name in feats:
            col = table.column(name)
            data[name] = (np.stack(col.to_numpy(zero_copy_only=False)) if str(col.type).startswith("list")
                          else col.to_numpy())
        st = compute_episode_stats(data, feats)
        st[CAMERA] = video_stats(files[(k, e)])
        stats_lines.append(json.dumps({"episode_index": i, "stats": {f: {s: np.asarray(v).tolist() for s, v in d.items()}
                                                                     for f, d in st.items()}}))
        episodes.append({"episode_index": i, "tasks": [tasks[task_of[i]], "valid"], "length": L})
        index += L
        total += L
    # info.json: v2.1, only the camera that has files (the 800 x 1280 egoview feature has none), its codec
    info["codebase_version"] = "v2.1"
    info["features"] = {k: v for k, v in info["features"].items()
                        if v["dtype"] not in ("video", "image") or k == CAMERA}
    info["features"][CAMERA]["video_info"]["video.codec"] = codec
    info.update(total_episodes=n, total_frames=total, total_tasks=len(tasks), total_videos=n,
                total_chunks=(n - 1) // chunk_size + 1, splits={"train": f"0:{n}"})
    (out / "meta/info.json").write_text(json.dumps(info, indent=4))
    (out / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (out / "meta/tasks.jsonl").write_text("".join(json.dumps({"task_index": j, "task": s}) + "\n"
                                                  for j, s in enumerate(tasks)))
    (out / "meta/episodes_stats.jsonl").write_text("\n".join(stats_lines) + "\n")
    for name in ("modality.json", "stats.json"):
        shutil.copyfile(src / "meta" / name, out / "meta" / name)
    words = [len(s.split()) for s in tasks[1:]]
    print(f"replicate: {n} episodes ({total} frames, {len(tasks) - 1} task texts of {min(words)}-{max(words)} words, "
          f"{codec} variants {variants} over {S} source episodes) -> {out} in {time.perf_counter() - t0:.1f} s")


MAX_FILE_S_HARD = 512.0   # float32 spacing is 6.1e-5 s from 512 s, 1.2e-4 s (over the tolerance) from 1024 s


def video_seconds(path: Path) -> float:
    """A video's length from its stream header (PyAV), as LeRobot's get_video_duration_in_s reads it."""
    import av
    with av.open(str(path)) as c:
        st = c.streams.video[0]
        if st.duration is not None and st.time_base is not None:
            return float(st.duration * st.time_base)
        return float(c.duration) / 1e6


def video_file_size_mb(root: Path, max_file_s: float) -> int:
    """The converter's video_file_size_in_mb for files of about max_file_s seconds: the v2.1 videos'
    bytes per second of video times max_file_s (whole MB, at least 1: the converter's argument is an int)."""
    info = json.loads((root / "meta/info.json").read_text())
    fps = float(info["fps"])
    lengths = [json.loads(x)["length"] for x in (root / "meta/episodes.jsonl").read_text().splitlines() if x.strip()]
    size = sum(p.stat().st_size for p in (root / "videos").glob("*/*/*.mp4"))
    seconds = sum(lengths) / fps
    return max(1, int(size / 2**20 / seconds * max_file_s))


def v30(root: Path, max_file_s: float) -> None:
    from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset
    t0 = time.perf_counter()
    old = root.parent / f"{root.name}_old"
    if old.exists():
        shutil.rmtree(old)
    mb = video_file_size_mb(root, max_file_s)
    convert_dataset(repo_id="local/" + root.name, root=str(root), push_to_hub=False, video_file_size_in_mb=mb)
    info = json.loads((root / "meta/info.json").read_text())
    files = sorted((root / "videos").glob("*/*/*.mp4"))
    lengths = {f: video_seconds(f) for f in files}
    longest = max(lengths, key=lengths.get)
    data_files = sorted((root / "data").glob("*/*.parquet"))
    print(f"v30: LeRobot's convert_dataset(video_file_size_in_mb={mb}) -> {root} (codebase {info['codebase_version']}, "
          f"{info['total_episodes']} episodes, {info['total_frames']} frames) in {time.perf_counter() - t0:.1f} s; "
          f"{len(files)} video files of {min(lengths.values()):.1f}-{lengths[longest]:.1f} s "
          f"(longest {longest.relative_to(root)}), {len(data_files)} data file(s); v2.1 kept at {old}")
    if lengths[longest] > MAX_FILE_S_HARD:
        raise SystemExit(f"v30: {longest} runs {lengths[longest]:.1f} s, over {MAX_FILE_S_HARD:.0f} s: LeRobot's float32 "
                         f"timestamp check fails past 1024 s; lower --max-file-s (now {max_file_s:g})")


def check_v30(root: Path, per_file: int) -> None:
    """LeRobotDataset reads the latest frames of every video file without a FrameTimestampError."""
    import pandas as pd
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    t0 = time.perf_counter()
    ds = LeRobotDataset("local/" + root.name, root=root)
    eps = pd.concat([pd.read_parquet(p) for p in sorted((root / "meta/episodes").glob("*/*.parquet"))])
    cam = ds.meta.video_keys[0]
    eps["file"] = list(zip(eps[f"videos/{cam}/chunk_index"], eps[f"videos/{cam}/file_index"]))
    items, latest = 0, 0.0
    for f, group in eps.groupby("file", sort=True):
        last = group.sort_values("episode_index").iloc[-1]
        lo, hi = int(last["dataset_from_index"]), int(last["dataset_to_index"])
        idx = [lo] + list(range(max(lo + 1, hi - (per_file - 1)), hi))
        for i in idx:
            item = ds[i]   # raises FrameTimestampError where the tolerance check fails
            assert item[cam].shape[0] == 3, item[cam].shape
            items += 1
        latest = max(latest, float(last[f"videos/{cam}/to_timestamp"]))
    print(f"check-v30: LeRobotDataset ({ds.meta.info.get('codebase_version')}, decoder "
          f"{getattr(ds, '_video_backend', '?')}, tolerance {getattr(ds, 'tolerance_s', '?')} s) "
          f"read {items} items at the ends of {eps['file'].nunique()} video files (up to {latest:.1f} s into a file) "
          f"without a timestamp error in {time.perf_counter() - t0:.1f} s")


def check_ref(lf: Path) -> None:
    """The reference trainer's reader decodes the first episode's video; which path it took."""
    import warnings
    import lf_dataset
    m = json.loads((lf / "loongforge_dataset.json").read_text())
    v = m["episodes"][0]["videos"][0]
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        video = lf_dataset.decode_video(lf / v["file"], int(v["frame_count"]))
    how = "the ffmpeg CLI" if lf_dataset.have_ffmpeg_cli() else "its fallback (" + "; ".join(
        str(x.message)[:80] for x in w) + ")"
    print(f"check-ref: the reference's decode_video read {v['file']} ({v['codec']}, {v['frame_count']} frames, "
          f"{video.pix_fmt}) with {how} in {time.perf_counter() - t0:.2f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replicate")
    r.add_argument("--src", type=Path, required=True)
    r.add_argument("--codec", choices=("h264", "av1"), required=True)
    r.add_argument("--episodes", type=int, default=600)
    r.add_argument("--out", type=Path, required=True)
    v = sub.add_parser("v30")
    v.add_argument("--root", type=Path, required=True)
    v.add_argument("--max-file-s", type=float, default=240.0)
    c = sub.add_parser("check-v30")
    c.add_argument("--root", type=Path, required=True)
    c.add_argument("--per-file", type=int, default=3)
    f = sub.add_parser("check-ref")
    f.add_argument("--lf", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "replicate":
        replicate(args.src, args.codec, args.episodes, args.out)
    elif args.cmd == "v30":
        v30(args.root, args.max_file_s)
    elif args.cmd == "check-v30":
        check_v30(args.root, args.per_file)
    else:
        check_ref(args.lf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
