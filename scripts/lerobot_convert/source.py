"""Read and validate a LeRobot dataset: v2.0/v2.1 (Isaac-GR00T flavour) or v3.0.

v2.x layout read here (paths relative to the dataset root):
    meta/info.json        fps, features (dtype, shape), data_path, video_path
    meta/modality.json    state/action slices, video and annotation keys (GR00T's; optional:
                          without it a default is used, Note [LeRobot v3.0])
    meta/tasks.jsonl      task_index -> text
    meta/episodes.jsonl   episode_index, tasks (texts), length
    meta/stats.json       per-key mean/std/min/max/q01/q99 (v2.1 without it:
                          meta/episodes_stats.jsonl, Note [LeRobot v2.x stats])
    data/chunk-XXX/episode_XXXXXX.parquet     one row per frame
    videos/chunk-XXX/<video_key>/episode_XXXXXX.mp4

v3.0 layout (Note [LeRobot v3.0]):
    meta/info.json        fps, features, data_path and video_path templates
                          ({chunk_index}, {file_index}, {video_key})
    meta/tasks.parquet    column task_index, indexed by the task text (Note [LeRobot
                          tasks.parquet])
    meta/episodes/chunk-XXX/file-XXX.parquet   one row per episode: length,
                          tasks, data/chunk_index, data/file_index,
                          dataset_from_index, dataset_to_index and per camera
                          videos/<key>/chunk_index, file_index, from_timestamp,
                          to_timestamp (plus per-episode stats, not read)
    meta/stats.json       aggregated stats (LeRobot 0.6.1 adds quantiles q01..q99;
                          older writers have mean, std, min, max, count only)
    meta/modality.json    optional (GR00T flavour); without it a default is used
    data/chunk-XXX/file-XXX.parquet            rows of several episodes
    videos/<key>/chunk-XXX/file-XXX.mp4        frames of several episodes, one
                          after the other; an episode is a time range

Which columns are stored and how (docs/shard-format.md, "Columns"):
    modality state/action keys  float -> float32 (rounded to nearest; error measured)
    other float columns         kept as float32/float64 (timestamp stays float64)
    integer columns             int64
    bool columns                uint8 (0/1)
    non-numeric columns         skipped with a warning
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import fail
from .shard import (Column, kDtypeCodes, kDtypeFloat32, kDtypeFloat64, kDtypeInt64,
                    kDtypeUint8, kFlagLossyFloat32, kFlagSynthesized, kRowsPerVideoFrame)

kV2VideoPath = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
kStatKeys = ("mean", "std", "min", "max", "q01", "q99")  # copied when present
# needed for state and action (the trainer's normalizations); LeRobot before its quantiles wrote only these
kRequiredStatKeys = ("mean", "std", "min", "max")
kMetaFiles = ("meta/info.json", "meta/tasks.jsonl", "meta/episodes.jsonl")  # + stats (Note [LeRobot v2.x stats])
kMetaFilesV3 = ("meta/info.json", "meta/tasks.parquet", "meta/episodes", "meta/stats.json")
kV3EpisodeColumns = ("episode_index", "length", "tasks", "data/chunk_index", "data/file_index",
                     "dataset_from_index", "dataset_to_index")
kV3VideoColumns = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")

# Note [LeRobot v3.0]
# A v3.0 dataset (LeRobot's current format) stores many episodes per parquet
# file and per mp4 file. meta/episodes/*.parquet says where each episode is:
# its rows are the rows of data file (data/chunk_index, data/file_index) whose
# episode_index column is the episode (dataset_from_index..dataset_to_index
# count them), and its frames for camera K are those of video file
# (videos/K/chunk_index, videos/K/file_index) whose presentation time lies in
# [from_timestamp, to_timestamp). The parquet timestamps stay relative to the
# episode, as in v2.x. The converter gives every episode its own video (the
# shard format keeps one video per episode and camera, with its SHA-256 and
# frame count): video.cut_episode copies the range's packets into a new mp4
# without re-encoding, so the decoded frames are those of the source. The
# per-episode files are named as a v2.x dataset would name them
# (videos/chunk-XXX/<key>/episode_XXXXXX.mp4), so v2.x and v3.0 copies of one
# dataset convert to the same folder layout. Without meta/modality.json (plain
# LeRobot datasets have none) the default modality of default_modality() is used.

# Note [LeRobot tasks.parquet]
# LeRobot writes meta/tasks.parquet with pandas from a frame whose only column
# is task_index and whose index is the task text (DataFrame.to_parquet keeps
# the index): LeRobot 0.6.1 names that index "task", so the file has a column
# "task"; other writers of v3.0 (e.g. the pollen-robotics/apple_storage files)
# left it unnamed, stored as the column "__index_level_0__". The b"pandas"
# schema metadata lists which stored column is the index. LeRobot reads the
# file back with pd.read_parquet, names the index "task" whatever it was
# (io_utils.load_tasks), and gives sample i the text of row task_index
# (tasks.iloc[task_index].name in dataset_reader.get_item): a row position,
# not a lookup of the task_index column. The converter reads the same way: the
# text is the one string index column the pandas metadata names (or a plain
# "task" column in a file without an index), and row r must have task_index
# r, which LeRobot's writers always give (anything else is refused rather than
# guessed).

# Note [LeRobot v2.x stats]
# LeRobot v2.0 keeps the dataset's statistics in meta/stats.json. v2.1
# (LeRobot 0.1 to 0.3) writes per-episode statistics to
# meta/episodes_stats.jsonl instead and its reader aggregates them
# (LeRobotDatasetMetadata.load_metadata: min of the minima, max of the maxima,
# count-weighted mean, pooled std); Isaac-GR00T's datasets of either version
# carry a stats.json of their own, which GR00T's loader reads. The converter
# takes meta/stats.json when it is there (GR00T's, or v2.0's), else, for
# v2.1, the aggregate LeRobot's reader computes (aggregate_episode_stats, the
# same numpy operations, so the same float64 values); source.stats in
# loongforge_dataset.json says which. A plain LeRobot v2.x dataset has no
# meta/modality.json either: the default modality of default_modality() is
# used, as for v3.0.


# ---------------------------------------------------------------------------
# Meta data


@dataclass
class Camera:
    camera_id: int
    key: str  # info.json feature, e.g. observation.images.ego_view
    modality_name: str  # modality.json video group, e.g. ego_view; "" when not referenced
    height: int
    width: int
    info_codec: str
    fps: float


@dataclass
class Meta:
    root: Path
    info: dict
    modality: dict
    tasks: dict  # task_index -> text
    episodes: list  # episodes.jsonl rows, in file order
    stats: dict
    fps: float
    state_keys: list
    action_keys: list
    annotation_keys: list
    video_refs: dict  # modality video group -> feature key
    cameras: list = field(default_factory=list)
    skipped_features: list = field(default_factory=list)  # {"name", "reason"}
    version: int = 2  # LeRobot codebase major version: 2 or 3
    v3_episodes: dict = field(default_factory=dict)  # v3.0: episode_index -> meta/episodes row
    modality_source: str = "meta/modality.json"
    stats_source: str = "meta/stats.json"
    _table_cache: tuple = (None, None)  # v3.0: (path, table) of the last data file read

    def where(self, ep=None, path=None):
        parts = []
        if ep is not None:
            parts.append(f"episode {ep}")
        if path is not None:
            parts.append(f"({path})" if parts else str(path))
        return " ".join(parts)

    def chunk(self, ep):
        return ep // int(self.info.get("chunks_size", 1000))

    def parquet_path(self, ep):
        if self.version == 3:
            e = self.v3_episodes[ep]
            return self.root / self.info["data_path"].format(chunk_index=int(e["data/chunk_index"]),
                                                             file_index=int(e["data/file_index"]))
        return self.root / self.info["data_path"].format(episode_chunk=self.chunk(ep), episode_index=ep)

    def video_path(self, ep, key):
        """The source video file holding episode ep's frames of camera key."""
        if self.version == 3:
            e = self.v3_episodes[ep]
            return self.root / self.info["video_path"].format(
                video_key=key, chunk_index=int(e[f"videos/{key}/chunk_index"]),
                file_index=int(e[f"videos/{key}/file_index"]))
        return self.root / self.info["video_path"].format(episode_chunk=self.chunk(ep), video_key=key,
                                                          episode_index=ep)

    @property
    def episodes_file(self):
        return "meta/episodes/*.parquet" if self.version == 3 else "meta/episodes.jsonl"

    @property
    def tasks_file(self):
        return "meta/tasks.parquet" if self.version == 3 else "meta/tasks.jsonl"

    def video_range(self, ep, key):
        """v3.0: (from_timestamp, to_timestamp) of the episode inside video_path; v2.x: None (whole file)."""
        if self.version != 3:
            return None
        e = self.v3_episodes[ep]
        return float(e[f"videos/{key}/from_timestamp"]), float(e[f"videos/{key}/to_timestamp"])

    def output_video_rel(self, ep, key):
        """Where the episode's video goes in DST, relative to it (docs/shard-format.md s1)."""
        if self.version == 3:
            return Path(kV2VideoPath.format(episode_chunk=self.chunk(ep), video_key=key, episode_index=ep))
        return self.video_path(ep, key).relative_to(self.root)

    def feature_width(self, key):
        shape = self.info["features"][key].get("shape", [1])
        return int(np.prod(shape)) if shape else 1


