# What this file proves: a GR00T N1.6 checkpoint's data processing, as
# scripts/gr00t_processor.py records it (n16_processor_record) and the reference
# pipeline (scripts/reference/lf_dataset.py) applies it, gives the model what
# Isaac-GR00T's Gr00tN1d6Processor gives it. Isaac-GR00T ships in no package
# and cannot be fetched here, so the oracle is `isaac_prepare` below: its
# StateActionProcessor.apply and the processor's concatenation, padding and
# float32 cast, written from its source (gr00t/data/state_action/
# state_action_processor.py, gr00t/data/utils.py normalize_values_minmax,
# pose.py JointPose, gr00t/model/gr00t_n1d6/processing_gr00t_n1d6.py) with
# numpy's and torch's own dtype rules doing the rounding: float64 statistics,
# the float32 data's quotient stored into a float32 array, relative values in
# float64, isclose(max, min) columns 0, torch.cat's promotion. Bit for bit
# (torch.equal) on samples with a full chunk of the bundled PickNPlace dataset:
# the checkpoint's min / max with clipping (and a column isclose calls empty),
# q01 / q99 with relative groups (use_relative_action) and fewer counted rows,
# relative groups left absolute without use_relative_action, and the dataset's
# min / max when the checkpoint has no statistics for the tag. The slot comes
# from embodiment_id.json over Isaac-GR00T's N1.6 table. N1.7's float32 form
# gives other values on the same samples (the share is printed). What upstream
# fails on, and what we do not reproduce, is refused by name. The N1.6 text
# form equals `re.sub(r"[^\w\s]", "", text.lower())` on every code point.
#
# Float64 data (a dataset converted with --keep-float64) stays float64 in
# upstream's arrays, and in ours. Not covered: rows past an episode's end
# (Isaac-GR00T's loader was not read for them; these samples avoid them).
#
# Run: ctest --test-dir build -R python_n16_processor
import json
import re
import sys

import numpy as np
import pytest
import torch

import lf_dataset as lfd
from gr00t_processor import ProcessorError, n16_processor_record, n17_processor_record
from gr00t_sidecars import groups, write_checkpoint
from model import tokenizer as tokenizers
from model.config import get_config
from test_reference import data_cfg, dataset_path, ds  # noqa: F401  (fixtures)

H = 16
CANDIDATES = [0, 1, 100, 250, 399, 417, 900, 1200, 1675, 2000] + list(range(3, 2096, 61))


def full_chunks(ds):
    """The candidate samples whose 16-row chunk lies inside their episode."""
    ids = [i for i in CANDIDATES if ds.locate(i)[1] + H <= ds.episodes[ds.locate(i)[0]].length]
    assert len(ids) >= 30
    return ids


