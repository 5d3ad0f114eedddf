"""N1.6-style vision-language-action model (TorchScript-able nn.Modules).

Contract
- `N16Model(cfg).forward(batch: Dict[str, Tensor]) -> Dict[str, Tensor]` returns
  "loss" (scalar: masked MSE of the flow-matching velocity, averaged over valid
  action elements), "num_valid" (scalar float: the number of valid elements the
  loss was averaged over) and "pred_velocity" (B, H, A).
- Batch keys (A = max_action_dim = 64, D_s = max_state_dim = 64):
    images        float (B, V, 3, IMG, IMG)  already normalized
    text_tokens   int64 (B, L)               tokenizer.py ids
    text_mask     bool  (B, L)               True = real token, on a prefix of each row
                                             (text padded at the end: the LM runs causal
                                             attention without a key mask, LanguageModel)
    state         float (B, D_s)
    actions       float (B, H, A)
    action_mask   float (B, H, A)            1 = valid element
    embodiment_id int64 (B,)                 in [0, num_embodiments)
    fm_t          float (B,)      optional   flow-matching time; sampled if absent
    fm_noise      float (B, H, A) optional   flow-matching noise; randn if absent
    imu           float (B, T_imu, C_imu)    required iff cfg.use_imu
    audio         float (B, T_aud, F_aud)    required iff cfg.use_audio
- Data flow: ViT -> 2x2 pixel shuffle -> connector -> [vision ; imu ; audio ;
  text] -> Qwen3-style LM (no head) -> VL tokens -> DiT over [state ; actions]
  (even blocks cross-attend to VL tokens, odd blocks self-attend) ->
  per-embodiment action decoder -> predicted velocity.
- Every module is constructible on the meta device and scriptable with
  `torch.jit.script`. Nothing here touches the trainer; `apply_freezing`,
  `param_role` and `decay_flags` are the only policies (see their docstrings).
- Mixed dtypes: the forward does no casting of its own; run frozen bf16 weights
  under autocast.
"""

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .embodiment import CategoryLinear, CategoryMLP


# ---------------------------------------------------------------------------- shared pieces

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # (C,)

    def forward(self, x: Tensor) -> Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight with float32 statistics, in x's dtype: on CUDA
        # ATen's fused kernels (_fused_rms_norm and its backward) instead of a chain of
        # element-wise ones (docs/benchmarks.md, 2026-12-01, fast layer forms).
        return F.rms_norm(x, [x.shape[-1]], self.weight.to(x.dtype), self.eps)


def sinusoid(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal features of a float tensor t (any shape) -> t.shape + (dim,).

    feature[i] = cos(t * w_i) for i < dim/2, sin(t * w_(i-dim/2)) after, with
    w_i = exp(-ln(10000) * i / (dim/2))."""
    half = dim // 2
    exponent = torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / half)
    freqs = torch.exp(exponent)  # (half,)
    args = t.float().unsqueeze(-1) * freqs  # (..., half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Attention(nn.Module):
    """Multi-head attention with biased q/k/v/o projections (ViT and DiT).

    x (B, N, C) attends to context (B, M, C); mask is a bool tensor broadcastable
    to (B, heads, N, M), True = attend."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(self, x: Tensor, context: Tensor, mask: Optional[Tensor]) -> Tensor:
        B, N, C = x.shape
        M = context.shape[1]
        q = self.q(x).view(B, N, self.heads, self.head_dim).transpose(1, 2)        # (B, h, N, d)
        k = self.k(context).view(B, M, self.heads, self.head_dim).transpose(1, 2)  # (B, h, M, d)
        v = self.v(context).view(B, M, self.heads, self.head_dim).transpose(1, 2)  # (B, h, M, d)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)               # (B, h, N, d)
        return self.o(y.transpose(1, 2).reshape(B, N, C))


class GeluMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


# ---------------------------------------------------------------------------- vision

class VisionBlock(nn.Module):
    """Pre-LN ViT block: x + attn(ln1(x)); x + mlp(ln2(x))."""

    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = GeluMLP(dim, ffn)

    def forward(self, x: Tensor) -> Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, None)
        return x + self.mlp(self.ln2(x))


