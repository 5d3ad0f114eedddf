"""Analytic FLOPs per sample of an N16Model, forward and backward, from its config.

Contract
- `flops_per_sample(cfg) -> {"forward_per_sample", "backward_per_sample",
  "batch_shape", "by_role"}` for the config's default batch shape (num_views,
  action_horizon, max_text_len, imu/audio tokens when enabled). Used for MFU.
- Only matmul-like work counts: a (M x K) @ (K x N) product is 2*M*N*K FLOPs;
  convolutions count as the equivalent matmul; attention scores (Q K^T) and
  values (P V) are included. Norms, activations, softmax, RoPE, embedding
  lookups and the loss are not counted.
- Attention is counted over the full padded length (the causal LM mask halves
  nothing, because the masked SDPA still computes every score), and the text
  is counted at max_text_len.

Note [Backward FLOPs rule]
The forward graph is listed op by op (every matmul, in forward order, grouped
into named blocks: patch embedding, each ViT layer, connector, imu/audio
encoders, each LM layer, VL projection, timestep MLP, embodiment encoders,
each DiT block, output projection, action decoder). For a weight op
(activation @ weight, forward cost F):
    backward = F * [gradient must flow through its input]
             + F * [its weight is trainable]
where "gradient must flow through its input" means some trainable parameter
lies upstream of that input in the graph (earlier ops of the same block count,
and so does a norm with a trainable affine right before the op). An attention
op (Q K^T or P V, no weights) costs 2F when gradient flows through its inputs
and 0 otherwise. Consequences: a frozen block with nothing trainable upstream
costs 0 (the ViT under the default freezing); a frozen LM layer below the
trainable top layers costs 1x on its weight ops and 2x on its attention ops,
because the always-trainable connector is upstream; a trainable block costs
2x, except the input gradient of its very first ops when nothing upstream
trains. This is the per-block "1x input-grads + 1x weight-grads" rule applied
at op granularity; it equals what autograd executes (test_flops.py checks it
against torch.utils.flop_counter on n16-tiny with the math SDPA backend).
"""

from dataclasses import dataclass
from typing import Dict, List

from .config import ModelConfig
from .n16 import is_trainable


@dataclass
class Op:
    block: str
    role: str
    forward: int
    input_grad: bool         # something trainable upstream of this op's input(s)
    weights_trainable: bool  # always False for attention ops
    attention: bool = False

    @property
    def backward(self) -> int:
        if self.attention:
            return 2 * self.forward * int(self.input_grad)
        return self.forward * int(self.input_grad) + self.forward * int(self.weights_trainable)


