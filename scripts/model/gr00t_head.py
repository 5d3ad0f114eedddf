"""The GR00T N1.6/N1.7 flow-matching action head, exact to upstream (TorchScript-able).

Upstream is NVIDIA's code as shipped in PyPI `lerobot` 0.6.1
(`lerobot/policies/groot/groot_n1_7.py`: GR00TN17ActionHead and its
CategorySpecificMLP / MultiEmbodimentActionEncoder;
`lerobot/policies/groot/action_head/cross_attention_dit.py`: AlternateVLDiT and
SelfAttentionTransformer on diffusers' Attention / FeedForward / Timesteps).
This file is written from a reading of that code; none of it is copied.
test/model/test_gr00t_head.py loads upstream's random-initialised modules, maps
their state dict onto these modules (scripts/gr00t_checkpoint_names.py's table)
and checks forward, loss and gradients against them.

Contract
- `Gr00tHeadConfig`: every shape and training knob of the head; `HEAD_CONFIGS`
  holds "gr00t-n1.7-3b" (lerobot's GR00T_N1_7_DEFAULTS), "gr00t-n1.6-3b", "gr00t-tiny" and
  "gr00t-probe" (2 DiT blocks, no vl_self_attention: for backbone tests at any width).
- `Gr00tHead(cfg)` has two children whose names are the parameter prefixes used
  by registry.param_role: `action_head` (vl_norm, vl_self_attention, timestep
  encoder, position embedding, DiT blocks, output projections) and
  `embodiment` (per-embodiment state encoder, action encoder, action decoder).
- `Gr00tHead.head_loss(vl, vl_mask, image_mask, state, actions, action_mask,
  embodiment_id, t, noise, state_drop, state_noise)` -> {"loss", "num_valid",
  "pred_velocity"}:
    vl            float (B, S, C_backbone)  backbone features (before vlln)
    vl_mask       bool  (B, S)              True = real token (backbone attention mask)
    image_mask    bool  (B, S)              True = image token
    state         float (B, D_s)
    actions       float (B, H, A);  action_mask float (B, H, A), 1 = valid
    embodiment_id int64 (B,)
    t             float (B,)   flow-matching time in [0, 1): noisy = (1-t) noise + t actions
    noise         float (B, H, A)
    state_drop    optional float (B,), 1 = drop this sample's state features;
                  when absent, training mode with state_dropout > 0 draws
                  torch.rand(B) < state_dropout (upstream's draw, same order).
                  A dropped state token is zeroed (N1.7) or, with
                  cfg.state_mask_token (N1.6), replaced by the learned
                  action_head.state_mask_token: s * (1 - d) + mask * d.
                  Isaac-GR00T's N1.6 loss forward draws in eval mode too;
                  this head draws only in training mode.
                  Then, with cfg.state_noise_scale > 0 in training mode (N1.6's
                  state_additive_noise_scale), the state token gets
                  randn_like(state token) * state_noise_scale added (upstream's
                  draw, right after the dropout's, same order).
    state_noise   optional float (B, 1, input_embedding_dim): that draw given
                  (cast to the state token's dtype, used when state_noise_scale
                  > 0, in any mode), so that a trainer can draw both outside a
                  compiled step (scripts/compile_step.py).
  loss = sum(mask * (pred - (actions - noise))^2) / max(sum(mask), 1): the
  project's contract (upstream divides by sum(mask) + 1e-6; the two differ by
  1e-6 / sum(mask) relative).
- Dropout (cfg.dropout) sits where upstream's does: after each attention
  output projection, again on the attention branch (diffusers' final_dropout),
  after the feed-forward's GELU and after its output projection; the
  vl_self_attention blocks have the same four. It draws from torch's default
  generator in the same order as upstream, so a seeded run drops the same
  elements; eval mode (or dropout 0) makes the head deterministic.

Semantics (each line is an upstream behaviour the equivalence test pins):
- vl -> vlln (LayerNorm, affine) -> vl_self_attention (pre-LN self-attention
  blocks, affine LayerNorms, no mask: padded tokens are attended) -> context.
  With `hide_common_pads` (set by a chat-templated backbone, whose pads are
  upstream's left pads: model/prompt.py) the positions that are padding in every
  sample of the batch are not attended: upstream pads its batch only to the
  longest prompt, so each sample sees as many pads as upstream's does.
- t_bucket = long(t * num_timestep_buckets); the DiT's timestep features are
  diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1):
  [cos, sin] of t_bucket * exp(-ln(10000) i / 127), then Linear-SiLU-Linear.
- action encoder: W1 a; [sin, cos] of t_bucket * exp(-i ln(10000) / (D/2)) with
  ln(10000) taken in fp32; W2 on the concatenation, swish, W3.
- action tokens get position_embedding rows 0..H-1 (max_seq_len rows); the
  state token (state encoder output) comes first, none added.
- DiT block i: AdaLN(temb) -> attention -> residual; plain LayerNorm (no
  affine) -> GELU(tanh) feed-forward -> residual. Odd blocks self-attend; even
  blocks cross-attend to the context with keys/values projected straight from
  the backbone width: blocks i % (2 n) == 0 (n = attend_text_every_n_blocks)
  see the non-image tokens (~image_mask & vl_mask), the other even blocks the
  image tokens (image_mask & vl_mask). A sample with no token of a kind gets
  NaN from that block, as upstream does.
- output: LayerNorm (no affine, eps 1e-6) * (1 + scale) + shift, where
  (shift, scale) = proj_out_1(silu(temb)); proj_out_2 -> hidden_size; the
  action decoder runs on every token and the last H are the velocity.
"""