def _read_json(path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        fail(str(path), f"is not valid JSON ({e})", "repair or regenerate the file")


def _read_jsonl(path):
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{path} line {n}", f"is not valid JSON ({e})", "repair or regenerate the file")
    return rows


def default_modality(info):
    """The modality used for a v3.0 dataset without meta/modality.json: the whole
    observation.state and action features as one group each, every video feature
    as a camera named after its key (observation.images.X -> X), no annotations
    (the task comes from the task_index column)."""
    features = info["features"]
    mod = {"state": {}, "action": {}, "video": {}, "annotation": {}}
    for group, key in (("state", "observation.state"), ("action", "action")):
        if key in features:
            width = int(np.prod(features[key].get("shape", [1])))
            mod[group][group] = {"start": 0, "end": width, "original_key": key}
    for key, feat in features.items():
        if feat.get("dtype") == "video":
            mod["video"][key.rsplit(".", 1)[-1]] = {"original_key": key}
    return mod


def load_meta(root):
    root = Path(root)
    if not root.is_dir():
        fail(str(root), "is not a directory", "pass the root of a LeRobot dataset (the folder holding meta/)")
    info_path = root / "meta/info.json"
    if not info_path.is_file():
        fail(str(info_path), "is missing; every LeRobot dataset has one",
             "copy the complete dataset (meta/ included)")
    info = _read_json(info_path)
    version = str(info.get("codebase_version", "?"))
    if version.startswith("v2."):
        major, needed = 2, kMetaFiles
    elif version.startswith("v3."):
        major, needed = 3, kMetaFilesV3
    else:
        fail(str(info_path), f"codebase_version is {version!r}; this converter reads LeRobot v2.0, v2.1 and v3.0",
             "convert the dataset to LeRobot v3.0 (or v2.1) with LeRobot's tools")
    for rel in needed:
        if not (root / rel).exists():
            kind = "LeRobot v2.x dataset" if major == 2 else "LeRobot v3.0 dataset"
            fail(str(root / rel), f"is missing; a {kind} needs " + ", ".join(needed),
                 "copy the complete dataset (meta/ included); stats.json can be regenerated with "
                 "LeRobot's or GR00T's stats tools")
    if major == 2 and not (root / "meta/stats.json").is_file() and not (
            version != "v2.0" and (root / "meta/episodes_stats.jsonl").is_file()):
        fail(str(root / "meta/stats.json"), "is missing; a LeRobot v2.0 dataset needs it (v2.1: it or "
             "meta/episodes_stats.jsonl)", "copy the complete dataset (meta/ included); stats.json can be "
             "regenerated with LeRobot's or GR00T's stats tools")
    for k in ("fps", "features", "data_path", "video_path"):
        if k not in info:
            fail(str(info_path), f"has no '{k}' entry", "regenerate info.json with LeRobot")
    fps = float(info["fps"])
    if not fps > 0:
        fail(str(info_path), f"fps is {info['fps']!r}", "set fps to the recording frame rate")

    modality_path = root / "meta/modality.json"
    if modality_path.is_file():
        modality, modality_source = _read_json(modality_path), "meta/modality.json"
    else:  # plain LeRobot datasets have none (GR00T's add it)
        modality = default_modality(info)
        modality_source = ("default: no meta/modality.json; state = observation.state, action = action, "
                           "every video feature a camera")
    features = info["features"]

    def resolve(group, default):
        keys = []
        for name, spec in (modality.get(group) or {}).items():
            key = spec.get("original_key", default(name))
            if key not in features:
                fail(str(modality_path), f"{group}.{name} uses feature '{key}', which meta/info.json does not list",
                     f"add '{key}' to info.json features or fix {group}.{name} in modality.json")
            if group in ("state", "action"):
                width = int(np.prod(features[key].get("shape", [1])))
                start, end = spec.get("start"), spec.get("end")
                if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= width):
                    fail(str(modality_path), f"{group}.{name} slice [{start}, {end}) does not fit feature '{key}' "
                         f"of width {width} (info.json shape {features[key].get('shape')})",
                         "fix start/end so that 0 <= start < end <= width")
            if key not in keys:
                keys.append(key)
        return keys

    state_keys = resolve("state", lambda n: "observation.state")
    action_keys = resolve("action", lambda n: "action")
    annotation_keys = resolve("annotation", lambda n: "annotation." + n)
    video_refs = {}
    for name, spec in (modality.get("video") or {}).items():
        key = spec.get("original_key", "observation.images." + name)
        if key not in features or features[key].get("dtype") != "video":
            fail(str(modality_path), f"video.{name} uses feature '{key}', which meta/info.json does not list "
                 "as a video feature", f"add '{key}' (dtype video) to info.json features or remove video.{name}")
        video_refs[name] = key

    if major == 2:
        tasks = {}
        for row in _read_jsonl(root / "meta/tasks.jsonl"):
            i = int(row["task_index"])
            if i in tasks:
                fail(str(root / "meta/tasks.jsonl"), f"task_index {i} appears twice", "give each task one line")
            tasks[i] = str(row["task"])
        episodes = _read_jsonl(root / "meta/episodes.jsonl")
        if not episodes:
            fail(str(root / "meta/episodes.jsonl"), "lists no episodes", "regenerate it with LeRobot")
        v3_episodes = {}
    else:
        tasks = _read_tasks_v3(root / "meta/tasks.parquet")
        episodes, v3_episodes = _read_episodes_v3(root, info)
    if (root / "meta/stats.json").is_file():
        stats, stats_source = _read_json(root / "meta/stats.json"), "meta/stats.json"
    else:  # v2.1 without stats.json (checked above): Note [LeRobot v2.x stats]
        stats = aggregate_episode_stats(_read_jsonl(root / "meta/episodes_stats.jsonl"),
                                        root / "meta/episodes_stats.jsonl")
        stats_source = "meta/episodes_stats.jsonl, aggregated as LeRobot 0.3 (v2.1) does"
    meta = Meta(root, info, modality, tasks, episodes, stats, fps, state_keys, action_keys, annotation_keys,
                video_refs, version=major, v3_episodes=v3_episodes, modality_source=modality_source,
                stats_source=stats_source)
    return meta


