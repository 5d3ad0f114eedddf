"""Python reader of a LoongForge dataset folder and the reference sample pipeline.

Contract
- Implements docs/shard-format.md (reading) and docs/training-semantics.md
  sections 1-4 (which samples, in which order, built how) exactly; the C++ data
  room implements the same two pages, and the parity tests compare the two.
- `LFDataset(path)`: parses loongforge_dataset.json, maps every shard with
  numpy.memmap and checks header, column table and index (magic, version,
  CRC32, sizes, 64-byte alignment, column names/dtypes against the JSON).
  Each episode record's CRC32 is checked the first time one of its arrays is
  touched (once per process). Errors are `DataError`s naming the file, the
  episode and what to do. Arrays are read-only views into the mapping.
- `Sampler`: SplitMix64 Fisher-Yates epoch permutation in pure Python ints;
  optimizer step s takes the global batch of G = B x K x W samples
  perm_e[j*G .. (j+1)*G) (e = s // T, j = s % T, T = N // G), micro-batch i
  of rank r holds block positions q = i*B*W + b*W + r (section 2).
- `SampleBuilder(dataset, model_cfg, data_cfg, processor=None)`: one sample (section 3) and
  `micro_batch(step, i, rank, world)`: the full model batch of micro-batch i
  of optimizer step `step` on a rank, including the flow-matching draws
  `fm_t`/`fm_noise`, drawn per sample from its stream position (section 4).
  `data_cfg` is the effective trainer config as printed by
  `loongforge-train --print-config` (a nested dict with at least `run.seed`,
  `data.*`, `trainer.micro_batch_size` and
  `trainer.gradient_accumulation_steps`); Python defines no defaults.
  `processor` is the model's batch_spec.json "processor" record (upstream
  GR00T N1.7's or N1.6's state/action preparation, section 3; N1.7's state
  dropout, section 4), None for the dataset form.
- Video: each episode's video is decoded ONCE with the ffmpeg CLI to raw
  yuv420p frames and kept in a per-process LRU cache bounded in bytes; RGB is
  computed with the contract's integer BT.601 formula. Streams that are not
  yuv420p are converted to rgb24 by ffmpeg (swscale) with a warning: the
  bit-exact parity guarantee does not cover them. Without an ffmpeg CLI the
  reader falls back to OpenCV, then PyAV, with a warning that parity with the
  C++ decoder is then approximate.
- `SampleDataset` + `MicroBatchSampler` + `collate_samples`: the same samples
  for a torch DataLoader (workers decode); the caller adds the flow-matching
  draws with `SampleBuilder.add_draws(batch, step, i, rank, world)` in the main process.

Usage
    ds = LFDataset("build/datasets/robot_sim.PickNPlace.lf")
    sb = SampleBuilder(ds, model_cfg, effective_cfg)
    batch = sb.micro_batch(0, 0, rank=0, world=1)   # step 0, micro-batch 0: Dict[str, Tensor]
"""

import bisect
import collections
import json
import math
import os
import shutil
import struct
import subprocess
import threading
import types
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

# ---------------------------------------------------------------------------- errors


class DataError(RuntimeError):
    """A dataset that cannot be read as docs/shard-format.md says; the message
    names the file (and episode) and what to do."""


def _fix(what: str) -> str:
    return f"{what}; re-convert the dataset with scripts/convert_lerobot.py"


# ---------------------------------------------------------------------------- shard format constants

SHARD_MAGIC = b"LFSHARD\0"
RECORD_MAGIC = b"LFEPISOD"
HEADER_BYTES, COLUMN_ENTRY_BYTES, INDEX_ENTRY_BYTES, DIR_ENTRY_BYTES, ALIGN = 128, 96, 32, 32, 64
NO_CAMERA = 0xFFFFFFFF

# dtype code -> (numpy dtype, JSON name, element bytes)
DTYPES = {
    1: (np.dtype("<f4"), "float32", 4),
    2: (np.dtype("<f8"), "float64", 8),
    3: (np.dtype("<i8"), "int64", 8),
    4: (np.dtype("u1"), "uint8", 1),
    5: (np.dtype("<i4"), "int32", 4),
}


def crc32(data) -> int:
    """CRC-32/ISO-HDLC (zlib's): crc32(b"123456789") == 0xCBF43926."""
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass
class Column:
    column_id: int
    name: str
    dtype: int
    elem_bytes: int
    width: int
    row_kind: int          # 0 per parquet row, 1 per decoded frame of camera_id
    camera_id: int         # NO_CAMERA when none
    source_dtype: int
    flags: int


@dataclass
class IndexEntry:
    episode_index: int
    record_offset: int
    record_bytes: int
    row_count: int
    record_crc32: int


@dataclass
class Episode:
    """One entry of loongforge_dataset.json episodes[], in its order."""
    position: int          # 0-based position in episodes[] (the sample space order)
    episode_index: int
    length: int
    shard_id: int
    entry: IndexEntry
    videos: Dict[int, Dict[str, Any]]   # camera_id -> the JSON video entry
    arrays: Optional[Dict[int, Tuple[int, int, int]]] = None  # column_id -> (offset, rows, bytes), after checks


# ---------------------------------------------------------------------------- one shard


class Shard:
    """One memory-mapped shard file with its header, column table and index checked."""

    def __init__(self, path: Path, shard_id: int):
        self.path = path
        self.shard_id = shard_id
        self._open()

    def _err(self, what: str) -> DataError:
        return DataError(f"{self.path}: {_fix(what)}")

    def _open(self) -> None:
        try:
            size = os.path.getsize(self.path)
        except OSError as e:
            raise DataError(f"cannot open shard '{self.path}': {e.strerror}; "
                            "re-run scripts/convert_lerobot.py") from None
        if size < HEADER_BYTES:
            raise self._err("file is shorter than the 128-byte shard header (truncated?)")
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r")   # (file_bytes,)
        h = bytes(self.buf[:HEADER_BYTES])
        if h[:8] != SHARD_MAGIC:
            raise self._err(f"bad magic {h[:8]!r}, expected {SHARD_MAGIC!r} (not a LoongForge shard)")
        (version, header_bytes, alignment, shard_id, column_count, episode_count, file_bytes, ct_off, ct_bytes,
         idx_off, idx_bytes, total_rows, ct_crc, idx_crc) = struct.unpack_from("<IIIIIIQQQQQQII", h, 8)
        (header_crc,) = struct.unpack_from("<I", h, 124)
        if version != 1:
            raise self._err(f"shard format_version {version}, this reader knows 1")
        if crc32(h[:124]) != header_crc:
            raise self._err("header_crc32 mismatch (header corrupted)")
        if header_bytes != HEADER_BYTES or alignment != ALIGN:
            raise self._err(f"header_bytes {header_bytes} / alignment {alignment}, expected 128 / 64")
        if file_bytes != size:
            raise self._err(f"header says file_bytes={file_bytes} but the file has {size} bytes "
                            "(truncated or appended)")
        if shard_id != self.shard_id:
            raise self._err(f"header shard_id {shard_id} but loongforge_dataset.json lists it as shard {self.shard_id}")
        if ct_off != HEADER_BYTES or ct_bytes != column_count * COLUMN_ENTRY_BYTES or ct_off + ct_bytes > size:
            raise self._err(f"column table at {ct_off} ({ct_bytes} bytes) does not fit the header/file")
        if idx_off % ALIGN or idx_bytes != episode_count * INDEX_ENTRY_BYTES or idx_off + idx_bytes > size:
            raise self._err(f"index at {idx_off} ({idx_bytes} bytes) is misaligned or runs past the file")
        ct = bytes(self.buf[ct_off:ct_off + ct_bytes])
        if crc32(ct) != ct_crc:
            raise self._err("column_table_crc32 mismatch (column table corrupted)")
        idx = bytes(self.buf[idx_off:idx_off + idx_bytes])
        if crc32(idx) != idx_crc:
            raise self._err("index_crc32 mismatch (index corrupted)")
        self.total_rows = total_rows
        self.columns = [self._column(ct, i) for i in range(column_count)]
        self.index: Dict[int, IndexEntry] = {}
        for k in range(episode_count):
            ep, off, nbytes, rows, rcrc = struct.unpack_from("<qQQII", idx, k * INDEX_ENTRY_BYTES)
            if off % ALIGN or nbytes % ALIGN or off + nbytes > size:
                raise self._err(f"index entry {k} (episode {ep}): record at {off} ({nbytes} bytes) "
                                "is misaligned or runs past the file")
            self.index[ep] = IndexEntry(ep, off, nbytes, rows, rcrc)

    @staticmethod
    def _column(ct: bytes, i: int) -> Column:
        raw = ct[i * COLUMN_ENTRY_BYTES:(i + 1) * COLUMN_ENTRY_BYTES]
        name = raw[:64].split(b"\0", 1)[0].decode("utf-8")
        dtype, elem, width, row_kind, cam, src, flags, _ = struct.unpack_from("<8I", raw, 64)
        return Column(i, name, dtype, elem, width, row_kind, cam, src, flags)

    def reopen(self) -> None:
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r")


# ---------------------------------------------------------------------------- the dataset folder


