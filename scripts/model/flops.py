"""Analytic FLOPs per sample of an N16Model (or a GR00T model of model/gr00t.py: the n16,
N1.6 Eagle or N1.7 Qwen3-VL backbone's ops, then the upstream-exact head's), forward and
backward, from its config.

Contract
- `flops_per_sample(cfg) -> {"forward_per_sample", "backward_per_sample",
  "batch_shape", "by_role", "by_text_len"}` for the config's default batch shape
  (num_views, action_horizon, max_text_len, imu/audio tokens when enabled), and
  by_text_len[l] = [forward, backward] with the text slot cut to l tokens (DMF).
  Used for MFU.
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
import dataclasses
from typing import Dict, List

from .config import ModelConfig
from .gr00t_head import head_config_for
from .registry import is_trainable


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

    # ---- vision: per view P patches, T tokens after the pixel shuffle / spatial merge
    C = cfg.llm_width
    if cfg.backbone == "qwen3vl":
        vision_up, deep_up = _qwen3vl_vision_ops(g, cfg)
    else:
        vision_up, deep_up = _vit_ops(g, cfg), []

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
        # a trainable layer's input RMSNorm weight needs the q/k/v input gradient even with nothing upstream
        qkv_up = g.weight(b, "llm", mm(S, C, hq * d) + 2 * mm(S, C, hkv * d), up or tr, tr)
        att_up = g.attention(b, "llm", 2 * hq * mm(S, d, S), qkv_up)
        up = g.weight(b, "llm", mm(S, hq * d, C), att_up, tr)
        up = g.weight(b, "llm", 2 * mm(S, C, fl), up, tr)                          # gate, up
        up = g.weight(b, "llm", mm(S, fl, C), up, tr)                              # down
        if i < len(deep_up) and i < cfg.llm_layers - 1:                            # deepstack added after layer i
            up = up or deep_up[i]
    if cfg.gr00t_head:
        _gr00t_head_ops(g, cfg, S)
        return g.ops
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


def _vit_ops(g: Graph, cfg: ModelConfig) -> bool:
    """n16's ViT + connector, or N1.6's SigLIP-2 + mlp1 ("eagle"); returns `up` of the image tokens."""
    V, P, T, w, f = cfg.num_views, cfg.patches_per_view, cfg.tokens_per_view, cfg.vit_width, cfg.vit_ffn
    tv = cfg.tune_visual
    up = g.weight("vision.patch_embed", "vision", V * mm(P, 3 * cfg.patch_size ** 2, w), False, tv)
    for i in range(cfg.vit_layers):
        b = f"vision.blocks.{i}"
        qkv_up = g.weight(b, "vision", V * mm(P, w, 3 * w), up, tv)
        # scores + values; N1.6's windowed layers compute them over the whole image too, under a mask
        att_up = g.attention(b, "vision", V * 2 * mm(P, w, P), qkv_up)
        up = g.weight(b, "vision", V * mm(P, w, w), att_up, tv)                   # o
        up = g.mlp(b, "vision", [V * mm(P, w, f), V * mm(P, f, w)], up, tv)
    C, s2 = cfg.llm_width, cfg.pixel_shuffle ** 2
    if cfg.backbone == "eagle":  # mlp1 belongs to vision and trains with it (its LayerNorm affine too)
        return g.mlp("vision.mlp1", "vision", [V * mm(T, s2 * w, C), V * mm(T, C, C)], up or tv, tv)
    # The connector's LayerNorm has a trainable affine, so fc1's input needs a gradient.
    return g.mlp("connector", "vision", [V * mm(T, s2 * w, C), V * mm(T, C, C)], True, True)


def _qwen3vl_vision_ops(g: Graph, cfg: ModelConfig):
    """N1.7's Qwen3-VL ViT: patch convolution (one frame, the summed temporal weight), blocks, the
    merger and the deepstack mergers. Returns (`up` of the merged tokens, [`up` of each deepstack
    feature]); a deepstack feature the LM never adds (after its last layer) gets no backward."""
    V, P, T, w, f = cfg.num_views, cfg.patches_per_view, cfg.tokens_per_view, cfg.vit_width, cfg.vit_ffn
    tv, C, m4 = cfg.tune_visual, cfg.llm_width, cfg.vit_width * cfg.pixel_shuffle ** 2
    deep = [int(x) for x in cfg.deepstack_layers.split(",") if x.strip()]
    up = g.weight("vision.patch_embed", "vision", V * mm(P, 3 * cfg.patch_size ** 2, w), False, tv)
    deep_up = []
    for i in range(cfg.vit_layers):
        b = f"vision.blocks.{i}"
        qkv_up = g.weight(b, "vision", V * mm(P, w, 3 * w), up, tv)
        att_up = g.attention(b, "vision", V * 2 * mm(P, w, P), qkv_up)
        up = g.weight(b, "vision", V * mm(P, w, w), att_up, tv)                   # proj
        up = g.mlp(b, "vision", [V * mm(P, w, f), V * mm(P, f, w)], up, tv)
        if i in deep:
            j = len(deep_up)
            used = j < cfg.llm_layers - 1
            deep_up.append(g.mlp(f"vision.deepstack_mergers.{j}", "vision", [V * mm(T, m4, m4), V * mm(T, m4, C)],
                                 (up or tv) and used, tv and used))
    return g.mlp("vision.merger", "vision", [V * mm(T, m4, m4), V * mm(T, m4, C)], up or tv, tv), deep_up


def _gr00t_head_ops(g: Graph, cfg: ModelConfig, S: int) -> None:
    """The upstream-exact head of model/gr00t_head.py over S VL tokens (every op trains)."""
    h = head_config_for(cfg)
    H, A, Ds = cfg.action_horizon, cfg.max_action_dim, cfg.max_state_dim
    C, w, hid, N = h.backbone_width, h.dit_width, h.hidden_size, 1 + cfg.action_horizon
    # vl_self_attention: vlln's trainable affine precedes it, so its input needs a gradient regardless.
    for i in range(h.vl_layers):
        b = f"action_head.vl_self_attention.{i}"
        g.weight(b, "action", 3 * mm(S, C, C), True, True)                     # q, k, v
        g.attention(b, "action", 2 * mm(S, C, S), True)                         # scores + values
        g.mlp(b, "action", [mm(S, C, C), mm(S, C, 4 * C), mm(S, 4 * C, C)], True, True)  # o, FF
    temb_up = g.mlp("action_head.timestep_encoder", "action",
                    [mm(1, h.timestep_dim, w), mm(1, w, w)], False, True)
    g.mlp("embodiment.state_encoder", "embodiment", [mm(1, Ds, hid), mm(1, hid, w)], False, True)
    g.mlp("embodiment.action_encoder", "embodiment", [mm(H, A, w), mm(H, 2 * w, w), mm(H, w, w)], False, True)
    for i in range(h.dit_layers):
        b = f"action_head.blocks.{i}"
        g.weight(b, "action", mm(1, w, 2 * w), temb_up, True)                  # AdaLN before attention only
        if i % 2 == 0:   # cross-attention: q on N tokens, k/v from the backbone width on all S tokens
            g.weight(b, "action", mm(N, w, w), True, True)
            g.weight(b, "action", 2 * mm(S, C, w), True, True)
            g.attention(b, "action", 2 * mm(N, w, S), True)
        else:
            g.weight(b, "action", 3 * mm(N, w, w), True, True)
            g.attention(b, "action", 2 * mm(N, w, N), True)
        g.mlp(b, "action", [mm(N, w, w), mm(N, w, 4 * w), mm(N, 4 * w, w)], True, True)  # o, FF
    g.weight("action_head.proj_out", "action", mm(1, w, 2 * w), temb_up, True)
    g.weight("action_head.proj_out", "action", mm(N, w, hid), True, True)      # every token, as upstream
    g.mlp("embodiment.action_decoder", "embodiment", [mm(N, hid, hid), mm(N, hid, A)], True, True)


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
        # [forward, backward] per sample with the text slot cut to l tokens, l = 0 .. max_text_len (l = 0
        # counted as 1: a batch keeps one text column); DMF's steps count their FLOPs by it
        "by_text_len": [[sum(b.forward for b in t), sum(b.backward for b in t)]
                        for t in (ops(dataclasses.replace(cfg, max_text_len=max(1, l)))
                                  for l in range(cfg.max_text_len + 1))],
    }