def aggregate_episode_stats(rows, path):
    """The dataset stats LeRobot's v2.1 reader computes from meta/episodes_stats.jsonl (LeRobot 0.3.x
    compute_stats.aggregate_stats, Note [LeRobot v2.x stats]): per key, the min of the minima, the max of
    the maxima, the count-weighted mean, the pooled std; numpy float64, in LeRobot's order of operations."""
    per_key = {}
    for row in sorted(rows, key=lambda r: r["episode_index"]):
        for key, st in (row.get("stats") or {}).items():
            per_key.setdefault(key, []).append(st)
    out = {}
    for key, sts in per_key.items():
        try:
            means = np.stack([np.array(s["mean"], dtype=np.float64) for s in sts])
            variances = np.stack([np.array(s["std"], dtype=np.float64) ** 2 for s in sts])
            counts = np.stack([np.array(s["count"]) for s in sts])
            mins = np.stack([np.array(s["min"], dtype=np.float64) for s in sts])
            maxs = np.stack([np.array(s["max"], dtype=np.float64) for s in sts])
        except (KeyError, ValueError) as e:
            fail(str(path), f"the statistics of '{key}' are incomplete or of different shapes ({e})",
                 "regenerate meta/episodes_stats.jsonl with LeRobot")
        total = counts.sum(axis=0)
        while counts.ndim < means.ndim:
            counts = np.expand_dims(counts, axis=-1)
        mean = (means * counts).sum(axis=0) / total
        variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
        out[key] = {"min": np.min(mins, axis=0).tolist(), "max": np.max(maxs, axis=0).tolist(), "mean": mean.tolist(),
                    "std": np.sqrt(variance).tolist(), "count": np.asarray(total).tolist()}
    return out


