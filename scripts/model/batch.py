"""The batch contract of N16Model as data: which keys, dtypes and shapes.

Contract
- `batch_spec(cfg)` -> the dict exported as `loongforge/batch_spec.json`:
    {"batch_dim": "B",
     "dims": {symbol: default size, ...},          # every symbol except B
     "inputs": [{"key", "dtype", "shape" (symbolic), "default_shape"
                 (symbols resolved except B), "required", "note"}, ...],
     "text_slot_cut": bool}                        # L may be cut to the batch's longest text
  The C++ trainer builds batches from it; `example_batch` below builds random
  ones from the same table, so the table cannot drift from what the model reads.
- `example_batch(cfg, batch_size, seed, ...)` -> Dict[str, Tensor] of random
  but valid inputs (CPU, fp32), for tests and smoke runs; with_fm=False
  leaves out every draw the model can make itself (fm_t, fm_noise and
  `head_draw_keys(cfg)`).
- `head_draw_keys(cfg)`: the GR00T head's own draws that a batch may carry
  instead (state_drop, state_noise), in the head's order; a trainer that
  draws them outside the model (the compiled step) draws them in that order
  from the generator the model would use.
"""

from typing import Dict, List, Optional

import torch
from torch import Tensor

from .config import ModelConfig
from .gr00t_head import head_config_for
from .prompt import IMAGE_SLOT, TEXT_SLOT, parse_ids
from .tokenizer import BOS, EOS, TOKENIZER_VOCAB

# key, dtype, symbolic shape, required (None = iff the named config flag is on), note
_INPUTS = [
    ("images", "float32", ["B", "V", 3, "IMG", "IMG"], True,
     "camera frames, already normalized by the data pipeline"),
    ("text_tokens", "int64", ["B", "L"], True, "tokenizer.py ids, padded with 0"),
    ("text_mask", "bool", ["B", "L"], True, "True = real token (including BOS/EOS), on a prefix of each row (padded at the end)"),
    ("state", "float32", ["B", "D_state"], True, "proprioceptive state, zero-padded to max_state_dim"),
    ("actions", "float32", ["B", "H", "A"], True, "action chunk t..t+H-1, zero-padded to max_action_dim"),
    ("action_mask", "float32", ["B", "H", "A"], True,
     "1 = valid element (real action dim and not past the episode end)"),
    ("embodiment_id", "int64", ["B"], True, "embodiment slot in [0, num_embodiments)"),
    ("fm_t", "float32", ["B"], False, "optional flow-matching time; sampled from (s - Beta(1.5,1))/s if absent"),
    ("fm_noise", "float32", ["B", "H", "A"], False, "optional flow-matching noise; randn if absent"),
    ("state_drop", "float32", ["B"], False,
     "optional GR00T head state dropout draw, 1 = drop (only when the head's state_dropout > 0); drawn if absent"),
    ("state_noise", "float32", ["B", 1, "D_tok"], False,
     "optional GR00T head state noise draw (only when its state_noise_scale > 0); randn if absent"),
    ("imu", "float32", ["B", "T_imu", "C_imu"], "use_imu", "IMU / proprioception time series"),
    ("audio", "float32", ["B", "T_audio", "F_audio"], "use_audio", "log-mel frames (or raw sample frames)"),
]


def head_draw_keys(cfg: ModelConfig) -> List[str]:
    """The draws of the GR00T head's forward that a batch may carry, in the order the head draws them:
    state_drop when its state_dropout > 0, state_noise when its state_noise_scale > 0 (model/gr00t_head.py)."""
    if not cfg.gr00t_head:
        return []
    head = head_config_for(cfg)
    return [k for k, on in (("state_drop", head.state_dropout > 0), ("state_noise", head.state_noise_scale > 0)) if on]


def dims(cfg: ModelConfig) -> Dict[str, int]:
    d = {"V": cfg.num_views, "IMG": cfg.image_size, "L": cfg.max_text_len,
         "D_state": cfg.max_state_dim, "H": cfg.action_horizon, "A": cfg.max_action_dim,
         "T_imu": cfg.imu_len, "C_imu": cfg.imu_channels,
         "T_audio": cfg.audio_len, "F_audio": cfg.audio_features}
    if cfg.gr00t_head:
        d["D_tok"] = head_config_for(cfg).input_embedding_dim  # the head's state token width
    return d