import math
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .embodiment import CategoryLinear, CategoryMLP


# ---------------------------------------------------------------------------- config

@dataclass
class Gr00tHeadConfig:
    name: str = "custom"
    backbone_width: int = 2048         # backbone_embedding_dim: vlln, vl_self_attention, cross-attention K/V input
    hidden_size: int = 1024            # state-encoder hidden, DiT output, action-decoder width
    input_embedding_dim: int = 1536    # DiT width = dit_heads * dit_head_dim
    dit_layers: int = 32
    dit_heads: int = 32
    dit_head_dim: int = 48
    vl_layers: int = 4                 # vl_self_attention blocks (0: none, vlln only)
    vl_heads: int = 32
    vl_head_dim: int = 64              # vl_heads * vl_head_dim must equal backbone_width
    attend_text_every_n_blocks: int = 2
    timestep_dim: int = 256            # diffusers Timesteps channels, fixed upstream
    num_timestep_buckets: int = 1000
    max_seq_len: int = 1024            # rows of the action position embedding
    num_embodiments: int = 32
    max_state_dim: int = 132
    max_action_dim: int = 132
    action_horizon: int = 40
    dropout: float = 0.2               # attention / feed-forward dropout (train mode)
    state_dropout: float = 0.2         # probability of dropping a sample's state features (train mode)
    # N1.6 (Isaac-GR00T's Gr00tN1d6ActionHead): a dropped sample's state token becomes a learned
    # mask token (action_head.state_mask_token, (1, 1, input_embedding_dim), 0.02-normal init; it
    # exists only when state_dropout > 0, as upstream's mask_token). N1.7 (lerobot): zeroed.
    state_mask_token: bool = False
    # N1.6's state_additive_noise_scale: Gaussian noise of this std added to the state token in train mode.
    state_noise_scale: float = 0.0
    noise_s: float = 0.999             # upstream time: t = (1 - Beta(beta_alpha, 1)) * noise_s
    beta_alpha: float = 1.5

    @property
    def dit_width(self) -> int:
        return self.dit_heads * self.dit_head_dim

    def validate(self) -> "Gr00tHeadConfig":
        def need(cond: bool, what: str):
            if not cond:
                raise ValueError(f"gr00t head config '{self.name}': {what}")

        need(self.dit_width == self.input_embedding_dim,
             f"dit_heads * dit_head_dim = {self.dit_width} must equal input_embedding_dim "
             f"({self.input_embedding_dim}) (upstream adds action and state tokens of that width)")
        need(self.vl_layers == 0 or self.vl_heads * self.vl_head_dim == self.backbone_width,
             f"vl_heads * vl_head_dim = {self.vl_heads * self.vl_head_dim} must equal backbone_width "
             f"({self.backbone_width})")
        need(self.input_embedding_dim % 2 == 0, "input_embedding_dim must be even (sinusoidal features)")
        need(self.timestep_dim % 2 == 0 and self.timestep_dim >= 4, "timestep_dim must be even and >= 4")
        need(self.attend_text_every_n_blocks >= 1, "attend_text_every_n_blocks must be >= 1")
        need(1 <= self.action_horizon <= self.max_seq_len,
             f"action_horizon={self.action_horizon} must be in [1, max_seq_len={self.max_seq_len}]")
        need(0.0 <= self.dropout < 1.0 and 0.0 <= self.state_dropout < 1.0, "dropouts must be in [0, 1)")
        need(self.state_noise_scale >= 0.0, f"state_noise_scale={self.state_noise_scale} must be >= 0")
        return self