def _read_parquet(path, columns=None):
    try:
        return pq.read_table(path, columns=columns)
    except Exception as e:  # pyarrow raises several types for damaged or incomplete files
        fail(str(path), f"cannot read the parquet file ({e})", "re-copy the file or regenerate it with LeRobot")


def _pandas_index_columns(table):
    """The stored index columns of a parquet file pandas wrote (its b"pandas" schema metadata):
    [(field name, index name)] for each index kept as a column; a RangeIndex is kept as metadata
    only and is not listed. [] when the file has no pandas metadata."""
    raw = (table.schema.metadata or {}).get(b"pandas")
    if not raw:
        return []
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError:
        return []
    names = {c.get("field_name"): c.get("name") for c in meta.get("columns") or []}
    return [(f, names.get(f)) for f in meta.get("index_columns") or [] if isinstance(f, str)]


def _read_tasks_v3(path):
    """meta/tasks.parquet -> {task_index: text}, as LeRobot 0.6.1 reads it (Note [LeRobot tasks.parquet])."""
    table = _read_parquet(path)
    index = _pandas_index_columns(table)
    fix = ("regenerate meta/tasks.parquet with LeRobot (a pandas frame with a task_index column, indexed by "
           "the task text)")
    if "task_index" not in table.column_names:
        fail(str(path), f"has no 'task_index' column (columns: {table.column_names})", fix)
    text_col = None
    t = table.schema.field(index[0][0]).type if len(index) == 1 else None
    if t is not None and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        text_col = index[0][0]  # "task" (a named index) or "__index_level_0__" (an unnamed one)
    elif "task" in table.column_names and not index:
        text_col = "task"  # written without pandas' index metadata: the text as a plain column
    if text_col is None:
        shown = [f"{f} (index {n!r})" for f, n in index] or "none"
        fail(str(path), f"holds no task text: LeRobot keeps it as the frame's one string index (pandas index "
             f"columns: {shown}; columns: {table.column_names})", fix)
    tasks = {}
    for row, (i, text) in enumerate(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist())):
        if i is None or text is None:
            fail(str(path), f"row {row} has a missing task_index or text", fix)
        if int(i) != row:
            fail(str(path), f"row {row} has task_index {i}; LeRobot looks a task up by its row "
                 "(tasks.iloc[task_index]), so row r must have task_index r", fix)
        tasks[int(i)] = str(text)
    return tasks


