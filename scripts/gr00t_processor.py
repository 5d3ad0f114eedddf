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


def _f32(values, where: str) -> np.ndarray:
    try:
        a = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProcessorError(f"{where}: not a list of numbers") from None
    return a.astype(np.float32)


def _bounds(entry, use_percentiles: bool, where: str) -> Tuple[np.ndarray, np.ndarray]:
    lo, hi = ("q01", "q99") if use_percentiles else ("min", "max")
    if not isinstance(entry, dict) or lo not in entry or hi not in entry:
        raise ProcessorError(f"{where}: no '{lo}' / '{hi}' statistics (upstream needs them to normalize)")
    mn, mx = _f32(entry[lo], f"{where}.{lo}"), _f32(entry[hi], f"{where}.{hi}")
    if mn.shape != mx.shape or mn.ndim not in (1, 2) or mn.shape[-1] == 0:
        raise ProcessorError(f"{where}: '{lo}' {list(mn.shape)} and '{hi}' {list(mx.shape)} must be equal, "
                             "non-empty 1-D (or, for relative actions, 2-D) lists")
    return mn, mx


def embodiment_slot(folder: Path, tag: str) -> Tuple[int, str]:
    """(slot, where it came from) as upstream picks it: embodiment_id.json, else the released table, else 0."""
    mapping = {}
    for k, v in _read(folder, "embodiment_id.json").items():
        try:
            mapping[str(k)] = int(v)
        except (TypeError, ValueError):
            continue
    if mapping:
        return (mapping[tag], "embodiment_id.json") if tag in mapping else \
            (0, f"embodiment_id.json has no '{tag}': upstream uses slot 0")
    if tag in N17_EMBODIMENT_SLOTS:
        return N17_EMBODIMENT_SLOTS[tag], "upstream's table of released N1.7 tags"
    return 0, f"'{tag}' is not a released N1.7 tag and there is no embodiment_id.json: upstream uses slot 0"