# gr00t-n1.7-3b: lerobot 0.6.1 GR00T_N1_7_DEFAULTS (diffusion_model_cfg, vl_self_attention_cfg and the
# head fields). gr00t-n1.6-3b: Isaac-GR00T's Gr00tN1d6Config as read in its repository: the same
# DiT, horizon 16, state/action dims 29, no vl_self_attention and no state dropout by default (its
# learned state mask token replaces a dropped state token when state dropout is on). gr00t-tiny: CPU
# tests, widths of n16-tiny's LM (128).
HEAD_CONFIGS: Dict[str, Gr00tHeadConfig] = {
    "gr00t-n1.7-3b": Gr00tHeadConfig(name="gr00t-n1.7-3b"),
    "gr00t-n1.6-3b": Gr00tHeadConfig(name="gr00t-n1.6-3b", vl_layers=0, max_state_dim=29, max_action_dim=29,
                                     action_horizon=16, state_dropout=0.0, state_mask_token=True),
    "gr00t-tiny": Gr00tHeadConfig(name="gr00t-tiny", backbone_width=128, hidden_size=128, input_embedding_dim=128,
                                  dit_layers=4, dit_heads=4, dit_head_dim=32, vl_layers=2, vl_heads=4,
                                  vl_head_dim=32, max_seq_len=64, max_state_dim=64, max_action_dim=64,
                                  action_horizon=16),
    # A small head without vl_self_attention, so it fits any backbone width: the backbone
    # equivalence tests (test/scripts/test_gr00t_backbones.py) put it on full-width backbones.
    "gr00t-probe": Gr00tHeadConfig(name="gr00t-probe", hidden_size=32, input_embedding_dim=32, dit_layers=2,
                                   dit_heads=2, dit_head_dim=16, vl_layers=0, max_seq_len=64),
}


def get_head_config(name: str, **overrides) -> Gr00tHeadConfig:
    if name not in HEAD_CONFIGS:
        raise ValueError(f"unknown gr00t head config '{name}'; choose one of {sorted(HEAD_CONFIGS)}")
    return replace(HEAD_CONFIGS[name], **overrides).validate()


def head_config_for(model_cfg) -> Gr00tHeadConfig:
    """The head of a ModelConfig (config.py) whose gr00t_head names a HEAD_CONFIGS entry: that
    entry with the fields the model config owns taken from it (backbone width = LM width, state /
    action dims, horizon, embodiment slots, timestep buckets, noise_s, Beta alpha, the dropouts
    where gr00t_dropout / gr00t_state_dropout / gr00t_state_noise_scale are >= 0, and N1.6's state
    mask token when the preset or gr00t_state_mask_token asks for it)."""
    preset = HEAD_CONFIGS[model_cfg.gr00t_head] if model_cfg.gr00t_head in HEAD_CONFIGS else None
    if preset is None:
        raise ValueError(f"unknown gr00t head config '{model_cfg.gr00t_head}'; choose one of {sorted(HEAD_CONFIGS)}")
    dropout = model_cfg.gr00t_dropout if model_cfg.gr00t_dropout >= 0 else preset.dropout
    state_dropout = model_cfg.gr00t_state_dropout if model_cfg.gr00t_state_dropout >= 0 else preset.state_dropout
    noise_scale = (model_cfg.gr00t_state_noise_scale if model_cfg.gr00t_state_noise_scale >= 0
                   else preset.state_noise_scale)
    return get_head_config(model_cfg.gr00t_head, backbone_width=model_cfg.llm_width,
                           max_state_dim=model_cfg.max_state_dim, max_action_dim=model_cfg.max_action_dim,
                           action_horizon=model_cfg.action_horizon, num_embodiments=model_cfg.num_embodiments,
                           num_timestep_buckets=model_cfg.num_timestep_buckets, noise_s=model_cfg.noise_s,
                           beta_alpha=model_cfg.beta_alpha, dropout=dropout, state_dropout=state_dropout,
                           state_noise_scale=noise_scale,
                           state_mask_token=preset.state_mask_token or model_cfg.gr00t_state_mask_token)