def _read_episodes_v3(root, info):
    """meta/episodes/*/*.parquet -> (rows like episodes.jsonl's, {episode_index: full row})."""
    files = sorted((root / "meta/episodes").glob("*/*.parquet"))
    if not files:
        fail(str(root / "meta/episodes"), "holds no chunk-XXX/file-XXX.parquet files",
             "copy meta/episodes/ of the dataset completely, or regenerate it with LeRobot")
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    rows, by_ep = [], {}
    for path in files:
        names = pq.read_schema(path).names
        wanted = [*kV3EpisodeColumns, *(f"videos/{k}/{c}" for k in video_keys for c in kV3VideoColumns)]
        missing = [c for c in wanted if c not in names]
        if missing:
            fail(str(path), f"lacks the column(s) {missing}",
                 "regenerate meta/episodes with LeRobot v3.0 (a video feature of meta/info.json needs "
                 "videos/<key>/chunk_index, file_index, from_timestamp and to_timestamp)")
        table = _read_parquet(path, columns=wanted)
        for r in table.to_pylist():
            ep = int(r["episode_index"])
            if ep in by_ep:
                fail(str(path), f"lists episode {ep} twice", "keep one row per episode in meta/episodes")
            by_ep[ep] = r
            rows.append({"episode_index": ep, "tasks": list(r["tasks"] or []), "length": int(r["length"]),
                         "_where": str(path)})
            span = int(r["dataset_to_index"]) - int(r["dataset_from_index"])
            if span != int(r["length"]):
                fail(f"episode {ep} ({path})", f"dataset_from_index..dataset_to_index spans {span} rows but length "
                     f"is {r['length']}", "regenerate meta/episodes with LeRobot")
            for k in video_keys:
                a, b = r[f"videos/{k}/from_timestamp"], r[f"videos/{k}/to_timestamp"]
                if a is None or b is None or not 0 <= a < b:
                    fail(f"episode {ep} ({path})", f"camera '{k}' has the time range [{a}, {b})",
                         "regenerate meta/episodes with LeRobot (from_timestamp < to_timestamp)")
    if not rows:
        fail(str(root / "meta/episodes"), "lists no episodes", "regenerate it with LeRobot")
    return rows, by_ep


