"""The data processing an upstream GR00T N1.7 checkpoint's weights expect, as a record for
our export (batch_spec.json "processor"; docs/training-semantics.md s3).

    n17_processor_record(folder, processor_kwargs, tag) -> dict

Upstream (lerobot 0.6.1, processor_groot.py: _load_n1_7_checkpoint_processor_assets,
make_groot_pre_post_processors, GrootN17PackInputsStep) prepares state and actions with
settings kept next to the weights, for one embodiment tag (GrootConfig.embodiment_tag,
"new_embodiment" by default):
- statistics.json[tag]: per modality key (e.g. "left_arm") of the state and action
  groups named by processor_config.json's processor_kwargs.modality_configs[tag], their
  min / max (or, with processor_kwargs.use_percentiles, q01 / q99), flattened in
  modality_keys order; action groups whose action_configs entry has rep "relative" are
  the action minus the raw state group (state_key, else the same key), normalized
  with relative_action[key]'s min / max per chunk row (2-D: one row per horizon step).
  When the tag has no statistics, upstream normalizes with the dataset's min / max.
- the normalization itself: min-max to [-1, 1] in float32 (the stats rounded to
  float32 first), 0 where max == min, clipped to [-1, 1] when clip_outliers (default true);
- processor_kwargs.state_dropout_prob: in training, each sample's (normalized, padded)
  state is zeroed with this probability (default 0);
- the embodiment slot: embodiment_id.json[tag], else lerobot's table of the released
  tags (N17_EMBODIMENT_SLOTS), else 0;
- the action rows that count: len(modality_configs[tag].action.delta_indices) when it
  names some (valid_horizon; 0 = every row).

The record (every list float32-exact, as upstream rounds the stats):
  {"form": "gr00t_n17", "clip": bool, "state_dropout": p, "embodiment_tag": tag,
   "embodiment_id": slot, "embodiment_source": str, "valid_horizon": int,
   "stats": "checkpoint" | "dataset", "stats_source": str,
   "state":  {"keys": [...], "dims": [...], "min": [D], "max": [D]},            (checkpoint stats only)
   "action": {"keys": [...], "dims": [...], "relative": [bool per key],
              "rows": R, "min": [R x A], "max": [R x A], "state_index": [A]}}   (checkpoint stats only)
state_index[j] is the state value subtracted from action value j (-1: none); a row
r of min / max holds chunk step r's bounds (R == 1: every step's). Anything upstream
would refuse, or would silently pad (stats whose widths differ from the data's: the
trainers check that), is refused here or by the trainers with a message naming it.

N1.6 (Isaac-GR00T's Gr00tN1d6Processor and StateActionProcessor, read from its source,
gr00t/model/gr00t_n1d6/processing_gr00t_n1d6.py and gr00t/data/state_action/, which ship
in no package): n16_processor_record(folder, processor_kwargs, tag) -> the same record
with "form": "gr00t_n16", where
- relative action groups are relative only with processor_kwargs.use_relative_action
  (default false), and their statistics rows must equal the counted chunk rows
  (upstream indexes the chunk with the statistics' shape);
- the statistics stay float64 (numpy arrays of the JSON lists, not rounded), and the
  normalization is numpy's on the float32 data: q = (x - min) / (max - min) in float64
  stored into a float32 array, then 2 * q - 1 in float32; a relative value is the
  action minus the state in float64 and stays float64 until the batch is cast to
  float32; 0 where numpy's isclose(max, min) (|max - min| <= 1e-8 + 1e-5 |min|);
  clipped to [-1, 1] when clip_outliers (default true);
- the slot is embodiment_id.json[tag] over Isaac-GR00T's table of N1.6 tags
  (N16_EMBODIMENT_SLOTS; upstream fails on a tag in neither);
- there is no processor state dropout (N1.6's head has its own);
- the counted rows V also bound the sample space: Isaac-GR00T's ShardedSingleStepDataset
  (gr00t/data/dataset/sharded_single_step_dataset.py, allow_padding false) samples only
  the rows whose whole chunk lies inside the episode (docs/training-semantics.md s1);
- sin/cos or mean/std state and action encodings (apply_sincos_state_encoding with
  sin_cos_embedding_keys, mean_std_embedding_keys) and action delta_indices other than
  0, 1, ..., n-1 are refused by name.
"""
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

