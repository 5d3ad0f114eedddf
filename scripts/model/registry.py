"""The model registry: which model a ModelConfig builds, and the policies every model family shares.

- build_model(cfg, device=None): the model of cfg (model_class: N16Model of n16.py, or with
  cfg.gr00t_head one of gr00t.py's GR00T models, by cfg.backbone) with freezing applied.
- The policies, by parameter name (every family has the same top-level children: vision,
  [connector,] imu_encoder, audio_encoder, llm, action_head, embodiment):
  param_role (params.json's role groups), is_trainable / apply_freezing (the freezing rule),
  decay_flags (the weight-decay policy both trainers read from params.json).
The families' modules (layers.py, n16.py, backbones.py, gr00t.py) never import this one.
"""

from typing import Dict, Optional, Type

import torch
from torch import nn

from .config import ModelConfig
from .embodiment import group_category_linears
from .gr00t import gr00t_model_class
from .layers import RMSNorm
from .n16 import N16Model


# ---------------------------------------------------------------------------- roles, weight decay, freezing

# Role of each top-level child (parameter groups carried in params.json):
#   vision     = ViT + pixel-shuffle connector (the connector is GR00T's "mlp1",
#                part of the vision-language backbone, but always trainable)
#   llm        = language model (embedding, layers, final norm)
#   action     = DiT action head (VL projection, timestep MLP, position embedding, blocks)
#   embodiment = per-embodiment state encoder, action encoder, action decoder
#   small      = the optional imu / audio encoders, which belong to none of the above
ROLE_OF_CHILD = {
    "vision": "vision", "connector": "vision", "llm": "llm", "action_head": "action",
    "embodiment": "embodiment", "imu_encoder": "small", "audio_encoder": "small",
}


def param_role(name: str) -> str:
    child = name.split(".", 1)[0]
    if child not in ROLE_OF_CHILD:
        raise KeyError(f"parameter '{name}' belongs to no known module family; extend ROLE_OF_CHILD")
    return ROLE_OF_CHILD[child]


NORM_MODULES = (nn.LayerNorm, RMSNorm)


def decay_flags(model: nn.Module) -> Dict[str, bool]:
    """The weight-decay policy, per parameter name in named_parameters() order:
    a parameter decays when it has dim >= 2, is not a bias (so the 2-D
    per-embodiment bias (E, out) of CategorySpecificLinear does not decay) and
    is not a norm layer's weight. export.py writes it into params.json
    ("decay"); both trainers build their two AdamW groups from it
    (docs/training-semantics.md s5)."""
    norm_params = {f"{m_name}.{p_name}" if m_name else p_name
                   for m_name, m in model.named_modules() if isinstance(m, NORM_MODULES)
                   for p_name, _ in m.named_parameters(recurse=False)}
    return {n: p.dim() >= 2 and n.rsplit(".", 1)[-1] != "bias" and n not in norm_params
            for n, p in model.named_parameters()}


def is_trainable(name: str, cfg: ModelConfig) -> bool:
    """The freezing rule, by parameter name:
    - vision.*: tune_visual;
    - llm.embed_tokens: tune_llm;
    - llm.layers.i: tune_llm or i >= llm_layers - tune_top_llm_layers;
    - llm.norm (final norm): tune_llm, or tune_top_llm_layers > 0 on the n16 backbone (the exact
      GR00T backbones train it only with tune_llm, as upstream does);
    - everything else (connector, action head, embodiment MLPs, imu/audio): always."""
    parts = name.split(".")
    if parts[0] == "vision":
        return cfg.tune_visual
    if parts[0] == "llm":
        if cfg.tune_llm:
            return True
        if parts[1] == "layers":
            return int(parts[2]) >= cfg.llm_layers - cfg.tune_top_llm_layers
        if parts[1] == "norm":  # upstream GR00T freezes the whole LM, its final norm included
            return cfg.tune_top_llm_layers > 0 and cfg.backbone == "n16"
        return False
    return True


def apply_freezing(model: nn.Module, cfg: ModelConfig) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(is_trainable(name, cfg))


# ---------------------------------------------------------------------------- the model of a config

def model_class(cfg: ModelConfig) -> Type[nn.Module]:
    """The class build_model builds for cfg: N16Model, or when cfg.gr00t_head is set the GR00T model of
    cfg.backbone (gr00t.gr00t_model_class: same children names, batch and result)."""
    if cfg.gr00t_head:
        return gr00t_model_class(cfg)
    return N16Model


def build_model(cfg: ModelConfig, device: Optional[torch.device] = None) -> nn.Module:
    """model_class(cfg)(cfg), its CategoryLinears grouped when cfg.category_linear is "grouped", with
    freezing applied; device=torch.device("meta") builds without memory."""
    cls = model_class(cfg)
    if device is None:
        model = cls(cfg)
    else:
        with device:
            model = cls(cfg)
    if cfg.category_linear == "grouped":
        group_category_linears(model)
    apply_freezing(model, cfg)
    return model