def resolve_cameras(meta, episode_indices, warn):
    """Fill meta.cameras; check that every needed file exists (before any work).

    A video feature referenced by modality.json must have a file for every
    episode. An unreferenced one is converted when all its files exist,
    skipped with a warning when none exist, and an error otherwise.
    """
    for ep in episode_indices:
        p = meta.parquet_path(ep)
        if not p.is_file():
            fail(meta.where(ep, p), "parquet file is missing",
                 "copy the episode's parquet file, or drop the episode from meta/episodes.jsonl")
    referenced = {key: name for name, key in meta.video_refs.items()}
    for key, feat in meta.info["features"].items():
        if feat.get("dtype") != "video":
            continue
        present = [ep for ep in episode_indices if meta.video_path(ep, key).is_file()]
        missing = [ep for ep in episode_indices if ep not in present]
        if key in referenced and missing:
            ep = missing[0]
            if meta.modality_source == "meta/modality.json":
                used = f"which meta/modality.json uses as video.{referenced[key]}"
                fix = f"copy the videos of '{key}', or remove video.{referenced[key]} from meta/modality.json"
            else:
                used = "which the default modality uses as a camera (the dataset has no meta/modality.json)"
                fix = (f"copy the videos of '{key}', or add a meta/modality.json whose video group leaves "
                       f"'{key}' out")
            fail(meta.where(ep, meta.video_path(ep, key)),
                 f"video file is missing for feature '{key}', {used} ({len(missing)} of {len(episode_indices)} "
                 "episodes lack it)", fix)
        if key not in referenced and not present:
            reason = "no video files; not referenced by meta/modality.json"
            warn(f"feature '{key}' in meta/info.json has no video files and meta/modality.json does not use "
                 "it; skipped")
            meta.skipped_features.append({"name": key, "reason": reason})
            continue
        if key not in referenced and missing:
            ep = missing[0]
            fail(meta.where(ep, meta.video_path(ep, key)),
                 f"video file is missing for feature '{key}' ({len(missing)} of {len(episode_indices)} episodes "
                 "lack it; the others have it)", f"copy the missing videos of '{key}' or delete all of them")
        shape = feat.get("shape", [0, 0, 3])
        names = feat.get("names") or ["height", "width", "channel"]
        hw = dict(zip(names, shape))
        vi = feat.get("video_info") or feat.get("info") or {}
        meta.cameras.append(Camera(len(meta.cameras), key, referenced.get(key, ""), int(hw.get("height", shape[0])),
                                   int(hw.get("width", shape[1])), str(vi.get("video.codec", "")),
                                   float(vi.get("video.fps", meta.fps))))


# ---------------------------------------------------------------------------
# Column plan


def _arrow_dtype(t):
    """(dtype name, is_list) of an arrow type, or (None, _) when not numeric."""
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    v = t.value_type if is_list else t
    if pa.types.is_boolean(v):
        return "bool", is_list
    if pa.types.is_floating(v):
        return ("float32" if v.bit_width <= 32 else "float64"), is_list
    if pa.types.is_integer(v):
        return "int64", is_list
    return None, is_list


def plan_columns(meta, schema, first_path, warn, keep_float64=False):
    """Stored columns: numeric parquet columns (schema order), then synthesized ones. State and action
    are stored as float32 (float64 sources rounded), or, with keep_float64, float64 sources as float64."""
    features = meta.info["features"]
    f32_keys = set(meta.state_keys) | set(meta.action_keys)
    required = ["timestamp", *meta.state_keys, *meta.action_keys, *meta.annotation_keys]
    names = schema.names
    for key in required:
        if key not in names:
            used = "" if key == "timestamp" else " (used by meta/modality.json)"
            fail(meta.where(meta.episodes[0]["episode_index"], first_path), f"column '{key}'{used} is missing",
                 f"re-export the parquet files with a '{key}' column")
    columns = []
    for fld in schema:
        dt, is_list = _arrow_dtype(fld.type)
        if dt is None:
            warn(f"parquet column '{fld.name}' has type {fld.type}, not numeric; not stored")
            continue
        if fld.name in f32_keys and dt not in ("float32", "float64"):
            fail(meta.where(meta.episodes[0]["episode_index"], first_path),
                 f"column '{fld.name}' (state/action) has type {fld.type}; expected floats",
                 "store state and action as float32 or float64 lists")
        if fld.name in features:
            width = meta.feature_width(fld.name)
        else:
            width = -1  # taken from the first episode's data
            if fld.name != "frame_index":
                warn(f"parquet column '{fld.name}' is not described in meta/info.json features; stored with the "
                     "width found in the data")
        source = kDtypeCodes[dt]
        if fld.name in f32_keys and keep_float64 and dt == "float64":
            stored, flags = kDtypeFloat64, 0
        elif fld.name in f32_keys:
            stored, flags = kDtypeFloat32, (kFlagLossyFloat32 if dt == "float64" else 0)
        elif dt == "bool":
            stored, flags = kDtypeUint8, 0
        else:
            stored, flags = kDtypeCodes[dt], 0
        columns.append(Column(fld.name, stored, width, source_dtype=source, flags=flags))
    if "frame_index" not in names:
        columns.append(Column("frame_index", kDtypeInt64, 1, source_dtype=kDtypeInt64, flags=kFlagSynthesized))
    for cam in meta.cameras:
        columns.append(Column("video_frame:" + cam.key, kDtypeInt64, 1, source_dtype=kDtypeInt64,
                              flags=kFlagSynthesized, camera_id=cam.camera_id))
        columns.append(Column("video_pts:" + cam.key, kDtypeFloat64, 1, row_kind=kRowsPerVideoFrame,
                              camera_id=cam.camera_id, source_dtype=kDtypeFloat64, flags=kFlagSynthesized))
    for col in columns:
        if len(col.name.encode("utf-8")) > 63:
            fail(str(first_path), f"column name '{col.name}' is {len(col.name.encode('utf-8'))} bytes; the shard "
                 "format allows 63", "shorten the feature name in the parquet files and meta/info.json")
    for key, feat in features.items():
        if feat.get("dtype") != "video" and key not in names:
            warn(f"feature '{key}' of meta/info.json is not a column of the parquet files; skipped")
            meta.skipped_features.append({"name": key, "reason": "not a parquet column"})
    return columns