def batch_spec(cfg: ModelConfig) -> Dict:
    d = dims(cfg)
    draws = head_draw_keys(cfg)
    inputs: List[Dict] = []
    for key, dtype, shape, required, note in _INPUTS:
        if key in ("state_drop", "state_noise") and key not in draws:
            continue  # the model draws no such thing
        if isinstance(required, str):
            if not getattr(cfg, required):
                continue  # the model has no encoder for it and ignores the key
            required = True
        inputs.append({"key": key, "dtype": dtype, "shape": shape,
                       "default_shape": [d.get(s, s) if isinstance(s, str) else s for s in shape],
                       "required": required, "note": note})
    used = {s for i in inputs for s in i["shape"] if isinstance(s, str)}
    return {"batch_dim": "B", "dims": {k: v for k, v in d.items() if k in used}, "inputs": inputs,
            "text_slot_cut": text_slot_cut(cfg)}


def text_slot_cut(cfg: ModelConfig) -> bool:
    """Whether the model gives the same loss and gradients when its text slot L is cut to any width at least
    the batch's longest text (DMF cuts it so; test/model/test_text_slot_cut.py).

    True for N16Model: its LM is causal with the text at the end and its action head masks the pads. A GR00T
    head's vl_self_attention attends pads: without a chat template every pad of the slot, so the result
    depends on L. A chat-templated import hides the pads common to the whole batch (upstream pads its batch
    to the longest prompt: model/prompt.py, gr00t_head.py hide_common_pads), which are the ones a cut removes;
    with the images before the text slot (N1.7) nothing else moves. N1.6's template puts the images after
    the text, at positions fixed for the whole slot."""
    if not cfg.gr00t_head:
        return True
    if not cfg.chat_template_ids:
        return False
    ids = parse_ids(cfg.chat_template_ids)
    images = [i for i, x in enumerate(ids) if x == IMAGE_SLOT]
    return TEXT_SLOT in ids and all(i < ids.index(TEXT_SLOT) for i in images)


def example_batch(cfg: ModelConfig, batch_size: int, seed: int = 0, with_fm: bool = True,
                  horizon: Optional[int] = None) -> Dict[str, Tensor]:
    """Random valid batch: text of random lengths, the last action steps masked on row 0."""
    g = torch.Generator().manual_seed(seed)
    d = dims(cfg)
    if horizon is not None:
        d["H"] = horizon
    d["B"] = batch_size
    out: Dict[str, Tensor] = {}
    for i in batch_spec(cfg)["inputs"]:
        shape = [d[s] if isinstance(s, str) else s for s in i["shape"]]
        if i["dtype"] == "float32":
            out[i["key"]] = torch.randn(shape, generator=g)
    B, L = batch_size, d["L"]
    lengths = torch.randint(2, L + 1, (B,), generator=g)                          # (B,)
    mask = torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)                    # (B, L)
    words = torch.randint(4, TOKENIZER_VOCAB, (B, L), generator=g)
    tokens = torch.where(mask, words, torch.zeros_like(words))
    tokens[:, 0] = BOS
    tokens[torch.arange(B), lengths - 1] = EOS
    out["text_tokens"], out["text_mask"] = tokens, mask
    action_mask = torch.ones(B, d["H"], d["A"])
    action_mask[0, d["H"] // 2:] = 0.0      # row 0 ran past its episode end
    action_mask[:, :, 44:] = 0.0            # a 44-D robot zero-pads to 64
    out["action_mask"] = action_mask
    out["embodiment_id"] = torch.randint(0, cfg.num_embodiments, (B,), generator=g)
    if with_fm:
        out["fm_t"] = torch.rand(B, generator=g)
        if "state_drop" in out:
            out["state_drop"] = (torch.rand(B, generator=g) < 0.5).float()
    else:
        for key in ["fm_t", "fm_noise"] + head_draw_keys(cfg):
            out.pop(key)
    return out