def mm(m: int, k: int, n: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product."""
    return 2 * m * k * n


class Graph:
    """Op list builder. Each method takes `up` (is a trainable parameter upstream
    of the op's input?) and returns `up` for the op's output."""

    def __init__(self):
        self.ops: List[Op] = []

    def weight(self, block: str, role: str, flops: int, up: bool, trainable: bool) -> bool:
        self.ops.append(Op(block, role, flops, up, trainable))
        return up or trainable

    def attention(self, block: str, role: str, flops: int, up: bool) -> bool:
        self.ops.append(Op(block, role, flops, up, False, attention=True))
        return up

    def mlp(self, block: str, role: str, flops: List[int], up: bool, trainable: bool) -> bool:
        """A chain of weight ops (each consumes the previous one's output)."""
        for f in flops:
            up = self.weight(block, role, f, up, trainable)
        return up


def ops(cfg: ModelConfig) -> List[Op]:
    """The forward graph of one sample (see Note [Backward FLOPs rule])."""
    g = Graph()
    V, H, L = cfg.num_views, cfg.action_horizon, cfg.max_text_len
    A, Ds = cfg.max_action_dim, cfg.max_state_dim

    # ---- vision: per view P patches, T tokens after the pixel shuffle
    P, T, w, f = cfg.patches_per_view, cfg.tokens_per_view, cfg.vit_width, cfg.vit_ffn
    tv = cfg.tune_visual
    up = g.weight("vision.patch_embed", "vision", V * mm(P, 3 * cfg.patch_size ** 2, w), False, tv)
    for i in range(cfg.vit_layers):
        b = f"vision.blocks.{i}"
        x_up = up
        qkv_up = g.weight(b, "vision", V * mm(P, w, 3 * w), x_up, tv)
        att_up = g.attention(b, "vision", V * 2 * mm(P, w, P), qkv_up)           # scores + values
        up = g.weight(b, "vision", V * mm(P, w, w), att_up, tv)                   # o
        up = g.mlp(b, "vision", [V * mm(P, w, f), V * mm(P, f, w)], up, tv)
    C = cfg.llm_width
    s2 = cfg.pixel_shuffle ** 2
    # The connector's LayerNorm has a trainable affine, so fc1's input needs a gradient.
    vision_up = g.mlp("connector", "vision", [V * mm(T, s2 * w, C), V * mm(T, C, C)], True, True)

    # ---- optional series encoders (conv1 k=3, conv2 k=3 stride 2, linear per token)
    def series(block: str, t_len: int, c_in: int, n_tok: int) -> bool:
        hid = cfg.series_hidden
        flops = [mm(t_len, 3 * c_in, hid), mm((t_len + 1) // 2, 3 * hid, hid), mm(n_tok, hid, C)]
        return g.mlp(block, "small", flops, False, True)

    if cfg.use_imu:
        vision_up = series("imu_encoder", cfg.imu_len, cfg.imu_channels, cfg.imu_tokens) or vision_up
    if cfg.use_audio:
        vision_up = series("audio_encoder", cfg.audio_len, cfg.audio_features, cfg.audio_tokens) or vision_up

    # ---- language model over S tokens (text embedding rows carry no matmul)
    S = cfg.vl_len()
    hq, hkv, d, fl = cfg.llm_heads, cfg.llm_kv_heads, cfg.llm_head_dim, cfg.llm_ffn
    up = vision_up or cfg.tune_llm  # the embedding's gradient needs nothing downstream either way
    for i in range(cfg.llm_layers):
        b = f"llm.layers.{i}"
        tr = is_trainable(f"{b}.x", cfg)
        qkv_up = g.weight(b, "llm", mm(S, C, hq * d) + 2 * mm(S, C, hkv * d), up, tr)
        att_up = g.attention(b, "llm", 2 * hq * mm(S, d, S), qkv_up)
        up = g.weight(b, "llm", mm(S, hq * d, C), att_up, tr)
        up = g.weight(b, "llm", 2 * mm(S, C, fl), up, tr)                          # gate, up
        up = g.weight(b, "llm", mm(S, fl, C), up, tr)                              # down
    # vl_norm (trainable affine) precedes vl_proj, so its input needs a gradient regardless.
    ctx_up = g.weight("action_head.vl_proj", "action", mm(S, C, cfg.dit_width), True, True)

    # ---- action head and embodiment MLPs
    w, fd, hid, N = cfg.dit_width, cfg.dit_ffn, cfg.embodiment_hidden, 1 + H
    temb_up = g.mlp("action_head.timestep_encoder", "action",
                    [mm(1, cfg.timestep_dim, w), mm(1, w, w)], False, True)
    g.mlp("embodiment.state_encoder", "embodiment", [mm(1, Ds, hid), mm(1, hid, w)], False, True)
    g.mlp("embodiment.action_encoder", "embodiment", [mm(H, A, w), mm(H, 2 * w, w), mm(H, w, w)], False, True)
    up = True  # the DiT input comes from the trainable encoders
    for i in range(cfg.dit_layers):
        b = f"action_head.blocks.{i}"
        g.weight(b, "action", 2 * mm(1, w, 2 * w), temb_up, True)                 # two AdaLN modulations
        if i % 2 == 0:   # cross-attention: q on N tokens, k/v on the S VL tokens
            g.weight(b, "action", mm(N, w, w), up, True)
            g.weight(b, "action", mm(S, w, 2 * w), ctx_up, True)
            g.attention(b, "action", 2 * mm(N, w, S), True)
        else:            # self-attention over N tokens
            g.weight(b, "action", mm(N, w, 3 * w), up, True)
            g.attention(b, "action", 2 * mm(N, w, N), True)
        g.mlp(b, "action", [mm(N, w, w), mm(N, w, fd), mm(N, fd, w)], True, True)  # o, FF
    g.weight("action_head.proj_out", "action", mm(1, w, 2 * w), temb_up, True)
    g.weight("action_head.proj_out", "action", mm(H, w, hid), True, True)
    g.mlp("embodiment.action_decoder", "embodiment", [mm(H, hid, hid), mm(H, hid, A)], True, True)
    return g.ops


def batch_shape(cfg: ModelConfig) -> Dict[str, int]:
    shape = {"V": cfg.num_views, "H": cfg.action_horizon, "L": cfg.max_text_len,
             "A": cfg.max_action_dim, "D_state": cfg.max_state_dim, "IMG": cfg.image_size,
             "S_vl": cfg.vl_len()}
    if cfg.use_imu:
        shape.update(T_imu=cfg.imu_len, C_imu=cfg.imu_channels)
    if cfg.use_audio:
        shape.update(T_audio=cfg.audio_len, F_audio=cfg.audio_features)
    return shape


def flops_per_sample(cfg: ModelConfig) -> Dict:
    bs = ops(cfg)
    by_role: Dict[str, Dict[str, int]] = {}
    for b in bs:
        r = by_role.setdefault(b.role, {"forward": 0, "backward": 0})
        r["forward"] += b.forward
        r["backward"] += b.backward
    return {
        "forward_per_sample": sum(b.forward for b in bs),
        "backward_per_sample": sum(b.backward for b in bs),
        "batch_shape": batch_shape(cfg),
        "by_role": by_role,
    }