# ---------------------------------------------------------------------------- sinusoidal features

def diffusers_timestep_features(t_bucket: Tensor, dim: int) -> Tensor:
    """diffusers Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=1) of (B,) -> (B, dim):
    [cos, sin] of t * exp(-ln(10000) * i / (dim/2 - 1)), i < dim/2."""
    half = dim // 2
    exponent = -math.log(10000.0) * torch.arange(0, half, dtype=torch.float32, device=t_bucket.device)
    exponent = exponent / (half - 1)
    args = t_bucket.unsqueeze(1).float() * torch.exp(exponent).unsqueeze(0)    # (B, half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def action_time_features(t_bucket: Tensor, dim: int) -> Tensor:
    """GR00T's action-encoder features of (B, H) -> (B, H, dim): [sin, cos] of
    t * exp(-i * ln(10000) / (dim/2)), the log taken in fp32 as upstream does."""
    half = dim // 2
    # A 0-dim host tensor, as upstream's: an operand on any device without a copy (a host-to-device copy
    # cannot be captured in a CUDA graph).
    log_base = torch.log(torch.tensor(10000.0, dtype=torch.float32))
    exponent = -torch.arange(half, dtype=torch.float32, device=t_bucket.device) * (log_base / half)
    args = t_bucket.float().unsqueeze(-1) * exponent.exp()                       # (B, H, half)
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


# ---------------------------------------------------------------------------- attention blocks

