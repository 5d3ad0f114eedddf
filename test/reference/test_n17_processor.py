# What this file proves: a GR00T N1.7 checkpoint's data processing, as
# scripts/gr00t_processor.py records it and the reference pipeline
# (scripts/reference/lf_dataset.py) applies it, gives the model exactly what
# upstream's processor gives it. The oracle is lerobot 0.6.1's own pipeline,
# built by its make_groot_pre_post_processors from a checkpoint folder the test
# writes (config.json, processor_config.json, statistics.json,
# embodiment_id.json); its GrootN17PackInputsStep prepares the same rows of the
# bundled PickNPlace dataset (the float32 values our shards hold; LeRobot's
# episode-end padding repeats the last row and marks it padded). Bit for bit
# (torch.equal): the normalized state, the actions, the action mask and the
# embodiment slot, for the dataset's statistics (a tag the checkpoint has none
# for), the checkpoint's min / max without clipping, its q01 / q99 with
# clip_outliers (values clipped), relative action groups with per-step
# statistics and fewer counted rows (delta_indices), each on 48 samples (episode
# ends included). The slot comes from embodiment_id.json, else upstream's table,
# else 0. The processor's state dropout zeroes a sample's state with the
# checkpoint's probability (a per-sample draw of ours: 3000 samples at p = 0.3,
# and every dropped row all zero). What upstream would refuse, and what it would
# silently pad (a dataset whose widths differ from the checkpoint's statistics),
# is refused naming the file and key. The reference's dataset form (float64,
# without a record) gives other values on the same samples (the share is printed).
#
# Run: ctest --test-dir build -R python_n17_processor
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import lf_dataset as lfd
from gr00t_processor import ProcessorError, n17_processor_record
from gr00t_sidecars import upstream_batch, upstream_pack, upstream_processor_modules, write_checkpoint
from model.config import get_config
from test_reference import data_cfg, dataset_path, ds  # noqa: F401  (fixtures; ds64: conftest.py)

SAMPLES = [0, 1, 100, 407, 410, 415, 416, 417, 900, 1200, 1675, 2090, 2095] + list(range(3, 2096, 60))


@pytest.fixture(scope="module")
def upstream():
    return upstream_processor_modules()


def ours(ds, record, ids):
    sb = lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(), processor=record)
    samples = [sb.sample(i) for i in ids]
    return [torch.stack([s[k] for s in samples]) for k in ("state", "actions", "action_mask", "embodiment_id")]


def assert_same_as_upstream(upstream, ds, folder, tag):
    record = n17_processor_record(folder, json.loads((folder / "processor_config.json").read_text())
                                  ["processor_kwargs"], tag)
    up = upstream_batch(upstream, upstream_pack(upstream, folder, tag, ds), ds, SAMPLES)
    mine = ours(ds, record, SAMPLES)
    D, A = mine[0].shape[1], mine[1].shape[2]
    for name, u, m in zip(("state", "actions", "action_mask"), up[:3], mine[:3]):
        u = u.to(torch.float32)
        assert not u[..., D if name == "state" else A:].any(), f"{name}: upstream set values past our width"
        u = u[..., :D] if name == "state" else u[..., :A]
        diff = (u - m).abs().max().item()
        print(f"{tag} {name}: max |upstream - ours| = {diff}")
        assert torch.equal(u, m), f"{name} differs from upstream's by up to {diff}"
    assert torch.equal(up[3].to(torch.int64), mine[3])
    return record, mine


def test_the_dataset_statistics_when_the_checkpoint_has_none_for_the_tag(upstream, ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "some_other_robot")
    record, mine = assert_same_as_upstream(upstream, ds, folder, "new_embodiment")
    assert record["stats"] == "dataset" and record["embodiment_id"] == 10   # upstream's table: new_embodiment
    assert (mine[3] == 10).all()


def test_the_dataset_form_of_the_reference_is_not_upstreams(upstream, ds, tmp_path):
    """The comparison above can fail: the dataset form (float64, no record) differs from upstream's."""
    folder = write_checkpoint(tmp_path / "ck", ds, "some_other_robot")
    up = upstream_batch(upstream, upstream_pack(upstream, folder, "new_embodiment", ds), ds, SAMPLES)
    old = ours(ds, None, SAMPLES)
    D, A = old[0].shape[1], old[1].shape[2]
    differ = total = 0
    for u, m, valid in ((up[0][:, :D].float(), old[0], torch.ones_like(old[0])),
                        (up[1][..., :A].float(), old[1], old[2])):
        differ += int(((u != m) & (valid > 0)).sum())
        total += int(valid.sum())
    print(f"dataset form vs upstream: {differ} of {total} values differ ({100 * differ / total:.1f}%), "
          f"max {(up[1][..., :A].float() - old[1]).abs().max().item():.3g}")
    assert differ > 0