# ---------------------------------------------------------------------------
# One episode


@dataclass
class EpisodeData:
    episode_index: int
    rows: int
    arrays: dict  # column name -> np.ndarray (rows, width) or (rows,)
    timestamps: np.ndarray  # (rows,) float64
    task_indices_used: list  # from task_index and annotation columns
    f32_error: dict  # column -> (max abs error, max relative error)


def _column_values(meta, ep, path, table, col):
    """One parquet column as numpy, with null, width and NaN checks."""
    where = meta.where(ep, path)
    arr = table.column(col.name).combine_chunks()
    rows = len(arr)
    if arr.null_count:
        row = int(pc.index(pc.is_null(arr), True).as_py())
        fail(where, f"column '{col.name}' has {arr.null_count} null values (first at row {row})",
             "fill or drop the rows with missing values and re-export the episode")
    t = arr.type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if is_list:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        expect = col.width if col.width > 0 else (int(lengths[0]) if rows else 0)
        bad = np.nonzero(lengths != expect)[0]
        if len(bad):
            r = int(bad[0])
            if col.width > 0:
                shape = meta.info["features"][col.name].get("shape")
                fail(where, f"column '{col.name}' has {lengths[r]} values in row {r} but meta/info.json "
                     f"features['{col.name}'].shape is {shape}",
                     f"fix the data or the shape in meta/info.json so they agree")
            fail(where, f"column '{col.name}' has {lengths[r]} values in row {r} but {expect} in row 0",
                 "every row of a list column needs the same length")
        values = arr.flatten()
        if values.null_count:
            fail(where, f"column '{col.name}' has null elements inside its lists",
                 "fill the missing values and re-export the episode")
        np_arr = values.to_numpy(zero_copy_only=False).reshape(rows, expect)
        width = expect
    else:
        np_arr = arr.to_numpy(zero_copy_only=False)
        width = 1
        if col.width > 1:
            shape = meta.info["features"][col.name].get("shape")
            fail(where, f"column '{col.name}' is a scalar column but meta/info.json features['{col.name}'].shape "
                 f"is {shape}", "fix the data or the shape in meta/info.json so they agree")
    if col.width < 0:
        col.width = width  # first episode fixes the width of undescribed columns
    elif width != col.width:
        fail(where, f"column '{col.name}' has {width} values per row but {col.width} in the first episode",
             "every episode needs the same width for a column")
    if np_arr.dtype == np.bool_:
        np_arr = np_arr.astype(np.uint8)
    if np.issubdtype(np_arr.dtype, np.floating):
        finite = np.isfinite(np_arr)
        if not finite.all():
            r, *d = np.argwhere(~finite)[0]
            where_in = f"row {r}" + (f", element {d[0]}" if np_arr.ndim > 1 else "")
            n = int((~finite).sum())
            fail(where, f"column '{col.name}' holds {n} non-finite value(s) ({np_arr[tuple([r, *d])]} at "
                 f"{where_in})", "fix or drop those rows and re-export the episode; NaN/inf cannot be trained on")
    return np_arr


def _episode_table(meta, ep, path, where):
    """The parquet rows of episode ep: the whole file (v2.x), or its rows of a shared file (v3.0)."""
    cached_path, table = meta._table_cache
    if cached_path != path:
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for damaged files
            fail(where, f"cannot read the parquet file ({e})", "re-copy or re-export the episode's parquet file")
        meta._table_cache = (path, table) if meta.version == 3 else (None, None)
    if meta.version != 3:
        return table
    e = meta.v3_episodes[ep]
    if "episode_index" not in table.column_names:
        fail(where, "the v3.0 data file has no episode_index column", "regenerate the data files with LeRobot")
    rows = table.filter(pc.equal(table.column("episode_index"), ep))
    want = int(e["dataset_to_index"]) - int(e["dataset_from_index"])
    if rows.num_rows != want:
        fail(where, f"data file has {rows.num_rows} rows of episode {ep} but meta/episodes says {want} "
             f"(dataset_from_index {e['dataset_from_index']} .. dataset_to_index {e['dataset_to_index']})",
             "regenerate meta/episodes with LeRobot, or restore the data file")
    if "index" in rows.column_names:
        idx = rows.column("index").to_numpy()
        if idx[0] != int(e["dataset_from_index"]) or np.any(np.diff(idx) != 1):
            fail(where, f"the rows of episode {ep} have index {idx[0]}.. but meta/episodes says they start at "
                 f"dataset_from_index {e['dataset_from_index']} and run contiguously",
                 "regenerate meta/episodes with LeRobot, or restore the data file")
    return rows