# ---------------------------------------------------------------- the oracle (Isaac-GR00T's steps)
def isaac_minmax(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """normalize_values_minmax: into an array of the values' dtype, columns isclose calls empty left 0."""
    out = np.zeros_like(values)
    live = ~np.isclose(hi, lo)
    out[..., live] = (values[..., live] - lo[..., live]) / (hi[..., live] - lo[..., live])
    out[..., live] = 2 * out[..., live] - 1
    return out


def isaac_prepare(kw, stats, tag, state_rows, action_rows, max_dim=64):
    """Gr00tN1d6Processor.__call__'s state and action for one sample: state_rows (1, D) and action_rows
    (T, A) as the dataset holds them (float32, or float64); -> (state (max_dim,), action (T, max_dim)) float32."""
    mod = kw["modality_configs"][tag]
    st, ac = stats[tag], mod["action"]
    lo, hi = ("q01", "q99") if kw.get("use_percentiles") else ("min", "max")
    clip = kw.get("clip_outliers", True)
    state_keys, action_keys = mod["state"]["modality_keys"], ac["modality_keys"]
    bounds = {k: (np.array(st["state"][k][lo]), np.array(st["state"][k][hi])) for k in state_keys}
    a_bounds = {k: (np.array(st["action"][k][lo]), np.array(st["action"][k][hi])) for k in action_keys}
    configs = ac.get("action_configs") or [{}] * len(action_keys)
    relative = {k: c.get("rep") == "relative" and kw.get("use_relative_action", False)
                for k, c in zip(action_keys, configs)}
    for k in action_keys:
        if relative[k]:   # the relative statistics' whole dict replaces the group's: its min / max are used
            a_bounds[k] = (np.array(st["relative_action"][k]["min"]), np.array(st["relative_action"][k]["max"]))
    states = {k: state_rows[:, a:b] for k, (a, b) in columns(state_keys, bounds).items()}
    actions = {k: action_rows[:, a:b] for k, (a, b) in columns(action_keys, a_bounds).items()}
    norm_s = {}
    for k in state_keys:
        y = isaac_minmax(states[k], *bounds[k])
        norm_s[k] = np.clip(y, -1.0, 1.0) if clip else y
    norm_a = {}
    for k, c in zip(action_keys, configs):
        x = actions[k]
        if relative[k]:   # JointPose: float64 joints, the last state row as the reference
            ref = states[c.get("state_key") or k][-1]
            x = np.stack([np.array(r, dtype=np.float64) - np.array(ref, dtype=np.float64) for r in x])
        y = isaac_minmax(x, *a_bounds[k])
        norm_a[k] = np.clip(y, -1.0, 1.0) if clip else y
    a = torch.cat([torch.from_numpy(norm_a[k]) for k in action_keys], dim=-1)
    a = torch.cat([a, torch.zeros(a.shape[0], max_dim - a.shape[1])], dim=-1)
    s = torch.cat([torch.from_numpy(norm_s[k]) for k in state_keys], dim=-1)
    s = torch.cat([s, torch.zeros(s.shape[0], max_dim - s.shape[1])], dim=-1)
    return s.to(torch.float32)[0], a.to(torch.float32)


def columns(keys, bounds):
    """{key: (start, end)}: the groups' columns in modality_keys order, as the processor concatenates them."""
    out, pos = {}, 0
    for k in keys:
        n = bounds[k][0].shape[-1]
        out[k], pos = (pos, pos + n), pos + n
    return out


# ---------------------------------------------------------------- ours against it
def ours(ds, record, ids):
    """Our samples of the rows `ids` names in the dataset's row space (an N1.6 record's sample space
    holds only rows with whole chunks: training-semantics s1)."""
    sb = lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(), processor=record)
    samples = []
    for i in ids:
        e, t = ds.locate(i)
        assert t < sb.sample_rows[e]
        samples.append(sb.sample(sb.sample_starts[e] + t))
    return [torch.stack([s[k] for s in samples]) for k in ("state", "actions", "action_mask", "embodiment_id")]


def upstream(ds, folder, tag, ids, max_dim):
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    stats = json.loads((folder / "statistics.json").read_text())
    T = len(kw["modality_configs"][tag]["action"]["delta_indices"])
    out = []
    for i in ids:
        e, t = ds.locate(i)
        s, a = ds.array(e, "observation.state"), ds.array(e, "action")
        assert t + T <= len(a), f"sample {i} reaches past its episode's end"
        out.append(isaac_prepare(kw, stats, tag, np.array(s[t:t + 1]), np.array(a[t:t + T]), max_dim))
    return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out]), T


def record_of(folder, tag):
    return n16_processor_record(folder, json.loads((folder / "processor_config.json").read_text())
                                ["processor_kwargs"], tag)


def assert_same_as_upstream(ds, folder, tag):
    record = record_of(folder, tag)
    mine = ours(ds, record, full_chunks(ds))
    D, A = mine[0].shape[1], mine[1].shape[2]
    up_s, up_a, T = upstream(ds, folder, tag, full_chunks(ds), 64)
    assert not up_s[:, D:].any() and not up_a[..., A:].any()
    for name, u, m in (("state", up_s[:, :D], mine[0]), ("actions", up_a[..., :A], mine[1][:, :T])):
        diff = (u - m).abs().max().item()
        print(f"{tag} {name}: max |upstream - ours| = {diff}")
        assert torch.equal(u, m), f"{name} differs from upstream's by up to {diff}"
    mask = mine[2]   # the counted rows (every action value of them), then none
    assert (mask[:, 0].sum(-1) == 44).all() and (mask[:, :T] == mask[:, :1]).all() and not mask[:, T:].any()
    return record, mine