class VisionEncoder(nn.Module):
    """SigLIP-2-style ViT: images (N, 3, IMG, IMG) -> patch features (N, P, C_vit)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, cfg.vit_width, cfg.patch_size, stride=cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.patches_per_view, cfg.vit_width))  # (P, C)
        self.blocks = nn.ModuleList(
            [VisionBlock(cfg.vit_width, cfg.vit_heads, cfg.vit_ffn) for _ in range(cfg.vit_layers)])
        self.post_norm = nn.LayerNorm(cfg.vit_width, eps=1e-6)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patch_embed(images)             # (N, C, g, g)
        x = x.flatten(2).transpose(1, 2)         # (N, P, C)
        x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.post_norm(x)


def pixel_shuffle(x: Tensor, s: int) -> Tensor:
    """Merge s x s neighbouring patches: (N, g*g, C) -> (N, (g/s)^2, s*s*C)."""
    N, P, C = x.shape
    g = int(math.sqrt(P))
    x = x.reshape(N, g // s, s, g // s, s, C)   # (N, gy, sy, gx, sx, C)
    x = x.permute(0, 1, 3, 2, 4, 5)             # (N, gy, gx, sy, sx, C)
    return x.reshape(N, (g // s) * (g // s), s * s * C)


class Connector(nn.Module):
    """2-layer MLP from pixel-shuffled ViT features to the LM width."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        dim_in = cfg.vit_width * cfg.pixel_shuffle ** 2
        self.norm = nn.LayerNorm(dim_in)
        self.fc1 = nn.Linear(dim_in, cfg.llm_width)
        self.fc2 = nn.Linear(cfg.llm_width, cfg.llm_width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


# ---------------------------------------------------------------------------- language model

def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device) -> Tuple[Tensor, Tensor]:
    """RoPE tables for positions 0..seq_len-1 (fp32): cos, sin of shape (S, head_dim)."""
    idx = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
    inv_freq = 1.0 / torch.pow(torch.full_like(idx, theta), idx / head_dim)    # (d/2,)
    pos = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0)                            # (S, d/2)
    emb = torch.cat([freqs, freqs], dim=-1)                                     # (S, d)
    return torch.cos(emb), torch.sin(emb)


def rope_at(pos: Tensor, head_dim: int, theta: float) -> Tuple[Tensor, Tensor]:
    """RoPE tables (fp32) for per-sample positions pos (B, S): cos, sin of shape (B, 1, S, head_dim),
    the numbers rope_cos_sin gives for the same positions."""
    idx = torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device)
    inv_freq = 1.0 / torch.pow(torch.full_like(idx, theta), idx / head_dim)    # (d/2,)
    freqs = pos.float().unsqueeze(-1) * inv_freq                                # (B, S, d/2)
    emb = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)                        # (B, 1, S, d)
    return torch.cos(emb), torch.sin(emb)