def read_episode(meta, ep, columns):
    path = meta.parquet_path(ep)
    where = meta.where(ep, path)
    table = _episode_table(meta, ep, path, where)
    if table.num_rows == 0:
        fail(where, "parquet file has no rows", "drop the episode from meta/episodes.jsonl or re-export it")
    arrays, f32_error = {}, {}
    for col in columns:
        if col.flags & kFlagSynthesized:
            continue
        if col.name not in table.column_names:
            fail(where, f"column '{col.name}' is missing (the first episode has it)",
                 "re-export the episode with the same columns as the others")
        values = _column_values(meta, ep, path, table, col)
        if col.dtype == kDtypeFloat32 and values.dtype == np.float64:
            v32 = values.astype(np.float32)
            if not np.isfinite(v32).all():
                r, *d = np.argwhere(~np.isfinite(v32))[0]
                fail(where, f"column '{col.name}' value {values[r, d[0]] if d else values[r]} at row {r} "
                     "overflows float32", "rescale the values into float32 range (|x| < 3.4e38)")
            # round-to-nearest float32 is within half an ulp: relative error <= 2^-24 for
            # normal numbers, absolute error <= 2^-150 (half the smallest subnormal) below
            err = np.abs(v32.astype(np.float64) - values)
            normal = np.abs(values) >= np.finfo(np.float32).tiny
            ok = np.where(normal, err <= 2.0 ** -24 * np.abs(values), err <= 2.0 ** -150)
            if not ok.all():
                r = np.argwhere(~ok)[0]
                fail(where, f"column '{col.name}' at {tuple(int(i) for i in r)}: float32 rounding error "
                     f"{err[tuple(r)]:.3g} exceeds half an ulp", "report this converter bug")
            rel = np.where(normal, err / np.where(normal, np.abs(values), 1.0), 0.0)
            f32_error[col.name] = (float(err.max(initial=0.0)), float(rel.max(initial=0.0)))
            values = v32
        arrays[col.name] = values
    rows = table.num_rows

    ts = np.asarray(arrays["timestamp"], dtype=np.float64).reshape(rows)
    dts = np.diff(ts)
    if np.any(dts <= 0):
        r = int(np.argmax(dts <= 0)) + 1
        fail(where, f"timestamps are not increasing: row {r} has {ts[r]:.6f} s after {ts[r - 1]:.6f} s at row {r - 1}",
             "sort the rows by time and remove duplicates, then re-export the episode")
    if "frame_index" in arrays:
        fi = np.asarray(arrays["frame_index"]).reshape(rows)
        d = np.diff(fi)
        if np.any(d <= 0):
            r = int(np.argmax(d <= 0)) + 1
            fail(where, f"frame_index is not monotonic: row {r} has frame_index {fi[r]} after {fi[r - 1]} at row {r - 1}",
                 "sort the rows by frame_index and remove duplicates, then re-export the episode")
        if fi[0] != 0 or np.any(d != 1):
            r = 0 if fi[0] != 0 else int(np.argmax(d != 1)) + 1
            fail(where, f"frame_index is not 0, 1, 2, ...: row {r} has frame_index {fi[r]}",
                 "renumber frame_index from 0 in steps of 1 (one row per video frame)")
    else:
        arrays["frame_index"] = np.arange(rows, dtype=np.int64)
    if "episode_index" in arrays:
        ei = np.asarray(arrays["episode_index"]).reshape(rows)
        if np.any(ei != ep):
            r = int(np.argmax(ei != ep))
            fail(where, f"column episode_index is {ei[r]} at row {r}, but the file belongs to episode {ep}",
                 "fix episode_index in the parquet file or rename the file")
    used = set()
    for key in ["task_index", *meta.annotation_keys]:
        if key in arrays:
            vals = np.unique(np.asarray(arrays[key]).reshape(rows))
            unknown = [int(v) for v in vals if int(v) not in meta.tasks]
            if unknown:
                fail(where, f"column '{key}' refers to task index {unknown[0]}, which {meta.tasks_file} does not "
                     "list", f"add the task to {meta.tasks_file} or fix the column")
            used.update(int(v) for v in vals)
    return EpisodeData(ep, rows, arrays, ts, sorted(used), f32_error)