def test_the_checkpoints_min_max_with_clipping_and_a_column_isclose_calls_empty(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "new_embodiment")
    stats = json.loads((folder / "statistics.json").read_text())
    for v in stats["new_embodiment"]["state"].values():   # a narrower range, so that clipping shows
        v["max"] = [m - 0.25 * (m - n) for m, n in zip(v["max"], v["min"])]
    first = stats["new_embodiment"]["state"][groups(ds, "state")[0][0]]
    first["min"][0], first["max"][0] = 1000.0, 1000.005   # |max - min| <= 1e-8 + 1e-5 |min|: isclose
    (folder / "statistics.json").write_text(json.dumps(stats))
    record, mine = assert_same_as_upstream(ds, folder, "new_embodiment")
    assert record["form"] == "gr00t_n16" and record["clip"] and record["stats"] == "checkpoint"
    assert record["embodiment_id"] == 10 and (mine[3] == 10).all()   # Isaac-GR00T's table: new_embodiment
    assert (mine[0][:, 0] == 0).all() and (mine[0].abs() == 1.0).sum() > 0


def test_percentiles_with_relative_groups_and_fewer_counted_rows(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", relative=("left_arm", "right_arm"), rows=12, delta=12,
                              use_percentiles=True, use_relative_action=True)
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 7, "other": 3}))
    record, mine = assert_same_as_upstream(ds, folder, "robot")
    assert sum(record["action"]["relative"]) == 2 and record["action"]["rows"] == 12
    assert record["valid_horizon"] == 12 and record["embodiment_id"] == 7


def test_relative_groups_stay_absolute_without_use_relative_action(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", relative=("left_arm",), rows=H, delta=H)
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 2}))
    record, _ = assert_same_as_upstream(ds, folder, "robot")
    assert not any(record["action"]["relative"])


def test_the_dataset_statistics_when_the_checkpoint_has_none_for_the_tag(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "some_other_robot")
    record = record_of(folder, "new_embodiment")
    assert record["stats"] == "dataset" and record["embodiment_id"] == 10
    # upstream's set_statistics with the dataset's min / max (float64, as the converter stores them)
    stats = json.loads((folder / "statistics.json").read_text())
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    kw["modality_configs"]["new_embodiment"] = kw["modality_configs"].pop("some_other_robot")
    data = {}
    for modality, column in (("state", "observation.state"), ("action", "action")):
        mn, mx = ds.stats[column]["min"], ds.stats[column]["max"]
        data[modality] = {k: {"min": mn[a:b], "max": mx[a:b]} for k, a, b in groups(ds, modality)}
    stats["new_embodiment"] = data
    (folder / "processor_config.json").write_text(json.dumps({"processor_kwargs": kw}))
    (folder / "statistics.json").write_text(json.dumps(stats))
    mine = ours(ds, record, full_chunks(ds))
    up_s, up_a, T = upstream(ds, folder, "new_embodiment", full_chunks(ds), 64)
    assert torch.equal(up_s[:, :mine[0].shape[1]], mine[0])
    assert torch.equal(up_a[..., :mine[1].shape[2]], mine[1][:, :T])


def test_float64_data_stays_float64_as_in_upstreams_numpy(ds, ds64, tmp_path):
    """A dataset converted with --keep-float64: upstream's arrays are float64 throughout (no float32
    quotient), and ours equal them bit for bit; the float32 shards' values differ."""
    folder = write_checkpoint(tmp_path / "ck", ds64, "robot", relative=("left_arm",), rows=12, delta=12,
                              use_relative_action=True)
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 2}))
    record, mine = assert_same_as_upstream(ds64, folder, "robot")
    rounded = ours(ds, record, full_chunks(ds))
    differ = sum(int((r != m).sum()) for r, m in zip(rounded[:2], mine[:2]))
    print(f"float64 data: {differ} state/action values differ from the float32 shards'")
    assert differ > 0