class HeadAttention(nn.Module):
    """diffusers-Attention-shaped multi-head attention: q from x (width dim), k/v
    from the context (width context_dim), biased projections, output projection
    back to dim, dropout on the output. mask: bool (B, M), True = attend."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int, dropout: float):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.q = nn.Linear(dim, inner)
        self.k = nn.Linear(context_dim, inner)
        self.v = nn.Linear(context_dim, inner)
        self.o = nn.Linear(inner, dim)

    def forward(self, x: Tensor, context: Tensor, mask: Optional[Tensor]) -> Tensor:
        B = x.shape[0]
        q = self.q(x).view(B, -1, self.heads, self.head_dim).transpose(1, 2)        # (B, h, N, d)
        k = self.k(context).view(B, -1, self.heads, self.head_dim).transpose(1, 2)  # (B, h, M, d)
        v = self.v(context).view(B, -1, self.heads, self.head_dim).transpose(1, 2)  # (B, h, M, d)
        attn_mask: Optional[Tensor] = None
        if mask is not None:
            attn_mask = mask[:, None, None, :]                                       # (B, 1, 1, M)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)            # (B, h, N, d)
        y = y.transpose(1, 2).reshape(B, -1, self.heads * self.head_dim).to(q.dtype)
        return F.dropout(self.o(y), self.dropout, self.training)


class HeadFeedForward(nn.Module):
    """fc1 -> GELU(tanh) -> dropout -> fc2 -> dropout (diffusers FeedForward, final_dropout)."""

    def __init__(self, dim: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        h = F.dropout(F.gelu(self.fc1(x), approximate="tanh"), self.dropout, self.training)
        return F.dropout(self.fc2(h), self.dropout, self.training)


class AdaNorm(nn.Module):
    """LayerNorm (no affine, eps 1e-5), then * (1 + scale) + shift, (scale, shift) = linear(silu(temb))."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        self.norm = nn.LayerNorm(dim, eps=1e-5, elementwise_affine=False)

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=1)                   # (B, C) each
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class VLSelfAttentionBlock(nn.Module):
    """Pre-LN block of vl_self_attention: x + drop(attn(ln1 x)); x + ff(ln2 x) (affine LayerNorms)."""

    def __init__(self, dim: int, heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = HeadAttention(dim, heads, head_dim, dim, dropout)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.ff = HeadFeedForward(dim, dropout)

    def forward(self, x: Tensor, keys: Optional[Tensor]) -> Tensor:
        h = self.norm1(x)
        x = F.dropout(self.attn(h, h, keys), self.dropout, self.training) + x
        return self.ff(self.norm2(x)) + x


class DiTBlock(nn.Module):
    """AdaLN -> attention (cross to the context when is_cross, else self) -> drop -> residual;
    LayerNorm (no affine) -> feed-forward -> residual."""

    def __init__(self, cfg: Gr00tHeadConfig, is_cross: bool):
        super().__init__()
        w = cfg.dit_width
        self.is_cross = is_cross
        self.dropout = cfg.dropout
        self.norm1 = AdaNorm(w)
        self.attn = HeadAttention(w, cfg.dit_heads, cfg.dit_head_dim, cfg.backbone_width if is_cross else w,
                                  cfg.dropout)
        self.norm2 = nn.LayerNorm(w, eps=1e-5, elementwise_affine=False)
        self.ff = HeadFeedForward(w, cfg.dropout)

    def forward(self, x: Tensor, temb: Tensor, context: Tensor, mask: Tensor) -> Tensor:
        h = self.norm1(x, temb)
        if self.is_cross:
            a = self.attn(h, context, mask)
        else:
            a = self.attn(h, h, None)
        x = F.dropout(a, self.dropout, self.training) + x
        return self.ff(self.norm2(x)) + x


# ---------------------------------------------------------------------------- the DiT side

class TimestepEncoder(nn.Module):
    """t_bucket (B,) -> diffusers Timesteps features -> fc1 -> SiLU -> fc2 -> (B, dit_width)."""

    def __init__(self, cfg: Gr00tHeadConfig):
        super().__init__()
        self.dim = cfg.timestep_dim
        self.fc1 = nn.Linear(cfg.timestep_dim, cfg.dit_width)
        self.fc2 = nn.Linear(cfg.dit_width, cfg.dit_width)

    def forward(self, t_bucket: Tensor) -> Tensor:
        feats = diffusers_timestep_features(t_bucket, self.dim).to(self.fc1.weight.dtype)
        return self.fc2(F.silu(self.fc1(feats)))


class Gr00tActionHead(nn.Module):
    """vlln + vl_self_attention + AlternateVLDiT + output modulation (see the module docstring)."""

    def __init__(self, cfg: Gr00tHeadConfig):
        super().__init__()
        w = cfg.dit_width
        self.text_period = 2 * cfg.attend_text_every_n_blocks
        self.vl_norm = nn.LayerNorm(cfg.backbone_width, eps=1e-5)
        self.vl_self_attention = nn.ModuleList(
            [VLSelfAttentionBlock(cfg.backbone_width, cfg.vl_heads, cfg.vl_head_dim, cfg.dropout)
             for _ in range(cfg.vl_layers)])
        self.timestep_encoder = TimestepEncoder(cfg)
        self.pos_embed = nn.Parameter(torch.empty(cfg.max_seq_len, w))     # (max_seq_len, w)
        nn.init.normal_(self.pos_embed, mean=0.0, std=0.02)
        self.blocks = nn.ModuleList([DiTBlock(cfg, i % 2 == 0) for i in range(cfg.dit_layers)])
        # N1.6's learned state mask token (1, 1, w); None otherwise (upstream has none then either)
        has_mask = cfg.state_mask_token and cfg.state_dropout > 0
        self.state_mask_token = nn.Parameter(0.02 * torch.randn(1, 1, w)) if has_mask else None
        self.norm_out = nn.LayerNorm(w, eps=1e-6, elementwise_affine=False)
        self.proj_out_1 = nn.Linear(w, 2 * w)
        self.proj_out_2 = nn.Linear(w, cfg.hidden_size)

    def encode_context(self, vl: Tensor, keys: Optional[Tensor]) -> Tensor:
        """(B, S, C_backbone) -> vlln -> vl_self_attention -> (B, S, C_backbone); keys (B, S) bool
        or None (all)."""
        x = self.vl_norm(vl)
        for blk in self.vl_self_attention:
            x = blk(x, keys)
        return x.contiguous()

    def forward(self, context: Tensor, vl_mask: Tensor, image_mask: Tensor, tokens: Tensor,
                t_bucket: Tensor) -> Tensor:
        """context (B, S, C) from encode_context, tokens (B, 1+H, w) = [state ; actions + pos]
        -> (B, 1+H, hidden_size)."""
        temb = self.timestep_encoder(t_bucket)                                 # (B, w)
        image_keys = image_mask & vl_mask                                      # (B, S)
        text_keys = (~image_mask) & vl_mask                                    # (B, S)
        x = tokens.contiguous()
        i = 0
        for blk in self.blocks:
            mask = text_keys if i % self.text_period == 0 else image_keys
            x = blk(x, temb, context, mask)
            i += 1
        shift, scale = self.proj_out_1(F.silu(temb)).chunk(2, dim=1)          # (B, w) each
        x = self.norm_out(x) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out_2(x)


# ---------------------------------------------------------------------------- embodiment MLPs

# CategoryLinear and CategoryMLP: model/embodiment.py (shared with n16.py).


class ActionEncoder(nn.Module):
    """Noisy actions (B, H, A) + t_bucket (B,) -> (B, H, w): w3(swish(w2([w1 a ; [sin, cos](t)])))."""

    def __init__(self, cfg: Gr00tHeadConfig):
        super().__init__()
        w = cfg.input_embedding_dim
        self.width = w
        self.w1 = CategoryLinear(cfg.num_embodiments, cfg.max_action_dim, w)
        self.w2 = CategoryLinear(cfg.num_embodiments, 2 * w, w)
        self.w3 = CategoryLinear(cfg.num_embodiments, w, w)

    def forward(self, actions: Tensor, t_bucket: Tensor, ids: Tensor) -> Tensor:
        H = actions.shape[1]
        a = self.w1(actions, ids)                                              # (B, H, w)
        tau = action_time_features(t_bucket.unsqueeze(1).expand(-1, H), self.width).to(a.dtype)
        x = self.w2(torch.cat([a, tau], dim=-1), ids)
        return self.w3(x * torch.sigmoid(x), ids)


class Gr00tEmbodiment(nn.Module):
    """The per-embodiment MLPs (no forward of its own)."""

    def __init__(self, cfg: Gr00tHeadConfig):
        super().__init__()
        E = cfg.num_embodiments
        self.state_encoder = CategoryMLP(E, cfg.max_state_dim, cfg.hidden_size, cfg.input_embedding_dim)
        self.action_encoder = ActionEncoder(cfg)
        self.action_decoder = CategoryMLP(E, cfg.hidden_size, cfg.hidden_size, cfg.max_action_dim)


# ---------------------------------------------------------------------------- head + loss

class Gr00tHead(nn.Module):
    """action_head + embodiment and the flow-matching loss (see the module docstring)."""

    def __init__(self, cfg: Gr00tHeadConfig):
        super().__init__()
        cfg.validate()
        self.num_buckets = float(cfg.num_timestep_buckets)
        self.state_dropout = cfg.state_dropout
        self.state_noise_scale = cfg.state_noise_scale
        self.max_seq_len = cfg.max_seq_len
        # True for a chat-templated backbone (model/gr00t.py): vl_self_attention sees only the pads
        # upstream's batch has, see head_loss
        self.hide_common_pads = False
        self.action_head = Gr00tActionHead(cfg)
        self.embodiment = Gr00tEmbodiment(cfg)

    def head_loss(self, vl: Tensor, vl_mask: Tensor, image_mask: Tensor, state: Tensor, actions: Tensor,
                  action_mask: Tensor, embodiment_id: Tensor, t: Tensor, noise: Tensor,
                  state_drop: Optional[Tensor], state_noise: Optional[Tensor]) -> Dict[str, Tensor]:
        B, H = actions.shape[0], actions.shape[1]
        if H > self.max_seq_len:
            raise RuntimeError("actions horizon exceeds the head's max_seq_len (position embedding rows)")
        ids = embodiment_id.to(torch.long)
        head = self.action_head
        emb = self.embodiment
        keys: Optional[Tensor] = None
        if self.hide_common_pads:
            # upstream pads its batch to the longest prompt; the positions that are padding in every
            # sample are beyond it, so vl_self_attention does not see them
            keys = vl_mask.to(torch.bool).any(dim=0, keepdim=True).expand(B, vl_mask.shape[1])
        context = head.encode_context(vl, keys)                                # (B, S, C)
        state_tok = emb.state_encoder(state.view(B, 1, -1), ids)                # (B, 1, w)
        drop: Optional[Tensor] = state_drop
        if drop is None and self.training and self.state_dropout > 0:
            drop = (torch.rand(B, device=state_tok.device) < self.state_dropout).to(state_tok.dtype)
        if drop is not None:
            d = drop.to(state_tok.dtype)[:, None, None]                         # (B, 1, 1)
            mask_token = head.state_mask_token
            if mask_token is not None:   # N1.6: the dropped state token is the learned mask token
                state_tok = state_tok * (1 - d) + mask_token * d
            else:                        # N1.7: zeroed
                state_tok = state_tok * (1 - d)
        noise_in: Optional[Tensor] = state_noise
        if noise_in is None and self.training and self.state_noise_scale > 0:
            noise_in = torch.randn_like(state_tok)
        if noise_in is not None and self.state_noise_scale > 0:  # N1.6's additive state noise
            state_tok = state_tok + noise_in.to(state_tok.dtype) * self.state_noise_scale

        t3 = t.to(actions.dtype)[:, None, None]                                # (B, 1, 1)
        noisy = (1 - t3) * noise + t3 * actions                                 # (B, H, A)
        velocity = actions - noise
        t_bucket = (t3[:, 0, 0] * self.num_buckets).to(torch.long)              # (B,)
        action_tok = emb.action_encoder(noisy, t_bucket, ids)                   # (B, H, w)
        action_tok = action_tok + head.pos_embed[:H].unsqueeze(0)
        tokens = torch.cat([state_tok, action_tok], dim=1)                      # (B, 1+H, w)
        out = head(context, vl_mask.to(torch.bool), image_mask.to(torch.bool), tokens, t_bucket)
        pred = emb.action_decoder(out, ids)[:, -H:]                             # (B, H, A)

        mask = action_mask.to(pred.dtype)
        num_valid = mask.sum()
        loss = (((pred - velocity.to(pred.dtype)) ** 2) * mask).sum() / torch.clamp(num_valid, min=1.0)
        return {"loss": loss, "num_valid": num_valid, "pred_velocity": pred}

    def forward(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The head alone on precomputed backbone features: batch keys vl, vl_mask,
        image_mask, state, actions, action_mask, embodiment_id, fm_t, fm_noise
        [, state_drop, state_noise]."""
        state_drop, state_noise = head_draws(batch)
        return self.head_loss(batch["vl"], batch["vl_mask"], batch["image_mask"], batch["state"],
                              batch["actions"], batch["action_mask"], batch["embodiment_id"],
                              batch["fm_t"], batch["fm_noise"], state_drop, state_noise)


def head_draws(batch: Dict[str, Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The batch's state_drop and state_noise (None where absent: the head then draws them)."""
    state_drop: Optional[Tensor] = None
    state_noise: Optional[Tensor] = None
    if "state_drop" in batch:
        state_drop = batch["state_drop"]
    if "state_noise" in batch:
        state_noise = batch["state_noise"]
    return state_drop, state_noise


def build_head(cfg: Gr00tHeadConfig, device: Optional[torch.device] = None) -> Gr00tHead:
    """Gr00tHead; device=torch.device("meta") builds without memory."""
    if device is None:
        return Gr00tHead(cfg)
    with device:
        return Gr00tHead(cfg)


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__: List[str] = [
    "Gr00tHeadConfig", "HEAD_CONFIGS", "get_head_config", "Gr00tHead", "Gr00tActionHead", "Gr00tEmbodiment",
    "build_head", "head_config_for", "head_draws", "param_count", "diffusers_timestep_features", "action_time_features",
]