def test_the_checkpoints_min_max_without_clipping(upstream, ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", clip_outliers=False)
    record, _ = assert_same_as_upstream(upstream, ds, folder, "robot")
    assert record["stats"] == "checkpoint" and not record["clip"] and record["embodiment_id"] == 0


def test_percentiles_with_clipped_outliers(upstream, ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", use_percentiles=True)
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 7, "other": 3}))
    record, mine = assert_same_as_upstream(upstream, ds, folder, "robot")
    assert record["clip"] and record["embodiment_id"] == 7
    assert (mine[0].abs() == 1.0).sum() > 0 and (mine[1].abs() == 1.0).sum() > 0   # q01/q99 clip some values


def test_relative_action_groups_with_per_step_statistics_and_fewer_counted_rows(upstream, ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", relative=("left_arm", "right_arm"), rows=20, delta=12,
                              use_percentiles=True, use_relative_action=True)
    record, mine = assert_same_as_upstream(upstream, ds, folder, "robot")
    assert record["action"]["rows"] == 20 and sum(record["action"]["relative"]) == 2
    assert record["valid_horizon"] == 12 and not mine[2][:, 12:].any()


def test_state_dropout_zeroes_a_sample_state_with_the_checkpoints_probability(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", state_dropout_prob=0.3)
    record = n17_processor_record(folder, json.loads((folder / "processor_config.json").read_text())
                                  ["processor_kwargs"], "robot")
    sb = lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(), processor=record)
    dropped = [sb.state_dropped(p) for p in range(3000)]
    rate = sum(dropped) / len(dropped)
    print(f"state dropout: {sum(dropped)} of 3000 = {rate:.4f}")
    assert abs(rate - 0.3) < 4 * (0.3 * 0.7 / 3000) ** 0.5
    batch = sb.micro_batch(0, 0)
    kept = lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(), processor=dict(record, state_dropout=0.0))
    full = kept.micro_batch(0, 0)
    pos = [sb.sampler(0, 1).stream_position(0, 0, b) for b in range(8)]
    for b, p in enumerate(pos):
        want = torch.zeros_like(full["state"][b]) if sb.state_dropped(p) else full["state"][b]
        assert torch.equal(batch["state"][b], want)


def test_what_upstream_would_refuse_or_silently_pad_is_refused_by_name(ds, tmp_path):
    folder = write_checkpoint(tmp_path / "ck", ds, "robot", relative=("left_arm",))
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    kw["modality_configs"]["robot"]["action"]["action_configs"][0]["type"] = "eef"
    with pytest.raises(ProcessorError, match="only non_eef relative actions"):
        n17_processor_record(folder, kw, "robot")
    kw["modality_configs"]["robot"]["action"]["action_configs"][0].update(type="non_eef", state_key="nope")
    with pytest.raises(ProcessorError, match="'nope', which is not among the state modality_keys"):
        n17_processor_record(folder, kw, "robot")
    stats = json.loads((folder / "statistics.json").read_text())
    del stats["robot"]["state"]["neck"]["max"]
    (folder / "statistics.json").write_text(json.dumps(stats))
    with pytest.raises(ProcessorError, match=r"statistics.json\['robot'\].state.neck: no 'min' / 'max'"):
        n17_processor_record(folder, {"modality_configs": kw["modality_configs"]}, "robot")
    # a checkpoint whose statistics cover fewer state values than the dataset has: upstream pads, we refuse
    folder = write_checkpoint(tmp_path / "ck2", ds, "robot")
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    kw["modality_configs"]["robot"]["state"]["modality_keys"].remove("waist")
    record = n17_processor_record(folder, kw, "robot")
    with pytest.raises(ValueError, match="have 41 values but the dataset's state column 'observation.state' has 44"):
        lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(), processor=record)
    with pytest.raises(ValueError, match="data.normalization=mean_std"):
        lfd.SampleBuilder(ds, get_config("n16-tiny"), data_cfg(normalization="mean_std"),
                          processor=n17_processor_record(folder, None, "robot"))


@pytest.mark.parametrize("case", ["dataset statistics", "checkpoint q01/q99 with relative groups"])
def test_float64_data_is_prepared_as_upstream_prepares_it_in_float64(upstream, ds, ds64, tmp_path, case):
    """A dataset converted with --keep-float64 holds the source's float64 values; upstream's pipeline
    then computes in float64 (its float32 statistics promoted; the flat path's range rounded to float32,
    the grouped path's not), and so does ours, bit for bit; the float32 shards' values differ."""
    if case == "dataset statistics":
        folder = write_checkpoint(tmp_path / "ck", ds64, "some_other_robot")
        tag = "new_embodiment"
    else:
        folder = write_checkpoint(tmp_path / "ck", ds64, "robot", relative=("left_arm", "right_arm"), rows=20,
                                  delta=12, use_percentiles=True, use_relative_action=True)
        tag = "robot"
    record, mine = assert_same_as_upstream(upstream, ds64, folder, tag)
    rounded = ours(ds, record, SAMPLES)   # the same record on the float32 shards
    differ = sum(int((r != m).sum()) for r, m in zip(rounded[:2], mine[:2]))
    print(f"float64 data, {case}: {differ} state/action values differ from the float32 shards'")
    assert differ > 0
