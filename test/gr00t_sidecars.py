"""Upstream GR00T N1.7 checkpoint sidecars for tests: a checkpoint folder holding
config.json, processor_config.json (processor_kwargs with modality_configs[tag])
and statistics.json[tag] computed from a converted dataset's own rows
(scripts/reference/lf_dataset.LFDataset), as Isaac-GR00T lays them out: per
modality key of the dataset's modality.json groups, min / max / mean / std /
q01 / q99, and for relative action keys relative_action statistics per chunk
step (action[t + r] - state[t]; its max scaled by 0.8 so that clipping shows).
Used by test/reference/test_n17_processor.py (against upstream's processor) and
test/e2e/test_parity.py (both trainers on the same record). upstream_pack() and
upstream_batch() run lerobot 0.6.1's own N1.7 processor pipeline (its
make_groot_pre_post_processors, from the wheel: test/lerobot_oracle.py) on rows
of a converted dataset.
"""
import json
from pathlib import Path

import numpy as np
import torch

H = 16  # the chunk the tests train on (data.action_horizon)


def groups(ds, modality):
    """modality.json's groups of the dataset: [(key, start, end)] in column order."""
    g = ds.meta["modality"][modality]
    return sorted(((k, v["start"], v["end"]) for k, v in g.items()), key=lambda x: x[1])


def stats_of(values: np.ndarray) -> dict:
    return {"min": values.min(0).tolist(), "max": values.max(0).tolist(), "mean": values.mean(0).tolist(),
            "std": values.std(0).tolist(), "q01": np.quantile(values, 0.01, axis=0).tolist(),
            "q99": np.quantile(values, 0.99, axis=0).tolist()}


def write_checkpoint(folder: Path, ds, tag: str, relative=(), rows=H, delta=H, **kwargs) -> Path:
    """A checkpoint folder with upstream's N1.7 sidecars; statistics of `tag` from the dataset's rows."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "Gr00tN1d7"}))
    states = np.concatenate([ds.array(e, "observation.state") for e in range(len(ds.episodes))]).astype(np.float64)
    actions = np.concatenate([ds.array(e, "action") for e in range(len(ds.episodes))]).astype(np.float64)
    st = {k: stats_of(states[:, a:b]) for k, a, b in groups(ds, "state")}
    ac = {k: stats_of(actions[:, a:b]) for k, a, b in groups(ds, "action")}
    rel = {}
    for k, a, b in groups(ds, "action"):
        if k in relative:   # action[t + r] - state[t] of every full chunk, per chunk step r
            chunks = []
            for e in range(len(ds.episodes)):
                s, x = ds.array(e, "observation.state")[:, a:b], ds.array(e, "action")[:, a:b]
                n = len(s) - rows
                chunks.append(np.stack([x[r:r + n] - s[:n] for r in range(rows)], axis=1))
            c = np.concatenate(chunks).astype(np.float64)   # (samples, rows, dims)
            rel[k] = {"min": c.min(0).tolist(), "max": (c.max(0) * 0.8).tolist(), "mean": c.mean(0).tolist(),
                      "std": c.std(0).tolist()}
    (folder / "statistics.json").write_text(json.dumps({tag: {"state": st, "action": ac, "relative_action": rel}}))
    action_configs = [{"rep": "relative" if k in relative else "absolute", "type": "non_eef", "format": "default"}
                      for k, _, _ in groups(ds, "action")]
    modality = {"state": {"modality_keys": [k for k, _, _ in groups(ds, "state")], "delta_indices": [0]},
                "action": {"modality_keys": [k for k, _, _ in groups(ds, "action")],
                           "delta_indices": list(range(delta)), "action_configs": action_configs}}
    kw = dict(modality_configs={tag: modality}, **kwargs)
    (folder / "processor_config.json").write_text(json.dumps({"processor_kwargs": kw}))
    return folder


def upstream_processor_modules():
    """lerobot 0.6.1's processor module, configuration module and TransitionKey, from the wheel."""
    import lerobot_oracle
    lerobot_oracle.install_wheel_importer()
    import lerobot.policies.groot.configuration_groot as configuration
    import lerobot.policies.groot.processor_groot as processor
    from lerobot.lerobot_types import TransitionKey
    return processor, configuration, TransitionKey


def upstream_pack(upstream, folder: Path, tag: str, ds, horizon: int = H):
    """The GrootN17PackInputsStep of upstream's pipeline for checkpoint `folder` and `tag`, with the
    dataset's statistics as its fallback (as lerobot-train passes them)."""
    processor, configuration, _ = upstream
    cfg = configuration.GrootConfig(base_model_path=str(folder), embodiment_tag=tag, chunk_size=horizon,
                                    n_action_steps=horizon)
    stats = {k: {s: np.asarray(v, dtype=np.float64) for s, v in ds.stats[k].items()}
             for k in ("observation.state", "action")}
    pre, _ = processor.make_groot_pre_post_processors(cfg, dataset_stats=stats)
    return next(s for s in pre.steps if type(s).__name__ == "GrootN17PackInputsStep")


def upstream_batch(upstream, pack, ds, ids, horizon: int = H):
    """Upstream's state (B, D), actions (B, H, A), mask (B, H, A), slot (B,) for our samples `ids` (the
    values our shards hold, float32 or, converted with --keep-float64, float64; LeRobot repeats an
    episode's last row past its end, marked padded)."""
    _, _, TK = upstream
    states, chunks, pads = [], [], []
    for i in ids:
        e, t = ds.locate(i)
        s, a = ds.array(e, "observation.state"), ds.array(e, "action")
        rows = [min(t + k, len(a) - 1) for k in range(horizon)]
        states.append(torch.from_numpy(np.array(s[t], dtype=s.dtype)))
        chunks.append(torch.from_numpy(np.array(a[rows], dtype=a.dtype)))
        pads.append(torch.tensor([t + k >= len(a) for k in range(horizon)]))
    out = pack({TK.OBSERVATION: {"observation.state": torch.stack(states)}, TK.ACTION: torch.stack(chunks),
                TK.COMPLEMENTARY_DATA: {"task": ["pick the cube"] * len(ids), "action_is_pad": torch.stack(pads)}})
    c = out[TK.COMPLEMENTARY_DATA]
    return out[TK.OBSERVATION]["state"][:, 0], out[TK.ACTION], c["action_mask"], c["embodiment_id"]