FORM = "gr00t_n17"

# lerobot 0.6.1's N1_7_EMBODIMENT_MAPPING: the slot of each embodiment tag of the released N1.7
# checkpoints, which upstream uses when a checkpoint has no embodiment_id.json.
N17_EMBODIMENT_SLOTS = {
    "oxe_droid_relative_eef_relative_joint": 24,
    "xdof_relative_eef_relative_joint": 27,
    "xdof_relative_eef_relative_joint_subtask": 27,
    "real_g1_relative_eef_relative_joints": 25,
    "real_r1_pro_sharpa_relative_eef": 26,
    "real_r1_pro_sharpa_relative_eef_human": 26,
    "real_r1_pro_sharpa_relative_eef_maxinsights": 26,
    "real_r1_pro_sharpa_relative_eef_mecka": 26,
    "unitree_g1_full_body_with_waist_height_nav_cmd": 25,
    "simpler_env_google": 0,
    "simpler_env_widowx": 1,
    "libero_sim": 2,
    "new_embodiment": 10,
}
DEFAULT_TAG = "new_embodiment"  # lerobot's GrootConfig.embodiment_tag

FORM_N16 = "gr00t_n16"
# Isaac-GR00T's EMBODIMENT_TAG_TO_PROJECTOR_INDEX (processing_gr00t_n1d6.py): the slot of each tag of the
# released N1.6 checkpoints; embodiment_id.json entries come first, these fill the tags it lacks.
N16_EMBODIMENT_SLOTS = {
    "robocasa_panda_omron": 13,
    "gr1": 20,
    "behavior_r1_pro": 24,
    "unitree_g1": 8,
    "libero_panda": 2,
    "oxe_google": 0,
    "oxe_widowx": 1,
    "oxe_droid": 16,
    "new_embodiment": 10,
}


class ProcessorError(ValueError):
    """Checkpoint processor settings this importer cannot reproduce; the message names the file and key."""