def n17_processor_record(folder: Path, processor_kwargs: Optional[Dict], tag: str = DEFAULT_TAG) -> Dict:
    folder = Path(folder)
    kw = processor_kwargs or {}
    clip = kw.get("clip_outliers", True)
    clip = clip if isinstance(clip, bool) else True
    try:
        dropout = float(kw.get("state_dropout_prob")) if kw.get("state_dropout_prob") is not None else 0.0
    except (TypeError, ValueError):
        dropout = 0.0
    if not 0.0 <= dropout < 1.0:
        raise ProcessorError(f"{folder}/processor_config.json: processor_kwargs.state_dropout_prob={dropout} "
                             "must be in [0, 1)")
    use_percentiles = bool(kw.get("use_percentiles", False))
    configs = kw.get("modality_configs", {})
    modality = configs.get(tag, {}) if isinstance(configs, dict) else {}
    modality = modality if isinstance(modality, dict) else {}
    slot, slot_source = embodiment_slot(folder, tag)
    action_cfg = modality.get("action", {}) if isinstance(modality.get("action"), dict) else {}
    delta = action_cfg.get("delta_indices", [])
    record = {"form": FORM, "clip": clip, "state_dropout": dropout, "embodiment_tag": tag, "embodiment_id": slot,
              "embodiment_source": slot_source, "valid_horizon": len(delta) if isinstance(delta, list) else 0}
    all_stats = _read(folder, "statistics.json")
    raw = all_stats.get(tag) if isinstance(all_stats.get(tag), dict) else {}
    if not raw or not modality:
        record.update(stats="dataset", stats_source=(
            f"the dataset's min / max: {folder.name}/statistics.json has no statistics for '{tag}'" if not raw else
            f"the dataset's min / max: processor_config.json has no modality_configs['{tag}']"))
        return record
    where = f"{folder}/statistics.json['{tag}']"

    state_keys = (modality.get("state") or {}).get("modality_keys", []) if isinstance(modality.get("state"), dict) else []
    action_keys = action_cfg.get("modality_keys", [])
    action_configs = action_cfg.get("action_configs", [])
    if not state_keys or not action_keys:
        raise ProcessorError(f"{folder}/processor_config.json: modality_configs['{tag}'] names no state or no action "
                             "modality_keys, so upstream's statistics cannot be laid out")
    state_min, state_max, state_dims, state_start = [], [], [], {}
    for key in state_keys:
        mn, mx = _bounds((raw.get("state") or {}).get(key), use_percentiles, f"{where}.state.{key}")
        if mn.ndim != 1:
            raise ProcessorError(f"{where}.state.{key}: state statistics must be 1-D lists")
        state_start[key] = (sum(state_dims), mn.shape[0])
        state_dims.append(mn.shape[0])
        state_min.append(mn), state_max.append(mx)
    groups: List[Tuple[np.ndarray, np.ndarray, List[int]]] = []
    relative_flags, action_dims = [], []
    for i, key in enumerate(action_keys):
        cfg = action_configs[i] if i < len(action_configs) and isinstance(action_configs[i], dict) else {}
        relative = _rep(cfg.get("rep")) == "relative"
        if relative:
            if _rep(cfg.get("type")) != "non_eef":
                raise ProcessorError(f"{folder}/processor_config.json: action '{key}' is relative of type "
                                     f"{cfg.get('type')!r}; upstream trains only non_eef relative actions")
            mn, mx = _bounds((raw.get("relative_action") or {}).get(key), False, f"{where}.relative_action.{key}")
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
            mn, mx = _bounds((raw.get("action") or {}).get(key), use_percentiles, f"{where}.action.{key}")
            if mn.ndim != 1:
                raise ProcessorError(f"{where}.action.{key}: absolute action statistics must be 1-D lists")
            index = [-1] * mn.shape[0]
        groups.append((mn.reshape(-1, mn.shape[-1]), mx.reshape(-1, mx.shape[-1]), index))
        relative_flags.append(relative)
        action_dims.append(mn.shape[-1])
    # Rows: one for absolute groups; a relative group's rows are its chunk steps. Upstream refuses a
    # chunk longer than any relative group's rows, so the fewest rows are all that can be used.
    rows = min([g[0].shape[0] for g in groups if g[0].shape[0] > 1] or [1])
    a_min = np.concatenate([np.broadcast_to(g[0][:rows], (rows, g[0].shape[1])) for g in groups], axis=1)
    a_max = np.concatenate([np.broadcast_to(g[1][:rows], (rows, g[1].shape[1])) for g in groups], axis=1)
    record.update(
        stats="checkpoint",
        stats_source=f"{folder.name}/statistics.json['{tag}'] ({'q01 / q99' if use_percentiles else 'min / max'}"
                     + (", relative_action min / max" if any(relative_flags) else "") + ")",
        state={"keys": list(state_keys), "dims": state_dims, "min": np.concatenate(state_min).tolist(),
               "max": np.concatenate(state_max).tolist()},
        action={"keys": list(action_keys), "dims": action_dims, "relative": relative_flags, "rows": rows,
                "min": a_min.tolist(), "max": a_max.tolist(),
                "state_index": [j for g in groups for j in g[2]]})
    return record


def describe(record: Dict) -> str:
    """One line for the import's output."""
    line = (f"data processing as upstream N1.7's for embodiment '{record['embodiment_tag']}': slot "
            f"{record['embodiment_id']} ({record['embodiment_source']}); state/action min-max in float32 from "
            f"{record['stats_source']}, clipped to [-1, 1]: {'yes' if record['clip'] else 'no'}")
    if record.get("action", {}).get("relative") and any(record["action"]["relative"]):
        rel = [k for k, r in zip(record["action"]["keys"], record["action"]["relative"]) if r]
        line += f"; relative actions {rel} ({record['action']['rows']} chunk rows of statistics)"
    if record["state_dropout"] > 0:
        line += f"; state dropout {record['state_dropout']:g}"
    if record["valid_horizon"]:
        line += f"; action rows counted: {record['valid_horizon']}"
    return line


__all__ = ["n17_processor_record", "embodiment_slot", "describe", "ProcessorError", "N17_EMBODIMENT_SLOTS",
           "DEFAULT_TAG", "FORM"]
