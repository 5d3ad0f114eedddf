"""LoongForge model family: GR00T-N1.6-style VLA models written once in PyTorch.

Import with PYTHONPATH=scripts as `import model`. The modules, each importing only those listed
above it (test/scripts/test_import_graph.py keeps it so):
- model.tokenizer: the deterministic task-text tokenizer (reimplemented in C++)
- model.prompt:    the chat-templated prompt's layout
- model.ops:       loads LoongForge's custom operators (torch.ops.loongforge.*)
- model.embodiment: the per-embodiment layers (CategoryLinear, CategoryMLP)
- model.gr00t_head: the upstream-exact GR00T N1.6/N1.7 action head (Gr00tHead, HEAD_CONFIGS)
- model.config:    ModelConfig, CONFIGS, get_config, apply_overrides
- model.batch:     batch_spec (the batch contract as data), example_batch
- model.layers:    the layers the model families share (ViT and LM blocks, connector, masks, init)
- model.n16:       N16Model (TorchScript-able): the n16 backbone with its DiT action head
- model.backbones: the upstream-exact GR00T N1.6 (Eagle) and N1.7 (Qwen3-VL) backbones
- model.gr00t:     the GR00T models (n16 / eagle / qwen3vl backbone + that head, for gr00t-* configs)
- model.registry:  build_model (config -> model class), apply_freezing, is_trainable, param_role,
                   decay_flags
- model.flops:     analytic FLOPs per sample (forward, backward)
- model.export:    `python -m model.export --config n16-tiny --out FILE`
"""

from .config import CONFIGS, TOKENIZER_VOCAB, ModelConfig, apply_overrides, get_config
from .n16 import N16Model
from .registry import apply_freezing, build_model, decay_flags, is_trainable, param_role

__all__ = [
    "CONFIGS", "TOKENIZER_VOCAB", "ModelConfig", "apply_overrides", "get_config",
    "N16Model", "apply_freezing", "build_model", "decay_flags", "is_trainable", "param_role",
]