def _read(folder: Path, name: str) -> Dict:
    p = Path(folder) / name
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ProcessorError(f"{p}: not JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _rep(value) -> str:
    """An action config's enum-like field as upstream compares it (lower case, an enum's value)."""
    return str(getattr(value, "value", value)).lower()


def _numbers(values, where: str, f32: bool) -> np.ndarray:
    try:
        a = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProcessorError(f"{where}: not a list of numbers") from None
    return a.astype(np.float32) if f32 else a


def _bounds(entry, use_percentiles: bool, where: str, f32: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    lo, hi = ("q01", "q99") if use_percentiles else ("min", "max")
    if not isinstance(entry, dict) or lo not in entry or hi not in entry:
        raise ProcessorError(f"{where}: no '{lo}' / '{hi}' statistics (upstream needs them to normalize)")
    mn, mx = _numbers(entry[lo], f"{where}.{lo}", f32), _numbers(entry[hi], f"{where}.{hi}", f32)
    if mn.shape != mx.shape or mn.ndim not in (1, 2) or mn.shape[-1] == 0:
        raise ProcessorError(f"{where}: '{lo}' {list(mn.shape)} and '{hi}' {list(mx.shape)} must be equal, "
                             "non-empty 1-D (or, for relative actions, 2-D) lists")
    return mn, mx


def _slot_mapping(folder: Path) -> Dict[str, int]:
    mapping = {}
    for k, v in _read(folder, "embodiment_id.json").items():
        try:
            mapping[str(k)] = int(v)
        except (TypeError, ValueError):
            continue
    return mapping


def embodiment_slot(folder: Path, tag: str) -> Tuple[int, str]:
    """(slot, where it came from) as upstream N1.7 picks it: embodiment_id.json, else the released table, else 0."""
    mapping = _slot_mapping(folder)
    if mapping:
        return (mapping[tag], "embodiment_id.json") if tag in mapping else \
            (0, f"embodiment_id.json has no '{tag}': upstream uses slot 0")
    if tag in N17_EMBODIMENT_SLOTS:
        return N17_EMBODIMENT_SLOTS[tag], "upstream's table of released N1.7 tags"
    return 0, f"'{tag}' is not a released N1.7 tag and there is no embodiment_id.json: upstream uses slot 0"


def n16_embodiment_slot(folder: Path, tag: str) -> Tuple[int, str]:
    """(slot, where it came from) as Isaac-GR00T's N1.6 processor picks it: embodiment_id.json, else its table."""
    mapping = _slot_mapping(folder)
    if tag in mapping:
        return mapping[tag], "embodiment_id.json"
    if tag in N16_EMBODIMENT_SLOTS:
        return N16_EMBODIMENT_SLOTS[tag], "Isaac-GR00T's table of N1.6 tags"
    known = sorted(set(mapping) | set(N16_EMBODIMENT_SLOTS))
    raise ProcessorError(f"{folder}: embodiment tag '{tag}' has no slot in embodiment_id.json nor in Isaac-GR00T's "
                         f"N1.6 table (upstream fails on it too); pass --embodiment-tag, one of {known}")


def _modality(kw: Dict, tag: str) -> Dict:
    configs = kw.get("modality_configs", {})
    modality = configs.get(tag, {}) if isinstance(configs, dict) else {}
    return modality if isinstance(modality, dict) else {}


def _layout(folder: Path, kw: Dict, tag: str, raw: Dict, relative_allowed: bool, f32: bool):
    """The checkpoint's statistics of `tag` laid out as our state / action columns:
    (state, action, relative flags) as the record holds them (see the module docstring)."""
    modality = _modality(kw, tag)
    use_percentiles = bool(kw.get("use_percentiles", False))
    where = f"{folder}/statistics.json['{tag}']"
    action_cfg = modality.get("action", {}) if isinstance(modality.get("action"), dict) else {}
    state_cfg = modality.get("state") if isinstance(modality.get("state"), dict) else {}
    state_keys = state_cfg.get("modality_keys", [])
    action_keys = action_cfg.get("modality_keys", [])
    action_configs = action_cfg.get("action_configs") or []
    if not state_keys or not action_keys:
        raise ProcessorError(f"{folder}/processor_config.json: modality_configs['{tag}'] names no state or no action "
                             "modality_keys, so upstream's statistics cannot be laid out")
    state_min, state_max, state_dims, state_start = [], [], [], {}
    for key in state_keys:
        mn, mx = _bounds((raw.get("state") or {}).get(key), use_percentiles, f"{where}.state.{key}", f32)
        if mn.ndim != 1:
            raise ProcessorError(f"{where}.state.{key}: state statistics must be 1-D lists")
        state_start[key] = (sum(state_dims), mn.shape[0])
        state_dims.append(mn.shape[0])
        state_min.append(mn), state_max.append(mx)
    groups: List[Tuple[np.ndarray, np.ndarray, List[int]]] = []
    relative_flags, action_dims = [], []
    for i, key in enumerate(action_keys):
        cfg = action_configs[i] if i < len(action_configs) and isinstance(action_configs[i], dict) else {}
        relative = relative_allowed and _rep(cfg.get("rep")) == "relative"
        if relative:
            if _rep(cfg.get("type")) != "non_eef":
                raise ProcessorError(f"{folder}/processor_config.json: action '{key}' is relative of type "
                                     f"{cfg.get('type')!r}; upstream trains only non_eef relative actions")
            # both upstreams normalize a relative group with its relative_action min / max, percentiles or not
            mn, mx = _bounds((raw.get("relative_action") or {}).get(key), False, f"{where}.relative_action.{key}", f32)
            state_key = cfg.get("state_key") or key
            if state_key not in state_start:
                raise ProcessorError(f"{folder}/processor_config.json: relative action '{key}' subtracts state group "
                                     f"'{state_key}', which is not among the state modality_keys {state_keys}")
            start, width = state_start[state_key]
            if width != mn.shape[-1]:
                raise ProcessorError(f"{where}: relative action '{key}' has {mn.shape[-1]} values but state group "
                                     f"'{state_key}' has {width}")
            index = list(range(start, start + width))
        else:
            mn, mx = _bounds((raw.get("action") or {}).get(key), use_percentiles, f"{where}.action.{key}", f32)
            if mn.ndim != 1:
                raise ProcessorError(f"{where}.action.{key}: absolute action statistics must be 1-D lists")
            index = [-1] * mn.shape[0]
        groups.append((mn.reshape(-1, mn.shape[-1]), mx.reshape(-1, mx.shape[-1]), index))
        relative_flags.append(relative)
        action_dims.append(mn.shape[-1])
    # Rows: one for absolute groups; a relative group's rows are its chunk steps. Upstream N1.7 refuses a
    # chunk longer than any relative group's rows, so the fewest rows are all that can be used.
    rows = min([g[0].shape[0] for g in groups if g[0].shape[0] > 1] or [1])
    a_min = np.concatenate([np.broadcast_to(g[0][:rows], (rows, g[0].shape[1])) for g in groups], axis=1)
    a_max = np.concatenate([np.broadcast_to(g[1][:rows], (rows, g[1].shape[1])) for g in groups], axis=1)
    source = (f"{folder.name}/statistics.json['{tag}'] ({'q01 / q99' if use_percentiles else 'min / max'}"
              + (", relative_action min / max" if any(relative_flags) else "") + ")")
    state = {"keys": list(state_keys), "dims": state_dims, "min": np.concatenate(state_min).tolist(),
             "max": np.concatenate(state_max).tolist()}
    action = {"keys": list(action_keys), "dims": action_dims, "relative": relative_flags, "rows": rows,
              "min": a_min.tolist(), "max": a_max.tolist(), "state_index": [j for g in groups for j in g[2]]}
    return state, action, source, [g[0].shape[0] for g in groups]


def _clip(kw: Dict) -> bool:
    clip = kw.get("clip_outliers", True)
    return clip if isinstance(clip, bool) else True


def _valid_horizon(kw: Dict, tag: str) -> int:
    action_cfg = _modality(kw, tag).get("action", {})
    delta = action_cfg.get("delta_indices", []) if isinstance(action_cfg, dict) else []
    return len(delta) if isinstance(delta, list) else 0


def _tag_statistics(folder: Path, kw: Dict, tag: str) -> Tuple[Dict, str]:
    """(statistics.json[tag], "") or ({}, why the dataset's min / max are used instead)."""
    all_stats = _read(folder, "statistics.json")
    raw = all_stats.get(tag) if isinstance(all_stats.get(tag), dict) else {}
    if not raw:
        return {}, f"the dataset's min / max: {folder.name}/statistics.json has no statistics for '{tag}'"
    if not _modality(kw, tag):
        return {}, f"the dataset's min / max: processor_config.json has no modality_configs['{tag}']"
    return raw, ""


def n17_processor_record(folder: Path, processor_kwargs: Optional[Dict], tag: str = DEFAULT_TAG) -> Dict:
    folder = Path(folder)
    kw = processor_kwargs or {}
    try:
        dropout = float(kw.get("state_dropout_prob")) if kw.get("state_dropout_prob") is not None else 0.0
    except (TypeError, ValueError):
        dropout = 0.0
    if not 0.0 <= dropout < 1.0:
        raise ProcessorError(f"{folder}/processor_config.json: processor_kwargs.state_dropout_prob={dropout} "
                             "must be in [0, 1)")
    slot, slot_source = embodiment_slot(folder, tag)
    record = {"form": FORM, "clip": _clip(kw), "state_dropout": dropout, "embodiment_tag": tag, "embodiment_id": slot,
              "embodiment_source": slot_source, "valid_horizon": _valid_horizon(kw, tag)}
    raw, why = _tag_statistics(folder, kw, tag)
    if not raw:
        record.update(stats="dataset", stats_source=why)
        return record
    state, action, source, _ = _layout(folder, kw, tag, raw, relative_allowed=True, f32=True)
    record.update(stats="checkpoint", stats_source=source, state=state, action=action)
    return record


def n16_processor_record(folder: Path, processor_kwargs: Optional[Dict], tag: str = DEFAULT_TAG) -> Dict:
    folder = Path(folder)
    kw = processor_kwargs or {}
    modality = _modality(kw, tag)
    where = f"{folder}/processor_config.json modality_configs['{tag}']"
    for group in ("state", "action"):
        cfg = modality.get(group) if isinstance(modality.get(group), dict) else {}
        if cfg.get("mean_std_embedding_keys"):
            raise ProcessorError(f"{where}.{group}.mean_std_embedding_keys={cfg['mean_std_embedding_keys']}: "
                                 "mean/std normalization of a group is not reproduced; import a checkpoint that "
                                 "normalizes every group min-max")
    state_cfg = modality.get("state") if isinstance(modality.get("state"), dict) else {}
    if kw.get("apply_sincos_state_encoding") and state_cfg.get("sin_cos_embedding_keys"):
        raise ProcessorError(f"{where}.state.sin_cos_embedding_keys={state_cfg['sin_cos_embedding_keys']} with "
                             "apply_sincos_state_encoding: the sin/cos state encoding is not reproduced")
    action_cfg = modality.get("action") if isinstance(modality.get("action"), dict) else {}
    delta = action_cfg.get("delta_indices")
    if isinstance(delta, list) and delta and delta != list(range(len(delta))):
        raise ProcessorError(f"{where}.action.delta_indices={delta}: an action chunk of other rows than 0, 1, ..., "
                             "n-1 after the sample's is not reproduced (the trainers read rows t .. t+H-1)")
    slot, slot_source = n16_embodiment_slot(folder, tag)
    horizon = _valid_horizon(kw, tag)
    record = {"form": FORM_N16, "clip": _clip(kw), "state_dropout": 0.0, "embodiment_tag": tag,
              "embodiment_id": slot, "embodiment_source": slot_source, "valid_horizon": horizon}
    raw, why = _tag_statistics(folder, kw, tag)
    if not raw:
        if kw.get("use_percentiles"):
            raise ProcessorError(f"{folder}: statistics.json has no statistics for '{tag}' and processor_kwargs."
                                 "use_percentiles is set: upstream's q01 / q99 of a new dataset are not reproduced; "
                                 "import with an --embodiment-tag the checkpoint has statistics for")
        record.update(stats="dataset", stats_source=why)
        return record
    state, action, source, group_rows = _layout(folder, kw, tag, raw,
                                                relative_allowed=bool(kw.get("use_relative_action", False)), f32=False)
    for key, n in zip(action["keys"], group_rows):
        if n > 1 and n != horizon:
            raise ProcessorError(f"{folder}/statistics.json['{tag}'].relative_action.{key}: {n} chunk rows of "
                                 f"statistics but {horizon} counted chunk rows (action delta_indices); upstream "
                                 "indexes the chunk with the statistics' shape and fails on it")
    record.update(stats="checkpoint", stats_source=source, state=state, action=action)
    return record


def describe(record: Dict) -> str:
    """One line for the import's output."""
    n16 = record["form"] == FORM_N16
    line = (f"data processing as upstream {'N1.6' if n16 else 'N1.7'}'s for embodiment '{record['embodiment_tag']}': "
            f"slot {record['embodiment_id']} ({record['embodiment_source']}); state/action min-max "
            f"{'in numpy float64 / float32' if n16 else 'in float32'} from "
            f"{record['stats_source']}, clipped to [-1, 1]: {'yes' if record['clip'] else 'no'}")
    if record.get("action", {}).get("relative") and any(record["action"]["relative"]):
        rel = [k for k, r in zip(record["action"]["keys"], record["action"]["relative"]) if r]
        line += f"; relative actions {rel} ({record['action']['rows']} chunk rows of statistics)"
    if record["state_dropout"] > 0:
        line += f"; state dropout {record['state_dropout']:g}"
    if record["valid_horizon"]:
        line += f"; action rows counted: {record['valid_horizon']}"
    return line


__all__ = ["n17_processor_record", "n16_processor_record", "embodiment_slot", "n16_embodiment_slot", "describe",
           "ProcessorError", "N17_EMBODIMENT_SLOTS", "N16_EMBODIMENT_SLOTS", "DEFAULT_TAG", "FORM", "FORM_N16"]