def prompt_attention_mask(key_mask: Tensor, pad_rows: bool, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """key_mask (B, S) -> (causal mask over the real keys (B, 1, S, S), row weights). pad_rows: the
    queries at key_mask False are upstream's left pads, whose every key is masked: such a query keeps
    its own key (so that no attention row is empty on any kernel) and its row weight (B, S, 1) is 0,
    which zeroes its attention output as torch's attention gives upstream's; else the weight is 1."""
    S = key_mask.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=key_mask.device).tril()
    mask = causal[None, None] & key_mask[:, None, None, :]                       # (B, 1, S, S)
    row_valid = torch.ones(1, dtype=dtype, device=key_mask.device)
    if pad_rows:
        eye = torch.eye(S, dtype=torch.bool, device=key_mask.device)
        mask = mask | (eye[None, None] & ~key_mask[:, None, :, None])
        row_valid = key_mask.to(dtype)[:, :, None]                               # (B, S, 1)
    return mask, row_valid


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, h, S, d): rotate-half RoPE as in Qwen3, in float32. (Negation and the cast
    commute exactly, so rotating the float32 copy gives Qwen3's bits with one cast fewer.)"""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class LLMAttention(nn.Module):
    """Qwen3 attention: GQA, per-head RMSNorm on q and k before RoPE, no biases."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.llm_heads
        self.kv_heads = cfg.llm_kv_heads
        self.head_dim = cfg.llm_head_dim
        self.q_proj = nn.Linear(cfg.llm_width, cfg.llm_heads * cfg.llm_head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.llm_width, cfg.llm_kv_heads * cfg.llm_head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.llm_width, cfg.llm_kv_heads * cfg.llm_head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.llm_heads * cfg.llm_head_dim, cfg.llm_width, bias=False)
        self.q_norm = RMSNorm(cfg.llm_head_dim, cfg.rms_eps)
        self.k_norm = RMSNorm(cfg.llm_head_dim, cfg.rms_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor]) -> Tensor:
        """mask: None = causal attention (flash attention, GQA without repeated K/V; see
        LanguageModel for when that is exact), else a bool mask (B, 1, S, S), True = attend."""
        B, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, S, self.heads, self.head_dim)).transpose(1, 2)     # (B, hq, S, d)
        k = self.k_norm(self.k_proj(x).view(B, S, self.kv_heads, self.head_dim)).transpose(1, 2)  # (B, hkv, S, d)
        v = self.v_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)               # (B, hkv, S, d)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, hq, S, d)
        else:
            rep = self.heads // self.kv_heads
            k = torch.repeat_interleave(k, rep, dim=1)                              # (B, hq, S, d)
            v = torch.repeat_interleave(v, rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)             # (B, hq, S, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LLMBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.llm_width, cfg.rms_eps)
        self.attn = LLMAttention(cfg)
        self.post_attn_norm = RMSNorm(cfg.llm_width, cfg.rms_eps)
        self.mlp = SwiGLU(cfg.llm_width, cfg.llm_ffn)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor]) -> Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin, mask)
        return x + self.mlp(self.post_attn_norm(x))

    def forward_rows(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, row_valid: Tensor) -> Tensor:
        """forward with each row's attention output weighted by row_valid (prompt_attention_mask)."""
        x = x + self.attn(self.input_norm(x), cos, sin, mask) * row_valid
        return x + self.mlp(self.post_attn_norm(x))


class LanguageModel(nn.Module):
    """Qwen3-style causal decoder without LM head.

    forward(prefix (B, S0, C), text_tokens (B, L), key_mask (B, S0+L) bool or None)
    -> hidden states after the final norm (B, S0+L, C). Positions are 0..S-1.
    forward_at(x (B, S, C) embedded, pos (B, S), key_mask (B, S)) -> the same at the given
    positions, the queries at key_mask False being upstream's left pads (a chat-templated
    prompt: prompt_attention_mask).
    key_mask hides padded text positions as keys (queries at padded positions
    still produce values, which downstream masks ignore). key_mask=None runs
    plain causal attention (flash attention, no dense mask): for text padded at
    the end (batch.py's contract: text_mask is True on a prefix of each row)
    every real position sees exactly the keys key_mask would let it see, so
    their hidden states, and everything computed from them, are the same; only
    the ignored values at padded positions differ. The exact GR00T backbones pass
    their key mask, so that those match upstream's too (test_gr00t_backbones.py)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.llm_head_dim
        self.rope_theta = cfg.rope_theta
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.llm_width)
        self.layers = nn.ModuleList([LLMBlock(cfg) for _ in range(cfg.llm_layers)])
        self.norm = RMSNorm(cfg.llm_width, cfg.rms_eps)

    def forward(self, prefix: Tensor, text_tokens: Tensor, key_mask: Optional[Tensor]) -> Tensor:
        text = self.embed_tokens(text_tokens).to(prefix.dtype)      # (B, L, C)
        x = torch.cat([prefix, text], dim=1)                        # (B, S, C)
        S = x.shape[1]
        cos, sin = rope_cos_sin(S, self.head_dim, self.rope_theta, x.device)
        mask: Optional[Tensor] = None
        if key_mask is not None:
            causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()     # (S, S)
            mask = causal.unsqueeze(0).unsqueeze(0) & key_mask[:, None, None, :]    # (B, 1, S, S)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)

    def forward_at(self, x: Tensor, pos: Tensor, key_mask: Tensor) -> Tensor:
        cos, sin = rope_at(pos, self.head_dim, self.rope_theta)
        mask, row_valid = prompt_attention_mask(key_mask, True, x.dtype)
        for layer in self.layers:
            x = layer.forward_rows(x, cos, sin, mask, row_valid)
        return self.norm(x)


# ---------------------------------------------------------------------------- imu / audio

class SeriesEncoder(nn.Module):
    """Time series (B, T, C_in) -> (B, n_tokens, C_out): two 1-D convs (the second
    with stride 2), GELU, adaptive average pooling to n_tokens, linear to C_out."""

    def __init__(self, in_channels: int, hidden: int, n_tokens: int, out_dim: int):
        super().__init__()
        self.n_tokens = n_tokens
        self.conv1 = nn.Conv1d(in_channels, hidden, 3, padding=1)
        self.conv2 = nn.Conv1d(hidden, hidden, 3, stride=2, padding=1)
        self.proj = nn.Linear(hidden, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.conv1(x.transpose(1, 2)))         # (B, hid, T)
        h = F.gelu(self.conv2(h))                         # (B, hid, ceil(T/2))
        h = F.adaptive_avg_pool1d(h, self.n_tokens)       # (B, hid, n)
        return self.proj(h.transpose(1, 2))               # (B, n, C_out)


# ---------------------------------------------------------------------------- embodiment MLPs

# CategoryLinear, CategoryMLP: model/embodiment.py (shared with gr00t_head.py).


class ActionEncoder(nn.Module):
    """Noisy actions + timestep -> DiT tokens (GR00T's MultiEmbodimentActionEncoder):
    W1 a -> w; concat sinusoid(timestep, w) -> 2w; W2 (swish); W3 -> w."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        w = cfg.dit_width
        self.width = w
        self.w1 = CategoryLinear(cfg.num_embodiments, cfg.max_action_dim, w)
        self.w2 = CategoryLinear(cfg.num_embodiments, 2 * w, w)
        self.w3 = CategoryLinear(cfg.num_embodiments, w, w)

    def forward(self, actions: Tensor, timestep: Tensor, ids: Tensor) -> Tensor:
        B, H, _ = actions.shape
        a = self.w1(actions, ids)                                              # (B, H, w)
        tau = sinusoid(timestep.unsqueeze(1).expand(B, H), self.width).to(a.dtype)  # (B, H, w)
        x = F.silu(self.w2(torch.cat([a, tau], dim=-1), ids))                  # (B, H, w)
        return self.w3(x, ids)


class Embodiment(nn.Module):
    """Container of the three per-embodiment MLPs (no forward of its own)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, h = cfg.num_embodiments, cfg.embodiment_hidden
        self.state_encoder = CategoryMLP(E, cfg.max_state_dim, h, cfg.dit_width)
        self.action_encoder = ActionEncoder(cfg)
        self.action_decoder = CategoryMLP(E, h, h, cfg.max_action_dim)


# ---------------------------------------------------------------------------- action head (DiT)

class TimestepEncoder(nn.Module):
    """timestep ids (B,) -> sinusoid(timestep_dim) -> Linear -> SiLU -> Linear -> (B, w)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dim = cfg.timestep_dim
        self.fc1 = nn.Linear(cfg.timestep_dim, cfg.dit_width)
        self.fc2 = nn.Linear(cfg.dit_width, cfg.dit_width)

    def forward(self, timestep: Tensor) -> Tensor:
        return self.fc2(F.silu(self.fc1(sinusoid(timestep, self.dim).to(self.fc1.weight.dtype))))


class AdaLayerNorm(nn.Module):
    """LayerNorm without affine, then x * (1 + scale) + shift from the timestep embedding.

    forward(x, temb_act): temb_act = silu(temb) (B, C), computed once by ActionHead for
    every block (the same value each block would compute from temb)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5, elementwise_affine=False)
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: Tensor, temb_act: Tensor) -> Tensor:
        scale, shift = self.linear(temb_act).chunk(2, dim=-1)         # (B, C) each
        return self.norm(x) * (1.0 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """x + attn(adaln1(x)) [cross to VL tokens if is_cross, else self]; x + ff(adaln2(x))."""

    def __init__(self, dim: int, heads: int, ffn: int, is_cross: bool):
        super().__init__()
        self.is_cross = is_cross
        self.norm1 = AdaLayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = AdaLayerNorm(dim)
        self.ff = GeluMLP(dim, ffn)

    def forward(self, x: Tensor, temb_act: Tensor, vl: Tensor, vl_mask: Tensor) -> Tensor:
        """temb_act = silu(timestep embedding) (B, w), see AdaLayerNorm."""
        h = self.norm1(x, temb_act)
        if self.is_cross:
            x = x + self.attn(h, vl, vl_mask)
        else:
            x = x + self.attn(h, h, None)
        return x + self.ff(self.norm2(x, temb_act))


class ActionHead(nn.Module):
    """DiT over [state token ; H action tokens] conditioned on VL tokens and timestep.

    forward(vl (B, S, C_llm), vl_mask (B, S), state_tok (B, 1, w), action_tok
    (B, H, w), timestep (B,)) -> features of the action tokens (B, H, hidden)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        w = cfg.dit_width
        self.vl_norm = nn.LayerNorm(cfg.llm_width)
        self.vl_proj = nn.Linear(cfg.llm_width, w)
        self.timestep_encoder = TimestepEncoder(cfg)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.max_action_horizon, w))   # (H_max, w)
        self.blocks = nn.ModuleList(
            [DiTBlock(w, cfg.dit_heads, cfg.dit_ffn, i % 2 == 0) for i in range(cfg.dit_layers)])
        self.norm_out = nn.LayerNorm(w, eps=1e-6, elementwise_affine=False)
        self.proj_out_1 = nn.Linear(w, 2 * w)
        self.proj_out_2 = nn.Linear(w, cfg.embodiment_hidden)

    def forward(self, vl: Tensor, vl_mask: Tensor, state_tok: Tensor, action_tok: Tensor,
                timestep: Tensor) -> Tensor:
        H = action_tok.shape[1]
        ctx = self.vl_proj(self.vl_norm(vl))                                  # (B, S, w)
        mask = vl_mask[:, None, None, :]                                      # (B, 1, 1, S)
        temb_act = F.silu(self.timestep_encoder(timestep))                    # (B, w), once for every AdaLN
        x = torch.cat([state_tok, action_tok + self.pos_embed[:H]], dim=1)    # (B, 1+H, w)
        for blk in self.blocks:
            x = blk(x, temb_act, ctx, mask)
        shift, scale = self.proj_out_1(temb_act).chunk(2, dim=-1)            # (B, w) each
        x = self.norm_out(x[:, 1:]) * (1.0 + scale.unsqueeze(1)) + shift.unsqueeze(1)  # (B, H, w)
        return self.proj_out_2(x)