class LFDataset:
    """A LoongForge dataset folder (docs/shard-format.md), memory-mapped.

    Sample space (training-semantics s1): every (episode, row), episode-major in
    episodes[] order; `locate(i)` maps sample i to (episode position, row)."""

    def __init__(self, path):
        self.root = Path(path)
        meta_path = self.root / "loongforge_dataset.json"
        try:
            with open(meta_path, "r", encoding="utf-8") as f:
                self.meta = json.load(f)
        except FileNotFoundError:
            raise DataError(f"{meta_path}: missing; is '{self.root}' a folder written by "
                            "scripts/convert_lerobot.py?") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{meta_path}: not valid JSON ({e}); re-convert the dataset") from None
        m = self.meta
        if m.get("format") != "loongforge-dataset" or m.get("format_version") != 1:
            raise DataError(f"{meta_path}: format {m.get('format')!r} version {m.get('format_version')!r}, "
                            "this reader knows 'loongforge-dataset' version 1")
        self.columns_json = m["columns"]
        self.column_ids = {c["name"]: c["column_id"] for c in self.columns_json}
        self.shards = [Shard(self.root / s["file"], s["shard_id"]) for s in m["shards"]]
        for s in self.shards:
            self._check_columns(s)
        self.cameras = m["cameras"]
        self.tasks = {t["task_index"]: t for t in m["tasks"]}
        self.stats = m["stats"]
        self.episodes: List[Episode] = []
        self.starts: List[int] = []        # first sample index of each episode
        n = 0
        for pos, e in enumerate(m["episodes"]):
            self.episodes.append(self._episode(pos, e))
            self.starts.append(n)
            n += e["length"]
        self.num_samples = n
        self._verified = set()             # episode positions whose record CRC was checked
        self._lock = threading.Lock()

    # -- pickling for DataLoader workers: reopen the mappings instead of copying them
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_lock"] = None
        state["shards"] = [(s.path, s.shard_id) for s in self.shards]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.shards = [Shard(p, i) for p, i in self.shards]

    # -- checks
    def _check_columns(self, s: Shard) -> None:
        def bad(what: str) -> DataError:
            return DataError(f"{s.path}: {_fix(what)}")
        if len(s.columns) != len(self.columns_json):
            raise bad(f"{len(s.columns)} columns but loongforge_dataset.json lists {len(self.columns_json)}")
        for c, j in zip(s.columns, self.columns_json):
            if c.dtype not in DTYPES:
                raise bad(f"column {c.name!r} has unknown dtype code {c.dtype}")
            _, name, elem = DTYPES[c.dtype]
            if c.name != j["name"] or name != j["dtype"] or c.width != j["width"] or c.elem_bytes != elem:
                raise bad(f"column {c.column_id} is {c.name!r} {name} x{c.width} in the shard but "
                          f"{j['name']!r} {j['dtype']} x{j['width']} in loongforge_dataset.json")

    def _episode(self, pos: int, e: Dict) -> Episode:
        sid = e["shard_id"]
        if not 0 <= sid < len(self.shards):
            raise DataError(f"{self.root}/loongforge_dataset.json: episode {e['episode_index']} names shard {sid}, "
                            f"which does not exist; re-convert the dataset")
        shard = self.shards[sid]
        entry = shard.index.get(e["episode_index"])
        if entry is None:
            raise DataError(f"{shard.path}: episode {e['episode_index']} is not in the shard index; "
                            "re-convert the dataset")
        if (entry.record_offset, entry.record_bytes, entry.record_crc32, entry.row_count) != \
                (e["record_offset"], e["record_bytes"], e["record_crc32"], e["length"]):
            raise DataError(f"{shard.path}: episode {e['episode_index']}: index entry disagrees with "
                            "loongforge_dataset.json (offset/bytes/crc/rows); re-convert the dataset")
        videos = {v["camera_id"]: v for v in e.get("videos", [])}
        return Episode(pos, e["episode_index"], e["length"], sid, entry, videos)

    def _check_record(self, ep: Episode) -> None:
        """Record CRC and directory checks, once per episode per process."""
        shard = self.shards[ep.shard_id]
        en = ep.entry
        where = f"{shard.path}: episode {ep.episode_index}"
        rec = shard.buf[en.record_offset:en.record_offset + en.record_bytes]     # (record_bytes,)
        if crc32(rec) != en.record_crc32:
            raise DataError(f"{where}: record_crc32 mismatch (the record is corrupted); re-convert the dataset")
        head = bytes(rec[:64])
        if head[:8] != RECORD_MAGIC:
            raise DataError(f"{where}: bad record magic {head[:8]!r}; re-convert the dataset")
        ep_idx, rows, nbytes, count = struct.unpack_from("<qQQI", head, 8)
        if (ep_idx, rows, nbytes, count) != (en.episode_index, en.row_count, en.record_bytes, len(shard.columns)):
            raise DataError(f"{where}: record header (episode {ep_idx}, rows {rows}, bytes {nbytes}, arrays {count}) "
                            "disagrees with the index; re-convert the dataset")
        directory = bytes(rec[64:64 + DIR_ENTRY_BYTES * count])
        arrays = {}
        for i, col in enumerate(shard.columns):
            cid, _, off, arows, abytes = struct.unpack_from("<IIQQQ", directory, i * DIR_ENTRY_BYTES)
            if cid != i or off % ALIGN or off + abytes > nbytes:
                raise DataError(f"{where}: array directory entry {i} ({col.name}) is malformed; re-convert the dataset")
            if abytes != arows * col.width * col.elem_bytes:
                raise DataError(f"{where}: column {col.name}: {abytes} bytes for {arows} rows of width {col.width}; "
                                "re-convert the dataset")
            if col.row_kind == 0 and arows != rows:
                raise DataError(f"{where}: column {col.name} has {arows} rows, the episode {rows}; "
                                "re-convert the dataset")
            arrays[i] = (off, arows, abytes)
        ep.arrays = arrays

    # -- access
    def locate(self, i: int) -> Tuple[int, int]:
        """Sample index -> (episode position, row)."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} outside [0, {self.num_samples})")
        e = bisect.bisect_right(self.starts, i) - 1
        return e, i - self.starts[e]

    def column_id(self, name: str) -> int:
        if name not in self.column_ids:
            raise DataError(f"{self.root}: dataset has no column {name!r}; columns: {sorted(self.column_ids)}")
        return self.column_ids[name]

    def array(self, episode: int, name: str) -> np.ndarray:
        """Column `name` of episode position `episode` as a read-only (rows, width) view."""
        ep = self.episodes[episode]
        if episode not in self._verified:
            with self._lock:
                if episode not in self._verified:
                    self._check_record(ep)
                    self._verified.add(episode)
        cid = self.column_id(name)
        shard = self.shards[ep.shard_id]
        col = shard.columns[cid]
        off, rows, nbytes = ep.arrays[cid]
        start = ep.entry.record_offset + off
        np_dt = DTYPES[col.dtype][0]
        return shard.buf[start:start + nbytes].view(np_dt).reshape(rows, col.width)   # (rows, width)

    def video_file(self, episode: int, camera_id: int) -> Tuple[Path, Dict]:
        ep = self.episodes[episode]
        if camera_id not in ep.videos:
            raise DataError(f"{self.root}: episode {ep.episode_index} has no video for camera {camera_id}; "
                            "re-convert the dataset")
        v = ep.videos[camera_id]
        return self.root / v["file"], v


# ---------------------------------------------------------------------------- section 2: order

MASK64 = 0xFFFFFFFFFFFFFFFF
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


class SplitMix64:
    """SplitMix64 exactly as training-semantics s2, in Python ints masked to 64 bits."""

    def __init__(self, seed: int, epoch: int):
        self.state = (seed + epoch * GOLDEN_GAMMA) & MASK64

    def next(self) -> int:
        self.state = (self.state + GOLDEN_GAMMA) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool = True) -> List[int]:
    """Fisher-Yates from the identity, i = n-1 down to 1, j = next() % (i + 1)."""
    perm = list(range(n))
    if not shuffle:
        return perm
    rng = SplitMix64(seed, epoch)
    for i in range(n - 1, 0, -1):
        j = rng.next() % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


EPISODE_ORDER_SALT = 0x6570697365646573   # "episodes"


def episode_order(lengths: List[int], seed: int, epoch: int, open_episodes: int, buffer: int) -> List[int]:
    """data.sampler=episode (section 2): `open_episodes` episodes, in the order of
    epoch_permutation(#episodes, seed ^ salt, epoch), read front to back one sample from each in
    turn; each sample enters a buffer, and once `buffer` are held a uniformly drawn one leaves
    (swap with the last); a finished episode is replaced by the next; the buffer drains at the end."""
    start = [0]
    for n in lengths:
        start.append(start[-1] + n)
    salted = seed ^ EPISODE_ORDER_SALT
    episodes = epoch_permutation(len(lengths), salted, epoch)
    rng = SplitMix64(salted + GOLDEN_GAMMA // 2, epoch)
    taken = 0

    def open_next():
        nonlocal taken
        while taken < len(episodes):
            e = episodes[taken]
            taken += 1
            if lengths[e] > 0:
                return [start[e], start[e + 1]]
        return None

    reading = []
    while len(reading) < open_episodes:
        c = open_next()
        if c is None:
            break
        reading.append(c)
    out, held = [], []

    def release():
        k = rng.next() % len(held)
        out.append(held[k])
        held[k] = held[-1]
        held.pop()

    j = 0
    while reading:
        held.append(reading[j][0])
        reading[j][0] += 1
        if reading[j][0] == reading[j][1]:
            c = open_next()
            if c is None:
                del reading[j]
                if j == len(reading):
                    j = 0
            else:
                reading[j] = c
                j = (j + 1) % len(reading)
        else:
            j = (j + 1) % len(reading)
        if len(held) >= buffer:
            release()
    while held:
        release()
    return out


class Sampler:
    """Which samples micro-batch i of optimizer step s of a rank holds (training-semantics s2):
    block position q = i*B*W + b*W + r of the step's global batch perm_e[j*G .. (j+1)*G)."""

    def __init__(self, num_samples: int, seed: int, shuffle: bool, rank: int, world: int, micro_batch_size: int,
                 accumulation: int, episodes: Optional[Tuple[List[int], int, int]] = None):
        if world < 1 or not 0 <= rank < world or micro_batch_size < 1 or accumulation < 1:
            raise DataError(f"sampler: rank {rank} of world {world}, micro_batch_size {micro_batch_size}, "
                            f"accumulation {accumulation}: need 0 <= rank < world and sizes >= 1")
        self.n, self.seed, self.shuffle = num_samples, seed, shuffle
        self.rank, self.world, self.B, self.K = rank, world, micro_batch_size, accumulation
        self.G = micro_batch_size * accumulation * world
        self.steps_per_epoch = num_samples // self.G
        if self.steps_per_epoch < 1:
            raise DataError(f"the dataset has {num_samples} samples, fewer than one global batch G = B x K x W = "
                            f"{micro_batch_size} x {accumulation} x {world} = {self.G} "
                            "(trainer.micro_batch_size x trainer.gradient_accumulation_steps x world size): lower "
                            "trainer.micro_batch_size or trainer.gradient_accumulation_steps, or use fewer ranks")
        self._epoch, self._perm = -1, []
        # data.sampler=episode: (episode lengths, open_episodes, shuffle_buffer)
        self.episodes = episodes
        if episodes is not None and sum(episodes[0]) != num_samples:
            raise DataError(f"sampler: episode order over {sum(episodes[0])} samples for a dataset of {num_samples}")

    def epoch_of_step(self, step: int) -> int:
        return step // self.steps_per_epoch

    def micro_batch(self, step: int, i: int) -> List[int]:
        """Sample ids of micro-batch i (0..K-1) of optimizer step `step`, slot order b = 0..B-1."""
        if not 0 <= i < self.K:
            raise DataError(f"sampler: micro-batch {i} of a step with gradient_accumulation_steps {self.K}")
        epoch, j = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            if self.shuffle and self.episodes is not None:
                self._perm = episode_order(self.episodes[0], self.seed, epoch, self.episodes[1], self.episodes[2])
            else:
                self._perm = epoch_permutation(self.n, self.seed, epoch, self.shuffle)
            self._epoch = epoch
        block = j * self.G
        return [self._perm[block + i * self.B * self.world + b * self.world + self.rank] for b in range(self.B)]

    def stream_position(self, step: int, i: int, b: int) -> int:
        """p = step*G + q of slot b of micro-batch i (the flow-matching draws' seed input, section 4)."""
        return step * self.G + i * self.B * self.world + b * self.world + self.rank


# ---------------------------------------------------------------------------- section 3: video


def yuv420p_to_rgb(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Integer BT.601 limited range, chroma at (x/2, y/2): y (h, w), u/v (ceil(h/2), ceil(w/2)) uint8
    -> (h, w, 3) uint8. `>>` on int32 numpy arrays is an arithmetic shift."""
    h, w = y.shape
    rows, cols = np.arange(h) // 2, np.arange(w) // 2
    c = y.astype(np.int32) - 16                                   # (h, w)
    d = u.astype(np.int32)[rows][:, cols] - 128                   # (h, w)
    e = v.astype(np.int32)[rows][:, cols] - 128                   # (h, w)
    r = np.clip((298 * c + 409 * e + 128) >> 8, 0, 255)
    g = np.clip((298 * c - 100 * d - 208 * e + 128) >> 8, 0, 255)
    b = np.clip((298 * c + 516 * d + 128) >> 8, 0, 255)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)          # (h, w, 3)


@dataclass
class DecodedVideo:
    """All frames of one episode's video: yuv420p planes (bit-exact path) or rgb24 (approximate path)."""
    pix_fmt: str                 # "yuv420p" or "rgb24"
    width: int
    height: int
    frames: np.ndarray           # yuv420p: (F, frame_bytes) uint8; rgb24: (F, h, w, 3) uint8
    exact: bool                  # True iff the contract's integer formula produced the RGB

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes)

    def rgb(self, i: int) -> np.ndarray:
        """Frame i (presentation order) as (h, w, 3) uint8."""
        if self.pix_fmt == "rgb24":
            return self.frames[i]
        w, h = self.width, self.height
        cw, ch = (w + 1) // 2, (h + 1) // 2
        f = self.frames[i]
        y = f[:w * h].reshape(h, w)
        u = f[w * h:w * h + cw * ch].reshape(ch, cw)
        v = f[w * h + cw * ch:w * h + 2 * cw * ch].reshape(ch, cw)
        return yuv420p_to_rgb(y, u, v)


_warned = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def have_ffmpeg_cli() -> bool:
    return shutil.which("ffmpeg") is not None and shutil.which("ffprobe") is not None


def probe_stream(path: Path) -> Dict[str, Any]:
    """ffprobe of the first video stream: pix_fmt, width, height, color_range."""
    cmd = ["ffprobe", "-v", "error", "-select_streams", "v:0",
           "-show_entries", "stream=pix_fmt,width,height,color_range", "-of", "json", str(path)]
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        raise DataError(f"{path}: ffprobe failed: {p.stderr.decode(errors='replace').strip()}")
    streams = json.loads(p.stdout).get("streams", [])
    if not streams:
        raise DataError(f"{path}: no video stream; re-convert the dataset")
    return streams[0]


def decode_ffmpeg(path: Path, expected_frames: int) -> DecodedVideo:
    """The whole video as raw frames in presentation order, through the ffmpeg CLI.
    `-fps_mode passthrough` keeps ffmpeg from duplicating or dropping frames (the
    rawvideo muxer would otherwise get constant-frame-rate sync) and
    `-noautorotate` keeps display-matrix rotation out, as a libavcodec decoder sees it."""
    s = probe_stream(path)
    w, h = int(s["width"]), int(s["height"])
    exact = s.get("pix_fmt") == "yuv420p"
    if not exact:
        _warn_once(f"pixfmt:{s.get('pix_fmt')}",
                   f"{path}: stream pix_fmt is {s.get('pix_fmt')!r}, not yuv420p: converting to rgb24 with "
                   "ffmpeg/swscale; bit-exact parity with the C++ trainer is not covered for this video")
    elif s.get("color_range") == "pc":
        _warn_once("range:pc", f"{path}: yuv420p stream flagged full range (pc); the contract's limited-range "
                               "formula is applied anyway, as in the C++ trainer")
    out_fmt = "yuv420p" if exact else "rgb24"
    cmd = ["ffmpeg", "-v", "error", "-nostdin", "-noautorotate", "-i", str(path), "-map", "0:v:0",
           "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", out_fmt, "-"]
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0 and b"fps_mode" in p.stderr:       # ffmpeg < 5.1 spells it -vsync
        cmd[cmd.index("-fps_mode")] = "-vsync"
        p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        raise DataError(f"{path}: ffmpeg decode failed: {p.stderr.decode(errors='replace').strip()}")
    raw = np.frombuffer(p.stdout, dtype=np.uint8)
    frame_bytes = w * h + 2 * ((w + 1) // 2) * ((h + 1) // 2) if exact else w * h * 3
    if raw.size % frame_bytes:
        raise DataError(f"{path}: ffmpeg produced {raw.size} bytes, not a whole number of {w}x{h} {out_fmt} frames")
    n = raw.size // frame_bytes
    if n != expected_frames:
        raise DataError(f"{path}: decoded {n} frames but loongforge_dataset.json says {expected_frames}; "
                        "re-convert the dataset")
    frames = raw.reshape(n, frame_bytes) if exact else raw.reshape(n, h, w, 3)
    return DecodedVideo(out_fmt, w, h, frames, exact)


def decode_fallback(path: Path, expected_frames: int) -> DecodedVideo:
    """OpenCV, then PyAV: RGB through their own conversion (approximate parity)."""
    frames: List[np.ndarray] = []
    try:
        import cv2  # noqa: F401
        _warn_once("fallback", "no ffmpeg CLI: decoding videos with OpenCV; parity with the C++ decoder "
                               "(integer BT.601 from yuv420p) is approximate")
        cap = cv2.VideoCapture(str(path))
        if not cap.isOpened():
            raise DataError(f"{path}: OpenCV cannot open the video")
        while True:
            ok, bgr = cap.read()
            if not ok:
                break
            frames.append(np.ascontiguousarray(bgr[:, :, ::-1]))   # BGR -> RGB, (h, w, 3)
        cap.release()
    except ImportError:
        try:
            import av
        except ImportError:
            raise DataError(f"{path}: cannot decode video: no ffmpeg/ffprobe CLI, no OpenCV (cv2), no PyAV (av); "
                            "install one of them") from None
        _warn_once("fallback", "no ffmpeg CLI and no OpenCV: decoding videos with PyAV; parity with the C++ "
                               "decoder (integer BT.601 from yuv420p) is approximate")
        with av.open(str(path)) as c:
            for fr in c.decode(video=0):
                frames.append(fr.to_ndarray(format="rgb24"))
    if len(frames) != expected_frames:
        raise DataError(f"{path}: decoded {len(frames)} frames but loongforge_dataset.json says {expected_frames}")
    arr = np.stack(frames)                                            # (F, h, w, 3)
    return DecodedVideo("rgb24", arr.shape[2], arr.shape[1], arr, False)


def decode_video(path: Path, expected_frames: int) -> DecodedVideo:
    if have_ffmpeg_cli():
        return decode_ffmpeg(path, expected_frames)
    return decode_fallback(path, expected_frames)


class VideoCache:
    """LRU of decoded episodes, bounded by bytes (one per process; DataLoader workers each have one).
    A single video larger than the budget is still decoded and kept until the next one."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: "collections.OrderedDict[Tuple[str, int], DecodedVideo]" = collections.OrderedDict()
        self.bytes = 0
        self.decodes = 0
        self._lock = threading.Lock()

    def get(self, path: Path, expected_frames: int) -> DecodedVideo:
        key = (str(path), expected_frames)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        video = decode_video(path, expected_frames)
        with self._lock:
            self.decodes += 1
            self._items[key] = video
            self.bytes += video.nbytes
            while self.bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self.bytes -= old.nbytes
        return video


def center_crop(frame: np.ndarray, fraction: float) -> np.ndarray:
    """(h, w, 3) -> the center (ch, cw, 3), ch = int(h * fraction) (at least 1), top (h - ch) // 2;
    columns likewise (training-semantics s3); fraction 1 keeps the frame."""
    if fraction >= 1.0:
        return frame
    h, w = frame.shape[:2]
    ch, cw = max(1, int(h * fraction)), max(1, int(w * fraction))
    top, left = (h - ch) // 2, (w - cw) // 2
    return frame[top:top + ch, left:left + cw]


def aspect_step(frame: np.ndarray, aspect: str) -> np.ndarray:
    """data.image_aspect on a (h, w, 3) uint8 frame, after its center_crop (training-semantics s3):
    squash keeps it; crop keeps its center square, side = min(h, w), top (h - side) // 2, left
    (w - side) // 2; pad centers it on a black q x q square, q = max(h, w), (q - w) // 2 columns on the
    left and (q - h) // 2 rows on top, the rest right and below (as letterbox() places them)."""
    h, w = frame.shape[:2]
    if aspect == "squash" or h == w:
        return frame
    if aspect == "crop":
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        return frame[top:top + side, left:left + side]
    q = max(h, w)
    left, top = (q - w) // 2, (q - h) // 2
    return np.pad(frame, ((top, q - h - top), (left, q - w - left), (0, 0)))


def letterbox(x: Tensor) -> Tensor:
    """(..., h, w) -> (..., q, q), q = max(h, w): zeros around x, (q - w) // 2 columns on the left and
    (q - h) // 2 rows on top, the rest right and below (image_letterbox)."""
    h, w = x.shape[-2], x.shape[-1]
    q = max(h, w)
    if h == w:
        return x
    left, top = (q - w) // 2, (q - h) // 2
    return F.pad(x, (left, q - w - left, top, q - h - top), value=0)


def cv2_area_to_model(frames_rgb: List[np.ndarray], size: int, crop_fraction: float, target: int = 0,
                      letterboxed: bool = False, crop_position: Optional[Tuple[float, float]] = None) -> Tensor:
    """image_resample=cv2_area (training-semantics s3; GR00T N1.7 checkpoints saved with
    use_albumentations): each frame (h, w, 3) uint8, padded to a square first when letterboxed (as
    letterbox() does), gets its shorter side resized to T (T = target, or size when 0) by OpenCV's
    INTER_AREA, the longer side to round(side * T / shorter) (skipped when the shorter side is T);
    when 0 < f < 1 it is center-cropped to int(side * f) rows and columns (at least 1) from
    (side - crop) // 2 and its shorter side resized to T again; then, as a (3, T, T) uint8 tensor,
    resized to (size, size) by antialiased bicubic unless T is size (upstream's processor), and
    (v - 127.5) / 127.5 in float32. A frame that is not square after the first resize is refused:
    upstream keeps its aspect ratio, the model takes square images. With crop_position (pos_y, pos_x)
    the window's top (left) is round((side - crop) * pos) instead (image_random_crop: upstream's
    train-time crop; the position drawn per sample, SampleBuilder.crop_position). -> (V, 3, S, S)."""
    try:
        import cv2  # upstream's own resize (opencv-python-headless, scripts/requirements-test.txt)
    except ImportError:
        raise RuntimeError("image_resample=cv2_area needs OpenCV's Python module (pip install "
                           "opencv-python-headless==5.1.0.95, as scripts/requirements-test.txt pins it)") from None
    T = target or size

    def shorter_to(x: np.ndarray) -> np.ndarray:
        h, w = x.shape[:2]
        if min(h, w) == T:
            return x
        scale = T / float(min(h, w))
        return cv2.resize(x, (max(1, int(round(w * scale))), max(1, int(round(h * scale)))),
                          interpolation=cv2.INTER_AREA)

    out = []
    for f in frames_rgb:
        x = np.ascontiguousarray(f)
        if letterboxed and x.shape[0] != x.shape[1]:
            x = np.ascontiguousarray(letterbox(torch.from_numpy(x).permute(2, 0, 1)).permute(1, 2, 0).numpy())
        x = shorter_to(x)
        if x.shape[0] != x.shape[1]:
            raise ValueError(f"image_resample cv2_area: a {f.shape[0]} x {f.shape[1]} frame becomes "
                             f"{x.shape[0]} x {x.shape[1]} (upstream's albumentations transform keeps the aspect "
                             "ratio), but the model takes square images; import the checkpoint with "
                             "letter_box_transform, or use square frames")
        if 0.0 < crop_fraction < 1.0:
            side = x.shape[0]
            c = max(1, int(side * crop_fraction))
            top = left = (side - c) // 2
            if crop_position is not None:
                top, left = (int(round((side - c) * min(max(pos, 0.0), 1.0))) for pos in crop_position)
            x = shorter_to(np.ascontiguousarray(x[top:top + c, left:left + c]))
        t = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None]               # (1, 3, T, T) uint8
        if T != size:
            t = F.interpolate(t, size=(size, size), mode="bicubic", antialias=True)
        out.append(t[0])
    return (torch.stack(out).to(torch.float32) - 127.5) / 127.5


def chw_u8(frame: np.ndarray, letterboxed: bool) -> Tensor:
    """(h, w, 3) uint8 -> (1, 3, h, w) uint8, padded to a square first when letterboxed (letterbox())."""
    x = torch.from_numpy(np.ascontiguousarray(frame.transpose(2, 0, 1)))[None]
    return letterbox(x).contiguous() if letterboxed else x


def resize_aa(x: Tensor, side: int, mode: str) -> Tensor:
    """(..., 3, h, w) uint8 -> (..., 3, side, side) by antialiased `mode` interpolation on uint8 (none when it is)."""
    if tuple(x.shape[-2:]) == (side, side):
        return x
    return F.interpolate(x, size=(side, side), mode=mode, antialias=True)


def antialiased_to_model(frames_rgb: List[np.ndarray], mode: str, first: int, crop_fraction: float, target: int,
                         size: int, letterboxed: bool, offset) -> Tensor:
    """The antialiased transforms' steps: each frame v (chw_u8, letterboxed when asked) resized to (first,
    first) by `mode` (resize_aa), when 0 < f < 1 its c = round(first * f) rows and columns from (top,
    left) = offset(first - c, v), resized to (target, target), then to (size, size), each unless it is
    that size already, then (v - 127.5) / 127.5 in float32 -> (V, 3, size, size)."""
    out = []
    for v, f in enumerate(frames_rgb):
        x = resize_aa(chw_u8(f, letterboxed), first, mode)                                    # (1, 3, first, first)
        if 0.0 < crop_fraction < 1.0:
            c = max(1, int(round(first * crop_fraction)))
            top, left = offset(first - c, v)
            x = x[..., top:top + c, left:left + c].contiguous()
        out.append(resize_aa(resize_aa(x, target, mode), size, mode)[0])                      # (3, S, S) uint8
    return (torch.stack(out).to(torch.float32) - 127.5) / 127.5


def bicubic_aa_to_model(frames_rgb: List[np.ndarray], size: int, crop_fraction: float, edge: int,
                        target: int = 0, letterboxed: bool = False) -> Tensor:
    """image_resample=bicubic_aa (training-semantics s3; GR00T N1.7's default transform): each frame
    (h, w, 3) uint8 as a (1, 3, h, w) uint8 tensor, padded to a square first when letterboxed
    (letterbox(), image_letterbox), is resized to (E, E) (E = edge, or T when 0; T =
    target, or size when 0) by antialiased bicubic interpolation on uint8 unless it is E x E,
    center-cropped to c = round(E * f) rows and columns from (E - c) // 2 when 0 < f < 1, resized to
    (T, T) the same way unless it is (upstream's transform ends here), resized to (size, size) the same
    way unless it is (upstream's processor: its smart_resize size), then (v - 127.5) / 127.5 in
    float32, as upstream's Qwen3-VL processor normalises (its rescale fused into mean and std 0.5 *
    255). -> (V, 3, S, S)."""
    T = target or size
    return antialiased_to_model(frames_rgb, "bicubic", edge or T, crop_fraction, T, size, letterboxed,
                                lambda room, v: (room // 2, room // 2))


def bilinear_aa_to_model(frames_rgb: List[np.ndarray], size: int, crop_fraction: float, target: int = 0,
                         letterboxed: bool = False,
                         crop_positions: Optional[List[Tuple[float, float]]] = None) -> Tensor:
    """image_resample=bilinear_aa (training-semantics s3; Isaac-GR00T N1.6's torchvision transform at
    eval, then Eagle's processor): each frame (h, w, 3) uint8 as a (1, 3, h, w) uint8 tensor, padded to
    a square first when letterboxed, is resized to (T, T) (T = target, or size when 0; the aspect ratio
    not kept) by antialiased bilinear interpolation on uint8 unless it is T x T; when 0 < f < 1
    center-cropped to c = round(T * f) rows and columns from round((T - c) / 2) (torchvision's
    CenterCrop) and resized back to (T, T) the same way; resized to (size, size) the same way unless it
    is; then (v - 127.5) / 127.5 in float32 (Eagle's processor: its rescale fused into mean and std 0.5
    * 255). With crop_positions, one (pos_y, pos_x) per frame, frame v's window's top (left) is
    min(floor((T - c + 1) * pos), T - c) instead: torchvision's RandomCrop offsets (image_random_crop,
    Isaac-GR00T N1.6's train-time transform; the positions drawn per sample, SampleBuilder.crop_positions).
    -> (V, 3, S, S)."""
    T = target or size

    def offset(room: int, v: int) -> Tuple[int, int]:
        if crop_positions is None:
            return int(round(room / 2.0)), int(round(room / 2.0))
        return tuple(min(int(math.floor((room + 1) * p)), room) for p in crop_positions[v])

    return antialiased_to_model(frames_rgb, "bilinear", T, crop_fraction, T, size, letterboxed, offset)


def image_to_model(frames_rgb: List[np.ndarray], size: int, crop_fraction: float = 1.0,
                   aspect: str = "squash") -> Tensor:
    """V RGB frames (h, w, 3) uint8 -> (V, 3, S, S) float32: center_crop(crop_fraction), then
    aspect_step(aspect) (data.image_aspect), then adaptive_avg_pool2d of the 0..255 values, then
    ((v / 255) - 0.5) / 0.5."""
    frames_rgb = [aspect_step(center_crop(f, crop_fraction), aspect) for f in frames_rgb]
    shapes = {f.shape for f in frames_rgb}
    if len(shapes) == 1:
        x = torch.from_numpy(np.stack(frames_rgb).transpose(0, 3, 1, 2).astype(np.float32))  # (V, 3, h, w)
        x = F.adaptive_avg_pool2d(x.contiguous(), (size, size))                              # (V, 3, S, S)
    else:  # cameras of different sizes: pool each (3, h, w) on its own (same per-element arithmetic)
        x = torch.stack([F.adaptive_avg_pool2d(
            torch.from_numpy(f.transpose(2, 0, 1).astype(np.float32)).contiguous(), (size, size))
            for f in frames_rgb])
    return ((x / 255) - 0.5) / 0.5


# ---------------------------------------------------------------------------- section 3: normalization


def mean_std_normalize(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """float32 values (..., width) -> float32: in float64, y = (x - mean) / std, 0 where std < 1e-8."""
    xd = x.astype(np.float64)
    safe = np.where(std < 1e-8, 1.0, std)
    y = np.where(std < 1e-8, 0.0, (xd - mean) / safe)
    return y.astype(np.float32)


def min_max_normalize(x: np.ndarray, mn: np.ndarray, mx: np.ndarray) -> np.ndarray:
    """float32 values (..., width) -> float32: in float64, d = max - min; y = ((2*(x - min)) / d) - 1,
    0 where d < 1e-8; then rounded to float32. No clipping."""
    xd = x.astype(np.float64)
    d = mx - mn                                                   # (width,)
    safe = np.where(d < 1e-8, 1.0, d)
    y = ((2.0 * (xd - mn)) / safe) - 1.0
    y = np.where(d < 1e-8, 0.0, y)
    return y.astype(np.float32)


def gr00t_n17_normalize(x: np.ndarray, mn: np.ndarray, mx: np.ndarray, clip: bool,
                        range32: bool = True) -> np.ndarray:
    """Upstream GR00T N1.7's min-max (processor "gr00t_n17", section 3): on float32 data every operand
    float32, d = max - min; y = ((2 * (x - min)) / d) - 1, 0 where d == 0; clipped to [-1, 1] when clip.
    On float64 data (a dataset converted with --keep-float64) the same steps in float64 with the float32
    statistics, d rounded to float32 first when range32 (lerobot's flat _min_max_norm: the state, and
    actions under the dataset's statistics) or exact (its grouped path: actions under the checkpoint's)."""
    if x.dtype == np.float64:
        mn, mx = mn.astype(np.float32), mx.astype(np.float32)
        d = (mx - mn) if range32 else (mx.astype(np.float64) - mn.astype(np.float64))
        d = d.astype(np.float64)
        y = (2.0 * (x - mn.astype(np.float64))) / np.where(d != 0, d, 1.0) - 1.0
        y = np.where(d != 0, y, 0.0)
        return (np.clip(y, -1.0, 1.0) if clip else y).astype(np.float32)
    x, mn, mx = x.astype(np.float32), mn.astype(np.float32), mx.astype(np.float32)
    d = mx - mn
    y = (np.float32(2.0) * (x - mn)) / np.where(d != 0, d, np.float32(1.0)) - np.float32(1.0)
    y = np.where(d != 0, y, np.float32(0.0)).astype(np.float32)
    return np.clip(y, np.float32(-1.0), np.float32(1.0)) if clip else y


def gr00t_n16_normalize(x: np.ndarray, mn: np.ndarray, mx: np.ndarray, clip: bool, wide) -> np.ndarray:
    """Isaac-GR00T N1.6's min-max (processor "gr00t_n16", section 3), numpy's arithmetic: the statistics
    float64; q = (x - min) / (max - min) in float64; where `wide` (relative values, float64 upstream) y =
    2 q - 1 in float64, elsewhere (the float32 data) q is stored as float32 and y = 2 q - 1 in float32;
    0 where isclose(max, min); clipped to [-1, 1] when clip; the result float32 (the batch's cast)."""
    mn, mx = np.asarray(mn, np.float64), np.asarray(mx, np.float64)
    keep = ~np.isclose(mx, mn)
    q = (np.asarray(x, np.float64) - mn) / np.where(keep, mx - mn, 1.0)
    q32 = q.astype(np.float32)
    y = np.where(wide, 2.0 * q - 1.0, (np.float32(2.0) * q32 - np.float32(1.0)).astype(np.float64))
    y = np.where(keep, y, 0.0)
    return (np.clip(y, -1.0, 1.0) if clip else y).astype(np.float32)


# The crop window's generator seed (image_random_crop): the sample's flow-matching seed XOR this ("CROP_POS").
CROP_SALT = 0x43524F505F504F53
# The state-dropout draw's generator seed: the sample's flow-matching seed XOR this ("STATE_DP").
STATE_DROPOUT_SALT = 0x53544154455F4450


# ---------------------------------------------------------------------------- samples and batches


def _get_or(cfg: Dict, dotted: str, default):
    try:
        return _get(cfg, dotted)
    except KeyError:
        return default


def _get(cfg: Dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"config key '{dotted}' missing: pass the effective config from "
                           "`loongforge-train --print-config`")
        node = node[part]
    return node


def _as_bool(v) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _mcfg(model_cfg, key: str):
    return model_cfg[key] if isinstance(model_cfg, dict) else getattr(model_cfg, key)


def _mcfg_or(model_cfg, key: str, default):
    return model_cfg.get(key, default) if isinstance(model_cfg, dict) else getattr(model_cfg, key, default)


class SampleBuilder:
    """Samples (training-semantics s3) and micro-batches (s2 + s4) of one dataset for one model."""

    def __init__(self, dataset: LFDataset, model_cfg, data_cfg: Dict, cache_bytes: int = 2 << 30,
                 processor: Optional[Dict] = None):
        self.ds = dataset
        self.seed = int(_get(data_cfg, "run.seed"))
        self.B = int(_get(data_cfg, "trainer.micro_batch_size"))
        self.K = int(_get(data_cfg, "trainer.gradient_accumulation_steps"))
        self.H = int(_get(data_cfg, "data.action_horizon"))
        self.L = int(_get(data_cfg, "data.max_text_len"))
        self.embodiment_id = int(_get(data_cfg, "data.embodiment_id"))
        self.shuffle = _as_bool(_get(data_cfg, "data.shuffle"))
        self.sampler_kind = str(_get_or(data_cfg, "data.sampler", "uniform"))
        self.open_episodes = int(_get_or(data_cfg, "data.open_episodes", 4))
        self.shuffle_buffer = int(_get_or(data_cfg, "data.shuffle_buffer", 256))
        if self.sampler_kind == "episode" and not self.shuffle:
            raise ValueError("data.sampler=episode orders a shuffled epoch, but data.shuffle is false")
        self.S = int(_mcfg(model_cfg, "image_size"))
        # exports made before the field have no crop (as loongforge-train reads them)
        self.crop = float(_mcfg_or(model_cfg, "image_crop_fraction", 1.0))
        self.resample = str(_mcfg_or(model_cfg, "image_resample", "box"))  # exports before the field: box
        self.resize_edge = int(_mcfg_or(model_cfg, "image_resize_edge", 0))
        self.target_size = int(_mcfg_or(model_cfg, "image_target_size", 0))
        self.letterbox = bool(_mcfg_or(model_cfg, "image_letterbox", False))
        self.random_crop = bool(_mcfg_or(model_cfg, "image_random_crop", False))
        if self.resample not in ("box", "bicubic_aa", "bilinear_aa", "cv2_area"):
            raise ValueError(f"the model's image_resample={self.resample!r} must be box, bicubic_aa, bilinear_aa "
                             "or cv2_area; re-export it")
        if self.random_crop and (self.resample not in ("cv2_area", "bilinear_aa") or not self.crop < 1.0):
            raise ValueError(f"the model's image_random_crop=true needs image_resample cv2_area or bilinear_aa and an "
                             f"image_crop_fraction below 1 (they are {self.resample} and {self.crop}); re-export it")
        if self.resample in ("bilinear_aa", "cv2_area") and self.resize_edge != 0:
            raise ValueError(f"the model's image_resize_edge={self.resize_edge} must be 0 when image_resample is "
                             f"{self.resample} (it resizes to image_target_size); re-export it")
        if not 0.0 < self.crop <= 1.0:
            raise ValueError(f"the model's image_crop_fraction={self.crop} must be in (0, 1]; re-export it")
        if self.target_size < 0 or (self.resample == "box" and self.target_size not in (0, self.S)):
            raise ValueError(f"the model's image_target_size={self.target_size} must be 0 or image_size "
                             f"({self.S}) when image_resample is box; re-export it")
        if self.letterbox and self.resample == "box":
            raise ValueError("the model's image_letterbox=true needs image_resample bicubic_aa, bilinear_aa or "
                             "cv2_area; re-export it")
        self.max_state = int(_mcfg(model_cfg, "max_state_dim"))
        self.max_action = int(_mcfg(model_cfg, "max_action_dim"))
        # flow-matching time form (section 4; exports before these fields: n16's, 0.999, 1.5)
        self.noise_s = float(_mcfg_or(model_cfg, "noise_s", 0.999))
        self.beta_alpha = float(_mcfg_or(model_cfg, "beta_alpha", 1.5))
        fm_time = _mcfg_or(model_cfg, "fm_time", "n16")
        if fm_time not in ("n16", "upstream"):
            raise ValueError(f"the model's fm_time={fm_time!r} must be n16 or upstream; re-export it")
        self.fm_upstream = fm_time == "upstream"
        if self.H > int(_mcfg(model_cfg, "max_action_horizon")):
            raise ValueError(f"data.action_horizon={self.H} exceeds the model's max_action_horizon="
                             f"{_mcfg(model_cfg, 'max_action_horizon')}; lower it or re-export the model")
        if not 0 <= self.embodiment_id < int(_mcfg(model_cfg, "num_embodiments")):
            raise ValueError(f"data.embodiment_id={self.embodiment_id} outside the model's "
                             f"num_embodiments={_mcfg(model_cfg, 'num_embodiments')}")
        if _mcfg(model_cfg, "use_imu") or _mcfg(model_cfg, "use_audio"):
            raise ValueError("the model was exported with use_imu/use_audio, but the dataset pipeline of "
                             "docs/training-semantics.md has no imu/audio inputs; export without them")
        self.state_col, self.state_w = self._numeric_column("state", "observation.state", self.max_state)
        self.action_col, self.action_w = self._numeric_column("action", "action", self.max_action)
        mode = str(_get(data_cfg, "data.normalization"))
        if mode not in ("min_max", "mean_std"):
            raise ValueError(f"data.normalization={mode!r}: use min_max or mean_std")
        keys = ("mean", "std") if mode == "mean_std" else ("min", "max")
        self.normalize = mean_std_normalize if mode == "mean_std" else min_max_normalize
        self.state_min, self.state_max = self._stats(self.state_col, keys)
        self.action_min, self.action_max = self._stats(self.action_col, keys)
        self._use_processor(processor or {}, mode, model_cfg)
        self.aspect = str(_get_or(data_cfg, "data.image_aspect", "squash"))
        self._check_aspect()
        # the sample space (section 1): every row, or with an N1.6 record counting V action rows the rows
        # whose whole chunk lies inside the episode (Isaac-GR00T's ShardedSingleStepDataset samples only those)
        v = self.valid_horizon if self.form == "gr00t_n16" else 0
        self.sample_rows = [max(0, e.length - v + 1) if v > 0 else e.length for e in dataset.episodes]
        self.sample_starts = [0]
        for r in self.sample_rows[:-1]:
            self.sample_starts.append(self.sample_starts[-1] + r)
        self.num_samples = sum(self.sample_rows)
        self.task_col = self._task_column()
        self.cameras = [c for c in dataset.cameras if c.get("modality_name", "")]
        nv = int(_mcfg(model_cfg, "num_views"))
        if len(self.cameras) != nv:
            raise ValueError(f"the model has num_views={nv} but modality.json uses {len(self.cameras)} cameras "
                             f"({[c['key'] for c in self.cameras]}); re-export with --set num_views="
                             f"{len(self.cameras)}")
        self.cache = VideoCache(cache_bytes)
        self._samplers: Dict[Tuple[int, int], Sampler] = {}

    # -- setup helpers
    def _use_processor(self, rec: Dict, mode: str, model_cfg) -> None:
        """The model's processor record (batch_spec.json "processor", section 3): upstream N1.7's or
        N1.6's state/action preparation with the checkpoint's statistics, embodiment slot and (N1.7)
        state dropout. Absent: the dataset form above."""
        self.form = rec.get("form", "dataset")
        self.n17 = self.form != "dataset"   # an upstream form (N1.7's or N1.6's)
        self.state_dropout, self.valid_horizon, self.state_index = 0.0, 0, None
        if not self.n17:
            return
        where = "the model's batch_spec.json processor"
        if self.form not in ("gr00t_n17", "gr00t_n16"):
            raise ValueError(f"{where}: form {self.form!r} is not dataset, gr00t_n17 or gr00t_n16; re-export the model")
        version = "N1.6" if self.form == "gr00t_n16" else "N1.7"
        if mode != "min_max":
            raise ValueError(f"data.normalization={mode}: {where} normalizes state and actions min-max as upstream "
                             f"GR00T {version} does; remove data.normalization")
        self.clip = bool(rec["clip"])
        self.state_dropout = float(rec.get("state_dropout", 0.0))
        self.valid_horizon = int(rec.get("valid_horizon", 0))
        self.embodiment_id = int(rec.get("embodiment_id", self.embodiment_id))
        if not 0 <= self.embodiment_id < int(_mcfg(model_cfg, "num_embodiments")):
            raise ValueError(f"{where}: embodiment_id {self.embodiment_id} outside the model's num_embodiments")
        # N1.7 rounds its statistics to float32; N1.6 keeps them float64
        f32 = (lambda v: np.asarray(v, dtype=np.float64)) if self.form == "gr00t_n16" else \
            (lambda v: np.asarray(v, dtype=np.float64).astype(np.float32))  # noqa: E731
        self.checkpoint_stats = rec.get("stats") == "checkpoint"
        if not self.checkpoint_stats:      # the dataset's min / max (N1.7: rounded to float32)
            self.state_min, self.state_max = f32(self.state_min), f32(self.state_max)
            self.action_min, self.action_max = f32(self.action_min)[None], f32(self.action_max)[None]   # (1, A)
            return
        st, ac = rec["state"], rec["action"]
        self.state_min, self.state_max = f32(st["min"]), f32(st["max"])                                 # (D,)
        self.action_min, self.action_max = f32(ac["min"]), f32(ac["max"])                               # (R, A)
        if self.state_min.shape != (self.state_w,):
            raise ValueError(f"{where}: the checkpoint's state statistics ({dict(zip(st['keys'], st['dims']))}) "
                             f"have {self.state_min.size} values but the dataset's state column "
                             f"{self.state_col!r} has {self.state_w}; convert a dataset whose state is laid out "
                             "as the checkpoint's modality keys, or import with another --embodiment-tag")
        if self.action_min.shape[1] != self.action_w:
            raise ValueError(f"{where}: the checkpoint's action statistics ({dict(zip(ac['keys'], ac['dims']))}) "
                             f"have {self.action_min.shape[1]} values but the dataset's action column "
                             f"{self.action_col!r} has {self.action_w}; convert a dataset whose actions are laid "
                             "out as the checkpoint's modality keys, or import with another --embodiment-tag")
        # (N1.6's record has as many relative rows as counted chunk rows, the most a sample uses)
        if self.form == "gr00t_n17" and self.action_min.shape[0] > 1 and self.H > self.action_min.shape[0]:
            raise ValueError(f"data.action_horizon={self.H} exceeds the {self.action_min.shape[0]} chunk rows of the "
                             "checkpoint's relative-action statistics (upstream refuses it too); lower it")
        index = np.asarray(ac["state_index"], dtype=np.int64)
        self.state_index = index if (index >= 0).any() else None

    def _check_aspect(self) -> None:
        """data.image_aspect: squash, crop or pad, the last two for the box resize of a model without an
        upstream processor record only (an import keeps upstream's transform; loongforge-train refuses the same)."""
        if self.aspect not in ("squash", "crop", "pad"):
            raise ValueError(f"data.image_aspect={self.aspect!r}: use squash, crop or pad")
        if self.aspect != "squash" and self.n17:
            raise ValueError(f"data.image_aspect={self.aspect}: the model was imported from an upstream GR00T "
                             f"checkpoint (batch_spec.json processor {self.form}) and keeps upstream's image "
                             f"preprocessing (image_resample {self.resample}); remove data.image_aspect")
        if self.aspect != "squash" and self.resample != "box":
            raise ValueError(f"data.image_aspect={self.aspect} applies to the box resize of n16 exports, but the "
                             f"model resizes by image_resample {self.resample}; remove data.image_aspect")

    def _numeric_column(self, group: str, default: str, max_dim: int) -> Tuple[str, int]:
        groups = self.ds.meta.get("modality", {}).get(group, {})
        keys = {g.get("original_key", default) for g in groups.values()} or {default}
        if len(keys) != 1:
            raise DataError(f"{self.ds.root}: modality.json {group} groups name several columns {sorted(keys)}; "
                            "docs/training-semantics.md takes one column")
        name = keys.pop()
        width = self.ds.columns_json[self.ds.column_id(name)]["width"]
        if width > max_dim:
            raise ValueError(f"{group} column {name!r} has width {width} > the model's max_{group}_dim={max_dim}")
        return name, width

    def _stats(self, name: str, keys=("min", "max")) -> Tuple[np.ndarray, np.ndarray]:
        st = self.ds.stats.get(name, {})
        a_key, b_key = keys
        if a_key not in st or b_key not in st:
            raise DataError(f"{self.ds.root}: stats for {name!r} have no {a_key}/{b_key}; re-convert the dataset")
        mn, mx = np.asarray(st[a_key], dtype=np.float64), np.asarray(st[b_key], dtype=np.float64)   # (width,)
        width = self.ds.columns_json[self.ds.column_id(name)]["width"]
        if mn.shape != (width,) or mx.shape != (width,):
            raise DataError(f"{self.ds.root}: stats {a_key}/{b_key} of {name!r} have {mn.size}/{mx.size} values, "
                            f"the column {width}; re-convert the dataset")
        return mn, mx

    def _task_column(self) -> str:
        for c in self.ds.columns_json:                  # the first in column order
            if c["name"].endswith("task_description"):
                return c["name"]
        return "task_index"

    def sampler(self, rank: int, world: int) -> Sampler:
        key = (rank, world)
        if key not in self._samplers:
            episodes = None
            if self.sampler_kind == "episode":
                episodes = (self.sample_rows, self.open_episodes, self.shuffle_buffer)
            self._samplers[key] = Sampler(self.num_samples, self.seed, self.shuffle, rank, world, self.B, self.K,
                                          episodes)
        return self._samplers[key]

    def locate(self, i: int) -> Tuple[int, int]:
        """Sample index -> (episode position, row) in this builder's sample space (section 1)."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} outside [0, {self.num_samples})")
        e = bisect.bisect_right(self.sample_starts, i) - 1
        return e, i - self.sample_starts[e]

    # -- one sample
    def sample(self, i: int) -> Dict[str, Tensor]:
        e, t = self.locate(i)
        ep = self.ds.episodes[e]
        L = ep.length
        state = np.zeros(self.max_state, np.float32)                                      # (D_s,)
        actions = np.zeros((self.H, self.max_action), np.float32)                         # (H, A)
        mask = np.zeros((self.H, self.max_action), np.float32)                            # (H, A)
        n = min(self.H, L - t)
        raw_state = self.ds.array(e, self.state_col)[t]                                   # (w_s,)
        raw_actions = self.ds.array(e, self.action_col)[t:t + n]                          # (n, w_a)
        if self.form == "gr00t_n16":   # Isaac-GR00T N1.6's processor (section 3)
            n = min(n, self.valid_horizon) if self.valid_horizon > 0 else n
            raw_actions = np.array(raw_actions[:n])   # float32, or float64 data's float64
            rows = min(n, self.action_min.shape[0])
            a_min = np.broadcast_to(self.action_min[:rows], (n, self.action_w))
            a_max = np.broadcast_to(self.action_max[:rows], (n, self.action_w))
            f64 = raw_state.dtype == np.float64   # --keep-float64 data: upstream's arrays are float64 throughout
            wide = np.full(self.action_w, f64)
            values = raw_actions.astype(np.float64)
            if self.state_index is not None:   # relative groups: the action minus the raw state value, float64
                rel = self.state_index >= 0
                wide |= rel
                values[:, rel] -= raw_state.astype(np.float64)[self.state_index[rel]]
            state[:self.state_w] = gr00t_n16_normalize(raw_state, self.state_min, self.state_max, self.clip, f64)
            actions[:n, :self.action_w] = gr00t_n16_normalize(values, a_min, a_max, self.clip, wide)
        elif self.n17:   # upstream N1.7's processor (section 3)
            n = min(n, self.valid_horizon) if self.valid_horizon > 0 else n
            raw_actions = np.array(raw_actions[:n], dtype=raw_state.dtype)   # float32, or float64 data's float64
            if self.state_index is not None:   # relative groups: the action minus the raw state value
                rel = self.state_index >= 0
                raw_actions[:, rel] -= raw_state[self.state_index[rel]]
            rows = min(n, self.action_min.shape[0])   # 1 (every step's bounds) or n (step k's: row k)
            a_min = np.broadcast_to(self.action_min[:rows], (n, self.action_w))
            a_max = np.broadcast_to(self.action_max[:rows], (n, self.action_w))
            state[:self.state_w] = gr00t_n17_normalize(raw_state, self.state_min, self.state_max, self.clip)
            actions[:n, :self.action_w] = gr00t_n17_normalize(raw_actions, a_min, a_max, self.clip,
                                                              range32=not self.checkpoint_stats)
        else:
            state[:self.state_w] = self.normalize(raw_state, self.state_min, self.state_max)
            actions[:n, :self.action_w] = self.normalize(raw_actions, self.action_min, self.action_max)
        mask[:n, :self.action_w] = 1.0
        tokens, text_mask = self.text(e, t)
        return {
            "images": self.images(e, t),                                                  # (V, 3, S, S)
            "text_tokens": torch.from_numpy(tokens),                                      # (L,)
            "text_mask": torch.from_numpy(text_mask),                                     # (L,)
            "state": torch.from_numpy(state),
            "actions": torch.from_numpy(actions),
            "action_mask": torch.from_numpy(mask),
            "embodiment_id": torch.tensor(self.embodiment_id, dtype=torch.int64),
        }

    def text(self, e: int, t: int) -> Tuple[np.ndarray, np.ndarray]:
        idx = int(self.ds.array(e, self.task_col)[t, 0])
        if idx not in self.ds.tasks:
            raise DataError(f"{self.ds.root}: episode {self.ds.episodes[e].episode_index} row {t}: "
                            f"{self.task_col}={idx} is not in tasks[]; re-convert the dataset")
        ids = self.ds.tasks[idx]["token_ids"][:self.L]
        tokens = np.zeros(self.L, np.int64)
        tokens[:len(ids)] = ids
        return tokens, np.arange(self.L) < len(ids)

    def rgb_frame(self, e: int, camera: Dict, t: int) -> np.ndarray:
        """(h, w, 3) uint8 frame video_frame:<key>[t] of episode position e."""
        path, info = self.ds.video_file(e, camera["camera_id"])
        frame = int(self.ds.array(e, "video_frame:" + camera["key"])[t, 0])
        video = self.cache.get(path, int(info["frame_count"]))
        if not 0 <= frame < video.frames.shape[0]:
            raise DataError(f"{path}: row {t} wants frame {frame} of {video.frames.shape[0]}")
        return video.rgb(frame)

    def images(self, e: int, t: int, crop_positions: Optional[List[Tuple[float, float]]] = None) -> Tensor:
        """The sample's (V, 3, S, S) model images; crop_positions: its windows under image_random_crop
        (crop_positions(p): one for the views, or one per view)."""
        frames = [self.rgb_frame(e, c, t) for c in self.cameras]
        if self.resample == "bicubic_aa":
            return bicubic_aa_to_model(frames, self.S, self.crop, self.resize_edge, self.target_size,
                                       self.letterbox)                                         # (V, 3, S, S)
        if self.resample == "cv2_area":
            return cv2_area_to_model(frames, self.S, self.crop, self.target_size, self.letterbox,
                                     crop_positions[0] if crop_positions else None)            # (V, 3, S, S)
        if self.resample == "bilinear_aa":
            return bilinear_aa_to_model(frames, self.S, self.crop, self.target_size, self.letterbox,
                                        crop_positions)                                        # (V, 3, S, S)
        return image_to_model(frames, self.S, self.crop, self.aspect)  # (V, 3, S, S)

    # -- batches
    def sample_draws(self, p: int) -> Tuple[Tensor, Tensor]:
        """Section 4: the draws of the sample at stream position p -> fm_t (1,), fm_noise (H, A)."""
        g = torch.Generator(device="cpu")
        g.manual_seed((self.seed * 1000003 + p) % (1 << 63))
        u = torch.rand(1, generator=g)                                                   # (1,)
        beta = torch.pow(u, 1.0 / self.beta_alpha)                                       # a Beta(alpha, 1) draw
        fm_t = (1.0 - beta) * self.noise_s if self.fm_upstream else (self.noise_s - beta) / self.noise_s
        noise = torch.randn(self.H, self.max_action, generator=g)                        # (H, A)
        return fm_t, noise

    def fm_draws(self, step: int, i: int, rank: int, world: int) -> Dict[str, Tensor]:
        """fm_t (B,) and fm_noise (B, H, A) of micro-batch i of step `step` on a rank, one generator per sample."""
        sampler = self.sampler(rank, world)
        draws = [self.sample_draws(sampler.stream_position(step, i, b)) for b in range(self.B)]
        return {"fm_t": torch.cat([t for t, _ in draws]), "fm_noise": torch.stack([n for _, n in draws])}

    def micro_batch_indices(self, step: int, i: int, rank: int, world: int) -> List[int]:
        return self.sampler(rank, world).micro_batch(step, i)

    def crop_position(self, p: int) -> Tuple[float, float]:
        """Section 4: the crop window (pos_y, pos_x) of the sample at stream position p under
        image_random_crop with cv2_area (its own generator; the sample's views share it, as lerobot's do)."""
        return self.crop_positions(p, 1)[0]

    def crop_positions(self, p: int, count: Optional[int] = None) -> List[Tuple[float, float]]:
        """Section 4: the crop windows of the sample at stream position p under image_random_crop: 2 *
        count float32 uniforms of its own generator, (pos_y, pos_x) per window; count (default) one per
        view with bilinear_aa (torchvision's RandomCrop draws per frame), else one shared by the views."""
        if count is None:
            count = len(self.cameras) if self.resample == "bilinear_aa" else 1
        g = torch.Generator(device="cpu")
        g.manual_seed(((self.seed * 1000003 + p) % (1 << 63)) ^ CROP_SALT)
        u = torch.rand(2 * count, generator=g)
        return [(float(u[2 * i]), float(u[2 * i + 1])) for i in range(count)]

    def state_dropped(self, p: int) -> bool:
        """Section 4: the processor's state dropout of the sample at stream position p (its own generator)."""
        if self.state_dropout <= 0:
            return False
        g = torch.Generator(device="cpu")
        g.manual_seed(((self.seed * 1000003 + p) % (1 << 63)) ^ STATE_DROPOUT_SALT)
        return float(torch.rand(1, generator=g)) < self.state_dropout

    def add_draws(self, batch: Dict[str, Tensor], step: int, i: int, rank: int, world: int) -> Dict[str, Tensor]:
        """Completes a collated micro-batch: fm_t / fm_noise, the processor's state dropout (a dropped
        sample's state row is zeroed) and, under image_random_crop, each sample's images cropped at
        its window. Returns batch."""
        batch.update(self.fm_draws(step, i, rank, world))
        if self.random_crop:  # the images again, each sample with its window (sample() took the center)
            sampler = self.sampler(rank, world)
            for b, j in enumerate(self.micro_batch_indices(step, i, rank, world)):
                e, t = self.locate(j)
                batch["images"][b] = self.images(e, t, self.crop_positions(sampler.stream_position(step, i, b)))
        if self.state_dropout > 0:
            sampler = self.sampler(rank, world)
            for b in range(batch["state"].shape[0]):
                if self.state_dropped(sampler.stream_position(step, i, b)):
                    batch["state"][b].zero_()
        return batch

    def micro_batch(self, step: int, i: int, rank: int = 0, world: int = 1) -> Dict[str, Tensor]:
        """The full batch of micro-batch i of optimizer step `step` on a rank, incl. fm_t / fm_noise."""
        batch = collate_samples([self.sample(j) for j in self.micro_batch_indices(step, i, rank, world)])
        return self.add_draws(batch, step, i, rank, world)


class MixtureBuilder(SampleBuilder):
    """Samples of several datasets, each with its own SampleBuilder (its embodiment slot, statistics and
    widths), numbered part by part (section 1); the order, the draws and the micro-batches are
    SampleBuilder's over the summed sample space. A model with an upstream processor record takes one
    dataset (as loongforge-train refuses a mixture for it)."""

    _SHARED = ("seed", "B", "K", "H", "L", "shuffle", "sampler_kind", "open_episodes", "shuffle_buffer", "S",
               "crop", "resample", "random_crop", "max_state", "max_action", "noise_s", "beta_alpha",
               "fm_upstream", "state_dropout", "cameras")

    def __init__(self, parts: List[SampleBuilder]):   # noqa: super().__init__ reads one dataset
        if any(p.n17 for p in parts):
            raise ValueError("a mixture of datasets needs a model without an upstream processor record (an "
                             "imported GR00T checkpoint was imported for one embodiment); train it on one dataset")
        for name in self._SHARED:
            setattr(self, name, getattr(parts[0], name))
        self.parts = parts
        self.part_starts = [0]
        for p in parts[:-1]:
            self.part_starts.append(self.part_starts[-1] + p.num_samples)
        self.num_samples = sum(p.num_samples for p in parts)
        self.sample_rows = [r for p in parts for r in p.sample_rows]
        self._samplers = {}

    @property
    def cache(self):
        """The parts' video caches seen as one: their decodes summed (what a run's summary reports)."""
        return types.SimpleNamespace(decodes=sum(p.cache.decodes for p in self.parts))

    def sample(self, i: int) -> Dict[str, Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} outside [0, {self.num_samples})")
        k = bisect.bisect_right(self.part_starts, i) - 1
        return self.parts[k].sample(i - self.part_starts[k])


def open_builder(path: str, model_cfg, data_cfg: Dict, processor: Optional[Dict] = None):
    """data.path's SampleBuilder: one dataset folder (its embodiment data.embodiment_id), or a mixture file
    (a path ending in .json: {"datasets": [{"path": ..., "embodiment_id": ...}, ...]}, relative paths from its
    folder) as a MixtureBuilder."""
    if not str(path).endswith(".json"):
        return SampleBuilder(LFDataset(path), model_cfg, data_cfg, processor=processor)
    spec = json.loads(Path(path).read_text())
    entries = spec.get("datasets") if isinstance(spec, dict) else None
    if not entries or set(spec) != {"datasets"}:
        raise DataError(f"data.path {path}: a mixture file is {{\"datasets\": [...]}} with at least one dataset")
    parts = []
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"path", "embodiment_id"}:
            raise DataError(f"data.path {path}: datasets[{k}] needs exactly path and embodiment_id")
        cfg = json.loads(json.dumps(data_cfg))   # a copy with this part's slot
        cfg.setdefault("data", {})["embodiment_id"] = int(e["embodiment_id"])
        root = Path(e["path"]) if Path(e["path"]).is_absolute() else Path(path).parent / e["path"]
        parts.append(SampleBuilder(LFDataset(str(root)), model_cfg, cfg, processor=processor))
    return MixtureBuilder(parts)


def collate_samples(samples: List[Dict[str, Tensor]]) -> Dict[str, Tensor]:
    """Stack per-sample tensors along a new batch dim: images (B, V, 3, S, S), actions (B, H, A), ..."""
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


# ---------------------------------------------------------------------------- DataLoader pieces (baseline mode)


class SampleDataset(torch.utils.data.Dataset):
    """Map-style dataset over the sample space: item i is SampleBuilder.sample(i) (no fm draws)."""

    def __init__(self, builder: SampleBuilder):
        self.builder = builder

    def __len__(self) -> int:
        return self.builder.num_samples

    def __getitem__(self, i: int) -> Dict[str, Tensor]:
        return self.builder.sample(i)


class MicroBatchSampler(torch.utils.data.Sampler):
    """Yields the sample indices of micro-batches 0..K-1 of optimizer steps start .. start+count-1
    of one rank, in order (pass as `batch_sampler=`)."""

    def __init__(self, builder: SampleBuilder, rank: int, world: int, start: int, count: int):
        self.builder, self.rank, self.world, self.start, self.count = builder, rank, world, start, count

    def __len__(self) -> int:
        return self.count * self.builder.K

    def __iter__(self):
        for s in range(self.start, self.start + self.count):
            for i in range(self.builder.K):
                yield self.builder.micro_batch_indices(s, i, self.rank, self.world)
