"""The building blocks shared by the model families (TorchScript-able nn.Modules).

n16.py (N16Model), gr00t.py (the GR00T models) and backbones.py (the exact N1.6 / N1.7
backbones) build on these; this module imports none of them.
- RMSNorm, Attention (biased q/k/v/o, ViT and DiT), GeluMLP;
- the n16 vision tower: VisionBlock, VisionEncoder (SigLIP-2-style ViT), pixel_shuffle and
  Connector (N16Model's and Gr00tModel's backbone; EagleVisionBlock subclasses VisionBlock);
- the Qwen3 language model: RoPE tables (rope_cos_sin, rope_at, apply_rope),
  prompt_attention_mask, LLMAttention, SwiGLU, LLMBlock (also Qwen3VLText's layer), LanguageModel;
- SeriesEncoder (the optional imu / audio encoders of every family);
- init_weights, the families' initialization of these layers.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


# ---------------------------------------------------------------------------- norm, attention, MLP

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


# ---------------------------------------------------------------------------- init

def init_weights(model: nn.Module, pos_embed_owners: Tuple[type, ...] = (VisionEncoder,)) -> None:
    """Normal(0, 0.02) for linear/conv/embedding weights and for the position embedding
    (`pos_embed`) of the modules of a type in pos_embed_owners (VisionEncoder; N16Model adds its
    ActionHead), zero biases, ones for norm weights (norms keep their constructors' init)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, pos_embed_owners):
            nn.init.normal_(m.pos_embed, std=0.02)
