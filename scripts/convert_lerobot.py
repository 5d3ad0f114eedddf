#!/usr/bin/env python3
"""Convert a LeRobot dataset (v2.0/v2.1, Isaac-GR00T flavour, or v3.0) into LoongForge shards.

    convert_lerobot.py SRC DST [--episodes 0,3] [--embodiment-tag gr1] [--tokenizer tokenizer.json] ...

DST gets (byte layout: docs/shard-format.md):
    loongforge_dataset.json   metadata: features, modality groups, cameras,
                              stats, tasks with token ids, episode table
    shard-00000.lfshard ...   numeric columns as flat little-endian arrays,
                              64-byte aligned, CRC32 per record, an index
    videos/...                the camera mp4s, copied byte for byte; from a v3.0
                              dataset, each episode's packets cut out of the shared
                              video by stream copy (Note [LeRobot v3.0] in
                              lerobot_convert/source.py)

Videos are never re-encoded; there is no --reencode option. A video with an
unsupported codec stops the conversion with the ffmpeg command to fix it.

Everything is validated before DST appears: the output is built in a
temporary folder beside DST and renamed at the end, so a failed run leaves
no DST behind. Exit status: 0 success, 1 dataset error, 2 usage error.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

kScriptsDir = Path(__file__).resolve().parent
if str(kScriptsDir) not in sys.path:
    sys.path.insert(0, str(kScriptsDir))

from lerobot_convert import ConvertError, fail  # noqa: E402
from lerobot_convert import shard as sh  # noqa: E402
from lerobot_convert import aspect, source, video  # noqa: E402

kDatasetFormat = "loongforge-dataset"
kDatasetFormatVersion = 1
kDatasetJson = "loongforge_dataset.json"
kShardName = "shard-{:05d}.lfshard"
kDefaultMaxShardBytes = 1 << 30
kDefaultMaxTextTokens = 32  # = data.max_text_len default in include/loongforge/config/keys.def
# robot_type (info.json) -> GR00T embodiment tag, used when --embodiment-tag is not given
kEmbodimentByRobotType = {"GR1ArmsOnly": "gr1"}
kDefaultEmbodiment = "new_embodiment"
kDtypeNames = {v: k for k, v in sh.kDtypeCodes.items()}


# ---------------------------------------------------------------------------
# Command line


def parse_args(argv):
    p = argparse.ArgumentParser(prog="convert_lerobot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="LeRobot v2.x or v3.0 dataset root (holds meta/, data/, videos/)")
    p.add_argument("dst", type=Path, help="output folder; must not exist unless --overwrite")
    p.add_argument("--episodes", default="", help="comma-separated episode indices to convert (default: all)")
    p.add_argument("--embodiment-tag", default="", help="GR00T embodiment tag (default: from info.json robot_type "
                   f"{kEmbodimentByRobotType}, else '{kDefaultEmbodiment}')")
    p.add_argument("--keep-float64", action="store_true",
                   help="store float64 state and action columns as float64 (default: rounded to float32); "
                   "upstream GR00T normalizes such data in float64, and both trainers then do too")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a Hugging Face tokenizer.json (the checkpoint's own) to tokenize the task texts with; "
                   "default: the word hash of scripts/model/tokenizer.py. Export the model with the same file")
    p.add_argument("--formalize-language", nargs="?", const="n17", default=None, choices=("n17", "n16"),
                   help="with --tokenizer: change each task text as upstream GR00T N1.7 (n17, the default) or "
                   "Isaac-GR00T N1.6 (n16) does before tokenizing (lowercase, keep letters, digits, spaces and "
                   "'_'; N1.7 turns an empty text into 'Perform the task.'); imports read such ids by default")
    p.add_argument("--max-text-tokens", type=int, default=kDefaultMaxTextTokens,
                   help="max_len passed to the tokenizer for each task text")
    p.add_argument("--max-shard-bytes", type=int, default=kDefaultMaxShardBytes,
                   help="start a new shard before one would grow past this size (one record always fits)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel ffprobe processes")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.add_argument("--quiet", action="store_true", help="no per-episode progress lines")
    return p.parse_args(argv)


class Console:
    def __init__(self, quiet):
        self.quiet = quiet
        self.warnings = []

    def info(self, msg):
        print(msg, flush=True)

    def progress(self, msg):
        if not self.quiet:
            print(msg, flush=True)

    def warn(self, msg):
        self.warnings.append(msg)
        print("warning: " + msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Metadata pieces of loongforge_dataset.json


def load_tokenizer():
    """scripts/model/tokenizer.py, loaded by path: importing the `model` package
    would pull in torch, which the converter does not need."""
    path = kScriptsDir / "model" / "tokenizer.py"
    if not path.is_file():
        fail(str(path), "the model tokenizer is missing", "restore scripts/model/tokenizer.py from the repository")
    spec = importlib.util.spec_from_file_location("loongforge_model_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def tokenize_tasks(meta, max_len, con, tokenizer_path=None, formalize=None):
    """Token ids of every task text: the word hash of scripts/model/tokenizer.py, or the Hugging Face
    tokenizer.json given with --tokenizer (docs/shard-format.md s2, "tokenizer")."""
    module, path = load_tokenizer()
    if tokenizer_path is not None and not Path(tokenizer_path).is_file():
        fail(f"--tokenizer {tokenizer_path}", "is not a file",
             "pass the tokenizer.json of the checkpoint the model was exported from")
    try:
        enc, record = module.load(tokenizer_path, module.FORMALIZE_FLAGS[formalize] if formalize else module.RAW)
    except (ValueError, RuntimeError) as e:
        fail(f"--tokenizer {tokenizer_path}", str(e), "pass a Hugging Face tokenizer.json file")
    tasks = []
    for i in sorted(meta.tasks):
        text = meta.tasks[i]
        ids, length = enc(text, max_len)
        ids = [int(x) for x in list(ids)[:int(length)]]
        full, full_len = enc(text, max(4 * max_len, 1024))
        if int(full_len) > int(length):
            con.warn(f"task {i} ({text!r}) needs {int(full_len)} tokens and was truncated to {max_len}; "
                     "raise --max-text-tokens")
        tasks.append({"task_index": i, "text": text, "token_ids": ids, "token_count": len(ids)})
    info = dict(record, max_len=max_len)
    if record["kind"] == module.WORD_HASH:
        info["module"] = "scripts/model/tokenizer.py"
    return info, tasks


def copy_stats(meta, columns):
    path = meta.root / meta.stats_source.split(",")[0]
    width = {c.name: c.width for c in columns}
    out = {}
    for key, st in meta.stats.items():
        # flat lists (docs/shard-format.md s2): LeRobot's per-channel image stats are (3, 1, 1) nested lists
        try:
            entry = {k: np.ravel(np.asarray(st[k], dtype=np.float64)).tolist() for k in source.kStatKeys if k in st}
        except (TypeError, ValueError) as e:
            fail(str(path), f"the statistics of '{key}' are not lists of numbers ({e})", "regenerate stats.json")
        if key in meta.state_keys or key in meta.action_keys:
            missing = [k for k in source.kRequiredStatKeys if k not in st]
            if missing:
                fail(str(path), f"'{key}' lacks the statistics {missing}", "regenerate stats.json")
            for k, v in entry.items():
                n = len(v)
                if n != width.get(key, n):
                    fail(str(path), f"'{key}'.{k} has {n} values but the data has {width[key]} per row",
                         "regenerate stats.json for this dataset")
        out[key] = entry
    for key in [*meta.state_keys, *meta.action_keys]:
        if key not in out:
            fail(str(path), f"has no statistics for '{key}' (used by meta/modality.json)", "regenerate stats.json")
    return out


def column_role(meta, col):
    if col.name in meta.state_keys:
        return "state"
    if col.name in meta.action_keys:
        return "action"
    if col.name in meta.annotation_keys:
        return "annotation"
    if col.name.startswith("video_frame:"):
        return "video_frame"
    if col.name.startswith("video_pts:"):
        return "video_pts"
    if col.name in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        return col.name
    return "other"


def describe_columns(meta, columns):
    return [{"column_id": i, "name": c.name, "role": column_role(meta, c), "dtype": kDtypeNames[c.dtype],
             "source_dtype": kDtypeNames.get(c.source_dtype, "?"), "width": c.width,
             "rows": "per_video_frame" if c.row_kind == sh.kRowsPerVideoFrame else "per_row",
             "camera_id": None if c.camera_id == sh.kNoCamera else c.camera_id,
             "synthesized": bool(c.flags & sh.kFlagSynthesized),
             "float64_to_float32": bool(c.flags & sh.kFlagLossyFloat32)} for i, c in enumerate(columns)]


def describe_features(meta, columns):
    by_name = {c.name: c for c in columns}
    cams = {c.key: c.camera_id for c in meta.cameras}
    skipped = {s["name"]: s["reason"] for s in meta.skipped_features}
    out = []
    for name, feat in meta.info["features"].items():
        e = {"name": name, "dtype": feat.get("dtype"), "shape": feat.get("shape")}
        if name in by_name:
            e.update(stored=True, column=name, stored_dtype=kDtypeNames[by_name[name].dtype])
        elif name in cams:
            e.update(stored=True, camera_id=cams[name])
        else:
            e.update(stored=False, reason=skipped.get(name, "not converted"))
        out.append(e)
    return out


def embodiment(meta, args):
    if args.embodiment_tag:
        return args.embodiment_tag, "command line"
    rt = meta.info.get("robot_type", "")
    if rt in kEmbodimentByRobotType:
        return kEmbodimentByRobotType[rt], f"info.json robot_type {rt!r}"
    return kDefaultEmbodiment, "default (no --embodiment-tag, robot_type not in the table)"


# ---------------------------------------------------------------------------
# Conversion


def select_episodes(meta, spec):
    listed = [int(e["episode_index"]) for e in meta.episodes]
    if len(set(listed)) != len(listed):
        dup = next(e for e in listed if listed.count(e) > 1)
        fail(str(meta.root / meta.episodes_file), f"lists episode {dup} twice", "keep one line per episode")
    if not spec:
        return listed
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        fail("--episodes", f"{spec!r} is not a comma-separated list of integers", "pass e.g. --episodes 0,2,4")
    if len(set(wanted)) != len(wanted):
        fail("--episodes", f"{spec!r} names an episode twice", "list each episode once")
    for ep in wanted:
        if ep not in listed:
            fail("--episodes", f"episode {ep} is not in {meta.root / meta.episodes_file}",
                 f"choose among {listed[:10]}{'...' if len(listed) > 10 else ''}")
    return wanted


def convert(args, con):
    t0 = time.monotonic()
    src, dst = args.src, args.dst
    meta = source.load_meta(src)
    episodes = select_episodes(meta, args.episodes)
    jsonl = {int(e["episode_index"]): e for e in meta.episodes}
    text_to_task = {t: i for i, t in meta.tasks.items()}
    if meta.modality_source != "meta/modality.json":
        con.warn(f"{src / 'meta/modality.json'} is missing; using the {meta.modality_source} "
                 "(add a GR00T modality.json to choose state/action slices and cameras)")
    source.resolve_cameras(meta, episodes, con.warn)
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        fail(str(dst), "is inside the source dataset", "write the output somewhere outside SRC")
    if dst.exists() and not args.overwrite:
        fail(str(dst), "already exists", "choose another DST or pass --overwrite")
    first_parquet = meta.parquet_path(episodes[0])
    columns = source.plan_columns(meta, pq.read_schema(first_parquet), first_parquet, con.warn, args.keep_float64)
    stats = copy_stats(meta, columns)
    tok_info, tasks = tokenize_tasks(meta, args.max_text_tokens, con, args.tokenizer, args.formalize_language)
    con.info(f"converting {len(episodes)} episodes of {src} ({meta.info.get('codebase_version')}, "
             f"{meta.fps:g} fps, cameras: {', '.join(c.key for c in meta.cameras) or 'none'})")

    tmp = dst.parent / f".{dst.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        result = _write(meta, args, con, columns, episodes, jsonl, text_to_task, tmp, pool)
        pool.shutdown(wait=True)
        doc = _dataset_doc(meta, args, columns, stats, tok_info, tasks, result)
        (tmp / kDatasetJson).write_text(json.dumps(doc, indent=1) + "\n")
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shard_files, ep_entries, f32_error, offsets, video_bytes, _ = result
    frames, shard_bytes = doc["totals"]["frames"], doc["totals"]["shard_bytes"]

    seconds = time.monotonic() - t0
    con.info(f"done: {len(ep_entries)} episodes, {frames} frames, {len(shard_files)} shard(s) {shard_bytes} bytes, "
             f"videos {video_bytes} bytes, {seconds:.2f} s -> {dst}")
    if offsets:
        vals = sorted({round(o, 6) for o in offsets})
        con.info(f"timestamp offsets corrected in {len(offsets)} episode video(s): "
                 f"{', '.join(f'{v:+.6f} s' for v in vals[:8])}{' ...' if len(vals) > 8 else ''}")
    for k, (a, r) in f32_error.items():
        con.info(f"float64 -> float32 '{k}': max abs error {a:.3g}, max rel error {r:.3g} (bound 2^-24 = 5.96e-08)")
    for cam in doc["cameras"]:  # what the model's resize will do with each camera's aspect (aspect.py)
        vids = [v for e in ep_entries for v in e["videos"] if v["camera_id"] == cam["camera_id"]]
        con.info(aspect.camera_line(cam["key"], cam["width"], cam["height"], sum(v["frame_count"] for v in vids),
                                    len(vids)))
    return doc


def _dataset_doc(meta, args, columns, stats, tok_info, tasks, result):
    """The loongforge_dataset.json object (docs/shard-format.md section 2)."""
    shard_files, ep_entries, f32_error, _offsets, video_bytes, codecs = result
    emb, emb_source = embodiment(meta, args)
    frames = sum(e["length"] for e in ep_entries)
    shard_bytes = sum(s["bytes"] for s in shard_files)
    return {
        "format": kDatasetFormat,
        "format_version": kDatasetFormatVersion,
        "shard_format_version": sh.kFormatVersion,
        "created_by": "scripts/convert_lerobot.py",
        "source": {"path": str(meta.root.resolve()), "codebase_version": meta.info.get("codebase_version"),
                   "modality": meta.modality_source,
                   "robot_type": meta.info.get("robot_type"), "episodes_in_source": len(meta.episodes),
                   "stats": meta.stats_source},
        "fps": meta.fps,
        "embodiment_tag": emb,
        "embodiment_tag_source": emb_source,
        "alignment": {"rule": "row t <-> frame t after subtracting a constant per-episode offset "
                      "(median of timestamp - pts); |residual| < tolerance", "tolerance_s": 0.5 / meta.fps},
        "features": describe_features(meta, columns),
        "columns": describe_columns(meta, columns),
        "modality": meta.modality,
        "cameras": [{"camera_id": c.camera_id, "key": c.key, "modality_name": c.modality_name,
                     "height": c.height, "width": c.width, "codec": codecs.get(c.key, c.info_codec),
                     "fps": c.fps} for c in meta.cameras],
        "stats": stats,
        "tokenizer": tok_info,
        "tasks": tasks,
        "float32_conversion": {k: {"max_abs_error": a, "max_rel_error": r} for k, (a, r) in f32_error.items()},
        "shards": shard_files,
        "episodes": ep_entries,
        "totals": {"episodes": len(ep_entries), "frames": frames, "shard_bytes": shard_bytes,
                   "video_bytes": video_bytes},
    }


def _write(meta, args, con, columns, episodes, jsonl, text_to_task, tmp, pool):
    window = 2 * max(1, args.jobs)  # episodes probed ahead of the one being written
    futures = {}
    submitted = 0

    def submit_until(end):
        nonlocal submitted
        for ep in episodes[submitted:end]:
            for cam in meta.cameras:
                path = meta.video_path(ep, cam.key)
                span = meta.video_range(ep, cam.key)
                if span is None:  # v2.x: the episode's own file, copied below
                    futures[(ep, cam.key)] = pool.submit(video.probe_video, path, meta.where(ep, path))
                else:  # v3.0: its time range of a shared file, cut into DST (Note [LeRobot v3.0])
                    out = tmp / meta.output_video_rel(ep, cam.key)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    futures[(ep, cam.key)] = pool.submit(video.cut_episode, path, out, span[0], span[1], meta.fps,
                                                         meta.where(ep, path))
        submitted = max(submitted, min(end, len(episodes)))

    shard_files, ep_entries, f32_error, offsets = [], [], {}, []
    codecs, video_bytes = {}, 0
    writer = None
    n_done = 0
    for n, ep in enumerate(episodes):
        submit_until(n + 1 + window)
        data = source.read_episode(meta, ep, columns)
        parquet_path = meta.parquet_path(ep)
        arrays = data.arrays
        vids, notes = [], []
        for cam in meta.cameras:
            probe = futures.pop((ep, cam.key)).result()
            where = meta.where(ep, meta.video_path(ep, cam.key))
            if (probe.height, probe.width) != (cam.height, cam.width):
                fail(where, f"video is {probe.width}x{probe.height} (width x height) but meta/info.json "
                     f"features['{cam.key}'].shape says height {cam.height}, width {cam.width}",
                     "fix the shape in meta/info.json or re-export the video at that size")
            if cam.key not in codecs:
                codecs[cam.key] = probe.codec
                if cam.info_codec and cam.info_codec != probe.codec:
                    con.warn(f"meta/info.json says '{cam.key}' is {cam.info_codec} but {probe.path} is "
                             f"{probe.codec}; recording {probe.codec}")
            elif codecs[cam.key] != probe.codec:
                con.warn(f"{where}: codec {probe.codec} differs from the first episode's {codecs[cam.key]}")
            shown = probe.path if meta.version == 2 else (
                f"{meta.video_path(ep, cam.key)} [{meta.video_range(ep, cam.key)[0]:.6f}, "
                f"{meta.video_range(ep, cam.key)[1]:.6f}) s")
            al = video.align(data.timestamps, probe.pts_s, meta.fps, meta.where(ep, parquet_path), shown,
                             parquet_path)
            arrays["video_frame:" + cam.key] = al.frame_of_row
            arrays["video_pts:" + cam.key] = probe.pts_s
            rel = meta.output_video_rel(ep, cam.key)
            out = tmp / rel
            if meta.version == 2:
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(probe.path, out)
            size = out.stat().st_size
            digest = _sha256_file(out)  # of the copy: what the trainer will read and check
            video_bytes += size
            if al.offset_reported:
                offsets.append(al.offset_s)
                notes.append(f"{cam.key}: timestamps - pts = constant offset {al.offset_s:+.6f} s, corrected")
            vids.append({"camera_id": cam.camera_id, "key": cam.key, "file": str(rel), "bytes": size,
                         "sha256": digest, "codec": probe.codec, "time_base": probe.time_base, "frame_count": len(probe.pts_s),
                         "first_pts_s": float(probe.pts_s[0]), "timestamp_offset_s": al.offset_s,
                         "offset_corrected": al.offset_reported, "max_residual_s": al.max_residual_s})
        listed = jsonl[ep]
        if "length" in listed and int(listed["length"]) != data.rows:
            fail(meta.where(ep, parquet_path), f"parquet has {data.rows} rows but {meta.episodes_file} says length "
                 f"{listed['length']}", f"regenerate {meta.episodes_file} or re-export the episode")
        listed_tasks = []
        for text in listed.get("tasks", []):
            if text not in text_to_task:
                fail(meta.where(ep, meta.root / meta.episodes_file), f"task {text!r} is not in {meta.tasks_file}",
                     f"add it to {meta.tasks_file} or fix the episode's tasks")
            listed_tasks.append(text_to_task[text])
        task_indices = data.task_indices_used or sorted(set(listed_tasks))
        if listed_tasks and sorted(set(listed_tasks)) != task_indices:
            con.warn(f"{meta.where(ep, parquet_path)}: parquet refers to tasks {task_indices} but "
                     f"{meta.episodes_file} lists {sorted(set(listed_tasks))}; using the parquet's")
        for k, (a, r) in data.f32_error.items():
            pa_, pr = f32_error.get(k, (0.0, 0.0))
            f32_error[k] = (max(a, pa_), max(r, pr))

        record = sh.build_record(ep, data.rows, columns, [arrays[c.name] for c in columns])
        if writer is not None and writer.index and writer.bytes_written + len(record) > args.max_shard_bytes:
            shard_files.append(_close(writer))
            writer = None
        if writer is None:
            sid = len(shard_files)
            writer = sh.ShardWriter(tmp / kShardName.format(sid), sid, columns)
        loc = writer.add(ep, data.rows, record)
        ep_entries.append({"episode_index": ep, "length": data.rows, "task_indices": task_indices,
                           "shard": loc.file_name, "shard_id": loc.shard_id, "record_offset": loc.record_offset,
                           "record_bytes": loc.record_bytes, "record_crc32": loc.record_crc32,
                           "timestamp_first_s": float(data.timestamps[0]),
                           "timestamp_last_s": float(data.timestamps[-1]), "videos": vids})
        n_done += 1
        con.progress(f"[{n_done}/{len(episodes)}] episode {ep}: {data.rows} rows, record {len(record)} bytes -> "
                     f"{loc.file_name}@{loc.record_offset}" + "".join("; " + s for s in notes))
    if writer is not None:
        shard_files.append(_close(writer))
    return shard_files, ep_entries, f32_error, offsets, video_bytes, codecs


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _close(writer):
    size = writer.close()
    return {"shard_id": writer.shard_id, "file": writer.path.name, "bytes": size, "episodes": len(writer.index),
            "rows": writer.total_rows}


def main(argv=None):
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse: --help (code 0) or a usage error (code 2)
        return 0 if e.code in (0, None) else 2
    con = Console(args.quiet)
    try:
        convert(args, con)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