def test_n17s_float32_form_is_not_n16s(ds, tmp_path):
    """The comparison above can fail: N1.7's record on the same checkpoint gives other values."""
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", relative=("left_arm",), rows=H, delta=H,
                              use_relative_action=True)
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 2}))
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    n17 = ours(ds, n17_processor_record(folder, kw, "robot"), full_chunks(ds))
    up_s, up_a, T = upstream(ds, folder, "robot", full_chunks(ds), 64)
    differ = int((up_s[:, :n17[0].shape[1]] != n17[0]).sum() + (up_a[..., :n17[1].shape[2]] != n17[1][:, :T]).sum())
    total = up_s[:, :n17[0].shape[1]].numel() + up_a[..., :n17[1].shape[2]].numel()
    print(f"N1.7's form vs N1.6's: {differ} of {total} values differ ({100 * differ / total:.1f}%)")
    assert differ > 0


def test_what_upstream_fails_on_or_we_do_not_reproduce_is_refused_by_name(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", relative=("left_arm",), rows=20, delta=12,
                              use_relative_action=True)
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 2}))
    with pytest.raises(ProcessorError, match=r"relative_action.left_arm: 20 chunk rows of statistics but 12 counted"):
        n16_processor_record(folder, kw, "robot")
    with pytest.raises(ProcessorError, match="'nobody' has no slot in embodiment_id.json nor in Isaac-GR00T's"):
        n16_processor_record(folder, kw, "nobody")
    kw["modality_configs"]["robot"]["state"]["mean_std_embedding_keys"] = ["left_arm"]
    with pytest.raises(ProcessorError, match=r"state.mean_std_embedding_keys=\['left_arm'\]"):
        n16_processor_record(folder, kw, "robot")
    del kw["modality_configs"]["robot"]["state"]["mean_std_embedding_keys"]
    kw["modality_configs"]["robot"]["state"]["sin_cos_embedding_keys"] = ["waist"]
    with pytest.raises(ProcessorError, match="sin_cos_embedding_keys.*apply_sincos_state_encoding"):
        n16_processor_record(folder, dict(kw, apply_sincos_state_encoding=True), "robot")
    with pytest.raises(ProcessorError, match="use_percentiles is set"):
        n16_processor_record(folder, dict(kw, use_percentiles=True), "new_embodiment")
    record = n16_processor_record(folder, dict(kw, use_relative_action=False), "robot")
    with pytest.raises(ValueError, match="data.normalization=mean_std.*GR00T N1.6"):
        lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(normalization="mean_std"), processor=record)


def test_the_n16_text_form_is_isaac_groots_regex_on_every_code_point():
    text = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    assert tokenizers.formalize(text, tokenizers.GR00T_N16_FORMALIZED) == re.sub(r"[^\w\s]", "", text.lower())
    assert tokenizers.formalize("", tokenizers.GR00T_N16_FORMALIZED) == ""   # N1.7 would say "perform the task"
    assert tokenizers.formalize("", tokenizers.GR00T_FORMALIZED) == "perform the task"


def test_an_n16_record_samples_only_rows_whose_chunk_ends_inside_the_episode(ds, tmp_path):
    """Isaac-GR00T's ShardedSingleStepDataset (allow_padding false, its default) samples step t of an
    episode of L rows only for t <= L - (max(delta) - min(delta) + 1): the sample space of an N1.6
    record counting V rows is the first L - V + 1 rows of each episode; the dataset form keeps every row."""
    folder = write_checkpoint(tmp_path / "ck", ds, "new_embodiment", rows=16, delta=16)
    record = record_of(folder, "new_embodiment")
    assert record["valid_horizon"] == 16
    sb = lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(), processor=record)
    plain = lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg())
    assert sb.sample_rows == [max(0, e.length - 15) for e in ds.episodes]
    assert plain.num_samples == sum(e.length for e in ds.episodes) == sb.num_samples + 15 * len(ds.episodes)
    for i in (0, sb.num_samples - 1, *range(7, sb.num_samples, 97)):
        e, t = sb.locate(i)
        assert t + 16 <= ds.episodes[e].length
        assert bool(sb.sample(i)["action_mask"][:16, :sb.action_w].all())
    last = sb.sample_starts[1] - 1                       # episode 0's last sample: its chunk ends at the last row
    assert sb.locate(last) == (0, ds.episodes[0].length - 16)