# ---------------------------------------------------------------------------- the model

class N16Model(nn.Module):
    """The whole policy; see the module docstring for the batch and result contract.

    Children (their names are the parameter-name prefixes used by param_role and
    is_trainable): vision, connector, imu_encoder, audio_encoder (None when
    disabled), llm, action_head, embodiment."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.pixel_shuffle = cfg.pixel_shuffle
        self.max_action_horizon = cfg.max_action_horizon
        self.num_buckets = float(cfg.num_timestep_buckets)
        self.noise_s = cfg.noise_s
        self.beta_alpha = cfg.beta_alpha

        self.vision = VisionEncoder(cfg)
        self.connector = Connector(cfg)
        # None when disabled: TorchScript compiles the `is not None` branches away.
        self.imu_encoder = (SeriesEncoder(cfg.imu_channels, cfg.series_hidden, cfg.imu_tokens, cfg.llm_width)
                            if cfg.use_imu else None)
        self.audio_encoder = (SeriesEncoder(cfg.audio_features, cfg.series_hidden, cfg.audio_tokens, cfg.llm_width)
                              if cfg.use_audio else None)
        self.llm = LanguageModel(cfg)
        self.action_head = ActionHead(cfg)
        self.embodiment = Embodiment(cfg)
        init_weights(self)

    def encode_vl(self, batch: Dict[str, Tensor]) -> Tuple[Tensor, Tensor]:
        """-> VL tokens (B, S, C_llm) and their key mask (B, S) bool."""
        images = batch["images"]                                       # (B, V, 3, IMG, IMG)
        B, V = images.shape[0], images.shape[1]
        feats = self.vision(images.flatten(0, 1))                      # (B*V, P, C_vit)
        tokens = self.connector(pixel_shuffle(feats, self.pixel_shuffle))  # (B*V, T, C)
        parts = [tokens.reshape(B, V * tokens.shape[1], tokens.shape[2])]  # (B, V*T, C)

        imu_encoder = self.imu_encoder
        if imu_encoder is not None:
            if "imu" not in batch:
                raise RuntimeError("batch has no 'imu' but the model was exported with use_imu=true; "
                                   "add an imu tensor (B, T_imu, C_imu) or export with --set use_imu=false")
            parts.append(imu_encoder(batch["imu"]).to(parts[0].dtype))
        audio_encoder = self.audio_encoder
        if audio_encoder is not None:
            if "audio" not in batch:
                raise RuntimeError("batch has no 'audio' but the model was exported with use_audio=true; "
                                   "add an audio tensor (B, T_audio, F_audio) or export with --set use_audio=false")
            parts.append(audio_encoder(batch["audio"]).to(parts[0].dtype))

        prefix = torch.cat(parts, dim=1)                               # (B, S0, C)
        text_mask = batch["text_mask"].to(torch.bool)                  # (B, L)
        prefix_mask = torch.ones(B, prefix.shape[1], dtype=torch.bool, device=prefix.device)
        key_mask = torch.cat([prefix_mask, text_mask], dim=1)          # (B, S)
        vl = self.llm(prefix, batch["text_tokens"], None)              # (B, S, C); causal: text is right-padded
        return vl, key_mask

    def forward(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        actions = batch["actions"]                                     # (B, H, A)
        B, H = actions.shape[0], actions.shape[1]
        if H > self.max_action_horizon:
            raise RuntimeError("actions horizon exceeds max_action_horizon of the model config; "
                               "export with a larger --set max_action_horizon=N")
        ids = batch["embodiment_id"].to(torch.long)                    # (B,)

        # Flow matching: t ~ (s - Beta(alpha, 1)) / s unless given; noisy path and velocity target.
        if "fm_t" in batch:
            t = batch["fm_t"].to(actions.dtype)                        # (B,)
        else:
            u = torch.rand([B], dtype=actions.dtype, device=actions.device)
            t = (self.noise_s - u.pow(1.0 / self.beta_alpha)) / self.noise_s
        if "fm_noise" in batch:
            noise = batch["fm_noise"].to(actions.dtype)                # (B, H, A)
        else:
            noise = torch.randn_like(actions)
        t3 = t.view(B, 1, 1)
        noisy = (1.0 - t3) * noise + t3 * actions                      # (B, H, A)
        target = actions - noise                                       # (B, H, A)
        timestep = torch.floor(t * self.num_buckets)                   # (B,) integer-valued float

        vl, vl_mask = self.encode_vl(batch)                            # (B, S, C), (B, S)
        emb = self.embodiment
        state_tok = emb.state_encoder(batch["state"].unsqueeze(1), ids)    # (B, 1, w)
        action_tok = emb.action_encoder(noisy, timestep, ids)              # (B, H, w)
        feats = self.action_head(vl, vl_mask, state_tok, action_tok, timestep)  # (B, H, hid)
        pred = emb.action_decoder(feats, ids)                              # (B, H, A)

        mask = batch["action_mask"].to(pred.dtype)                     # (B, H, A)
        num_valid = mask.sum()
        loss = (((pred - target.to(pred.dtype)) ** 2) * mask).sum() / torch.clamp(num_valid, min=1.0)
        return {"loss": loss, "num_valid": num_valid, "pred_velocity": pred}


# ---------------------------------------------------------------------------- init, roles, freezing

def init_weights(model: nn.Module) -> None:
    """Normal(0, 0.02) for linear/conv/embedding weights and position embeddings,
    zero biases, ones for norm weights (norms keep their constructors' init)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (VisionEncoder, ActionHead)):
            nn.init.normal_(m.pos_embed, std=0.02)


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


def build_model(cfg: ModelConfig, device: Optional[torch.device] = None) -> nn.Module:
    """N16Model (or, when cfg.gr00t_head is set, model/gr00t.py's model for cfg.backbone: same children names,
    batch and result) with freezing applied; device=torch.device("meta") builds without memory."""
    cls = N16Model
    if cfg.gr00t_head:
        from .gr00t import gr00t_model_class  # gr00t.py imports this module
        cls = gr00t_model_class(cfg)
    if device is None:
        model = cls(cfg)
    else:
        with device:
            model = cls(cfg)
    if cfg.category_linear == "grouped":
        from .embodiment import group_category_linears
        group_category_linears(model)
    apply_freezing(model, cfg)
    return model
