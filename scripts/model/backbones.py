"""The GR00T N1.6 and N1.7 vision-language backbones, exact to upstream (TorchScript-able).

Written from a reading of the upstream code; none of it is copied:
- N1.6 (Isaac-GR00T `EagleBackbone` on Eagle-Block2A-2B-v2, `Eagle3_VLForConditionalGeneration`):
  a SigLIP-2 ViT (transformers `Siglip2VisionModel` semantics at one fixed square image size,
  plus Eagle-Block2A-2B-v2's own windowed attention and 2-D rotary embedding, EagleVision),
  Eagle's pixel unshuffle (`F.pixel_unshuffle`, channel-major) and its `mlp1` projector
  (LayerNorm, Linear, exact GELU, Linear), then a Qwen3 LM truncated to `select_layer` layers
  whose features are `hidden_states[-1]` (after the final RMSNorm in the transformers 4.x
  Isaac-GR00T runs on): layers.py's LanguageModel, which is Qwen3's decoder.
- N1.7 (lerobot 0.6.1 `Qwen3Backbone` on Cosmos-Reason2-2B = Qwen3-VL-2B; transformers
  `Qwen3VLModel`): the Qwen3-VL ViT (Conv3d patch embedding over 2 identical frames, learned
  48 x 48 position grid bilinearly interpolated to the patch grid, 2-D rotary attention, 2 x 2
  spatial-merge patch merger and deepstack mergers at the deepstack layers) and the Qwen3-VL
  text decoder with interleaved multimodal RoPE, deepstack features added to the image tokens
  after the first decoder layers; the features are the last kept layer's output before the
  final norm (lerobot's `_last_decoder_layer_output`), so this LM has no final norm, and a
  deepstack feature due after that last layer (only when select_layer <= the number of
  deepstack layers) does not reach the features, upstream as here.

Contract
- `EagleVision(cfg)(images (N, 3, IMG, IMG)) -> (N, T, C_llm)` image tokens (T = tokens_per_view);
  `eagle_windows(grid, window)` its windows' patches.
- `Qwen3VLVision(cfg)(images) -> (tokens (N, T, C_llm), deepstack [(N, T, C_llm)] * len(deepstack))`.
- `Qwen3VLText(cfg)(x (B, S, C) input embeddings, image_blocks ((start, length) runs of the image
  tokens' positions), key_mask (B, S), pos (3, B, S), deepstack [(B, N_img, C)], pad_rows)` -> features
  (B, S, C): causal attention over the real keys (key_mask); the deepstack features are added
  at those positions (`add_at_blocks`). pad_rows=True (a chat-templated prompt, model/prompt.py): the queries at
  key_mask False are upstream's left pads, whose every key is masked, and get a zero attention
  output, as torch's attention gives upstream's. `embed(ids)` is the token table.
  `mrope_positions(...)` computes `pos` for the sequence
  [V views x T image tokens ; extra tokens ; L text tokens] as upstream's get_rope_index does for
  images each in its own group (t = start, h = start + row, w = start + column of the merged
  grid, the next group starting at start + max(rows, columns)); padded text gets 0.
- Input the trainer cannot supply (Qwen3-VL's pixel patches, grid_thw, position ids,
  cu_seqlens) is computed here from the fixed image size: every view is one image of
  image_size x image_size, already normalized.
- Parameter names: see scripts/convert_gr00t_checkpoint.py (layouts "n1.6" and "n1.7").
"""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .layers import LLMBlock, VisionBlock, prompt_attention_mask


def int_list(text: str) -> List[int]:
    """"5,11,17" -> [5, 11, 17]; "" -> []."""
    return [int(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------------- N1.6: Eagle

class EagleProjector(nn.Module):
    """Eagle's mlp1: LayerNorm(4 C_vit) -> Linear -> GELU (exact) -> Linear -> C_llm."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim_in, eps=1e-5)
        self.fc1 = nn.Linear(dim_in, dim_out)
        self.fc2 = nn.Linear(dim_out, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


def rope_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, N, h, d) rotated in float32 as d/2 complex numbers (x[2j], x[2j+1]) times the unit
    complex table cos + i sin (N, d/2): upstream's one complex product, written in real arithmetic
    (re = a cos - b sin, im = a sin + b cos, each product rounded, as ATen's complex product on the
    CPU does), so a compiled step fuses it instead of calling ATen's complex kernels (1.6 ms per
    gr00t-n1.6-3b step on an H100, docs/benchmarks.md session 51); back in x's dtype."""
    B, N, H, D = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    pairs = x.float().reshape(B, N, H, D // 2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(B, N, H, D).to(x.dtype)


class EagleVisionBlock(VisionBlock):
    """A SigLIP-2 block of Eagle-Block2A-2B-v2 (VisionBlock's parameters): attention restricted by
    `mask` (its windows) when `windowed`, q and k rotated by the 2-D table when `rotary`."""

    def forward(self, x: Tensor, mask: Tensor, windowed: bool, cos: Tensor, sin: Tensor,  # type: ignore[override]
                rotary: bool) -> Tensor:
        a = self.attn
        h = self.ln1(x)
        B, N, C = h.shape
        q = a.q(h).view(B, N, a.heads, a.head_dim)
        k = a.k(h).view(B, N, a.heads, a.head_dim)
        v = a.v(h).view(B, N, a.heads, a.head_dim).transpose(1, 2)
        if rotary:
            q, k = rope_pairs(q, cos, sin), rope_pairs(k, cos, sin)
        m: Optional[Tensor] = None
        if windowed:
            m = mask
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v, attn_mask=m)   # (B, h, N, d)
        x = x + a.o(y.transpose(1, 2).reshape(B, N, C))
        return x + self.mlp(self.ln2(x))


def eagle_windows(grid: int, window: int) -> List[List[int]]:
    """The patches (raster indexes of a grid x grid image) of each window, windows row by row,
    edge windows cropped to the image (Eagle's split_patch_embeddings_to_windows_with_meta)."""
    out: List[List[int]] = []
    for r0 in range(0, grid, window):
        for c0 in range(0, grid, window):
            out.append([r * grid + c for r in range(r0, min(r0 + window, grid)) for c in range(c0, min(c0 + window, grid))])
    return out


class EagleVision(nn.Module):
    """SigLIP-2 ViT + pixel unshuffle + mlp1 (N1.6). images (N, 3, IMG, IMG) -> (N, T, C_llm).

    SigLIP-2 (naflex) embeds patches with a Linear over each patch's pixels in (row, column,
    channel) order and adds its learned pos_grid x pos_grid position table resized to the
    patch grid (bilinear, antialias, align_corners False: the identity when the sizes agree).
    Eagle-Block2A-2B-v2's SigLIP-2 (Isaac-GR00T modeling_siglip2.py) adds, per config:
    - windows (vit_window): a layer not in vit_full_layers attends only inside its window of
      vit_window x vit_window patches (windows row by row from the top left, cropped at the
      image's edges); upstream packs the windows into flash attention's varlen segments, here
      the tokens stay in raster order under a same-window mask (attention is order-free);
    - a 2-D rotary embedding (vit_rope_base): in every layer q and k, as head_dim / 2 complex
      pairs, are turned by angle column * f_j for pair 2j and row * f_j for pair 2j + 1,
      f_j = theta^(-4 j / head_dim), at the patch's position in the image, in float32."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        p, w = cfg.patch_size, cfg.vit_width
        self.patch = p
        self.grid = cfg.image_size // p
        self.pos_grid = cfg.vit_pos_grid
        self.shuffle = cfg.pixel_shuffle
        self.width = w
        self.patch_embed = nn.Linear(3 * p * p, w)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.vit_pos_grid * cfg.vit_pos_grid, w))  # (G*G, w)
        self.blocks = nn.ModuleList([EagleVisionBlock(w, cfg.vit_heads, cfg.vit_ffn) for _ in range(cfg.vit_layers)])
        self.post_norm = nn.LayerNorm(w, eps=1e-6)
        self.mlp1 = EagleProjector(w * cfg.pixel_shuffle ** 2, cfg.llm_width)
        g, P = self.grid, self.grid * self.grid
        # windows: a same-window mask, used by the layers outside vit_full_layers (none when one
        # window covers the image); buffers, not saved (derived from the config)
        full = {int(i) for i in cfg.vit_full_layers.split(",") if i.strip()}
        split = 0 < cfg.vit_window < g
        self.layer_windowed: List[bool] = [split and i not in full for i in range(cfg.vit_layers)]
        wid = torch.zeros(P, dtype=torch.long)
        for n, members in enumerate(eagle_windows(g, cfg.vit_window if split else g)):
            wid[torch.tensor(members)] = n
        self.register_buffer("window_mask", wid[:, None] == wid[None, :], persistent=False)   # (P, P)
        self.rotary = cfg.vit_rope_base > 0
        d = w // cfg.vit_heads
        if self.rotary:
            freqs = 1.0 / (cfg.vit_rope_base ** (torch.arange(0, d, 4)[: d // 4].float() / d))      # (d/4,)
            rows = torch.arange(g).repeat_interleave(g).float()
            cols = torch.arange(g).repeat(g).float()
            angles = torch.stack([torch.outer(cols, freqs), torch.outer(rows, freqs)], dim=-1).reshape(P, d // 2)
        else:
            angles = torch.zeros(P, d // 2)
        cis = torch.polar(torch.ones_like(angles), angles)  # upstream's table: its parts, bit for bit
        self.register_buffer("rope_cos", cis.real.contiguous(), persistent=False)  # (P, d/2)
        self.register_buffer("rope_sin", cis.imag.contiguous(), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        N, g, p, w, G = images.shape[0], self.grid, self.patch, self.width, self.pos_grid
        x = images.reshape(N, 3, g, p, g, p).permute(0, 2, 4, 3, 5, 1).reshape(N, g * g, p * p * 3)
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype))             # (N, P, w)
        table = self.pos_embed.reshape(G, G, w).permute(2, 0, 1).unsqueeze(0)  # (1, w, G, G)
        pos = F.interpolate(table.float(), size=[g, g], mode="bilinear", align_corners=False, antialias=True)
        x = x + pos.reshape(w, g * g).transpose(0, 1).to(x.dtype)            # (N, P, w)
        i = 0
        for blk in self.blocks:
            x = blk(x, self.window_mask, self.layer_windowed[i], self.rope_cos, self.rope_sin, self.rotary)
            i += 1
        x = self.post_norm(x)
        # Eagle's pixel_shuffle_back: (N, w, g, g) -> pixel_unshuffle -> (N, (g/s)^2, w*s*s), channel-major
        x = F.pixel_unshuffle(x.transpose(1, 2).reshape(N, w, g, g), self.shuffle)
        return self.mlp1(x.flatten(2).transpose(1, 2))


# ---------------------------------------------------------------------------- N1.7: Qwen3-VL vision

class PatchEmbed3d(nn.Module):
    """Qwen3-VL's Conv3d patch embedding, weight (w, 3, t, p, p). A still image is t identical
    frames, so the 3-D convolution equals a 2-D one with the weight summed over time."""

    def __init__(self, width: int, temporal: int, patch: int):
        super().__init__()
        self.patch = patch
        self.weight = nn.Parameter(torch.zeros(width, 3, temporal, patch, patch))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, images: Tensor) -> Tensor:
        return F.conv2d(images.to(self.weight.dtype), self.weight.sum(2), self.bias, stride=self.patch)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Qwen3VLVisionBlock(nn.Module):
    """x + proj(attn(rope(qkv(norm1 x)))); x + fc2(gelu_tanh(fc1(norm2 x))). Full attention per image."""

    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        N, P, C = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(N, P, 3, self.heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]                     # (N, P, h, d)
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(x.dtype)        # cos, sin: (P, 1, d)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(x.dtype)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(y.transpose(1, 2).reshape(N, P, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class PatchMerger(nn.Module):
    """2 x 2 merge: LayerNorm (before the merge, or after it when post_norm) -> fc1 -> GELU -> fc2."""

    def __init__(self, dim: int, merge: int, out_dim: int, post_norm: bool):
        super().__init__()
        self.merged = dim * merge * merge
        self.post_norm = post_norm
        self.norm = nn.LayerNorm(self.merged if post_norm else dim, eps=1e-6)
        self.fc1 = nn.Linear(self.merged, self.merged)
        self.fc2 = nn.Linear(self.merged, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        N = x.shape[0]
        if self.post_norm:
            x = self.norm(x.reshape(N, -1, self.merged))
        else:
            x = self.norm(x).reshape(N, -1, self.merged)
        return self.fc2(F.gelu(self.fc1(x)))


class Qwen3VLVision(nn.Module):
    """Qwen3-VL ViT (N1.7). images (N, 3, IMG, IMG) -> (merged tokens (N, T, C_llm), deepstack list).

    Patches are ordered as Qwen3-VL's processor orders them: by 2 x 2 merge window (window row,
    window column, row in window, column in window), so the merger's reshape groups a window."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        w, m = cfg.vit_width, cfg.pixel_shuffle
        self.grid = cfg.image_size // cfg.patch_size
        self.pos_grid = cfg.vit_pos_grid
        self.merge = m
        self.width = w
        self.head_dim = w // cfg.vit_heads
        self.rope_theta = cfg.vit_rope_theta
        self.deepstack_layers: List[int] = int_list(cfg.deepstack_layers)
        self.patch_embed = PatchEmbed3d(w, cfg.vit_temporal_patch, cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.vit_pos_grid * cfg.vit_pos_grid, w))  # (G*G, w)
        self.blocks = nn.ModuleList([Qwen3VLVisionBlock(w, cfg.vit_heads, cfg.vit_ffn) for _ in range(cfg.vit_layers)])
        self.merger = PatchMerger(w, m, cfg.llm_width, False)
        self.deepstack_mergers = nn.ModuleList([PatchMerger(w, m, cfg.llm_width, True) for _ in self.deepstack_layers])

    def window_order(self, x: Tensor) -> Tensor:
        """(..., g, g, C) in raster order -> (..., g*g, C) in merge-window order."""
        g, m = self.grid, self.merge
        lead = list(x.shape[:-3])
        x = x.reshape(lead + [g // m, m, g // m, m, x.shape[-1]])
        n = len(lead)
        perm = list(range(n)) + [n, n + 2, n + 1, n + 3, n + 4]
        return x.permute(perm).reshape(lead + [g * g, x.shape[-1]])

    def position_table(self) -> Tensor:
        """The learned G x G table bilinearly interpolated onto the g x g patch grid, as upstream's
        fast_pos_embed_interpolate does (linspace corners, floor/ceil neighbours) -> (g*g, w)."""
        g, G = self.grid, self.pos_grid
        dev = self.pos_embed.device
        idx = torch.linspace(0, G - 1, g, device=dev)                             # (g,)
        lo = idx.to(torch.int64)
        hi = torch.clamp(lo + 1, max=G - 1)
        frac = idx - lo
        rows = [lo * G, hi * G]
        cols = [lo, hi]
        wr = [1 - frac, frac]
        out = torch.zeros(g * g, self.width, dtype=self.pos_embed.dtype, device=dev)
        for a in range(2):
            for b in range(2):
                index = (rows[a][:, None] + cols[b][None, :]).flatten()
                weight = (wr[a][:, None] * wr[b][None, :]).flatten().to(self.pos_embed.dtype)
                out = out + self.pos_embed[index] * weight[:, None]
        return out

    def rotary(self, device: torch.device) -> Tuple[Tensor, Tensor]:
        """2-D rotary cos/sin per patch in window order -> (P, 1, head_dim) each."""
        g = self.grid
        dim = self.head_dim // 2
        inv_freq = 1.0 / torch.pow(self.rope_theta, torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
        freqs = torch.outer(torch.arange(g, dtype=torch.float32, device=device), inv_freq)     # (g, dim/2)
        row = freqs[:, None, :].expand(g, g, freqs.shape[1])
        col = freqs[None, :, :].expand(g, g, freqs.shape[1])
        emb = self.window_order(torch.cat([row, col], dim=-1))                 # (P, dim)
        emb = torch.cat([emb, emb], dim=-1)                                    # (P, head_dim)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    def forward(self, images: Tensor) -> Tuple[Tensor, List[Tensor]]:
        N = images.shape[0]
        x = self.patch_embed(images)                                           # (N, w, g, g)
        x = self.window_order(x.permute(0, 2, 3, 1))                           # (N, P, w)
        x = x + self.window_order(self.position_table().reshape(self.grid, self.grid, self.width))
        cos, sin = self.rotary(x.device)
        kept: List[Tensor] = []
        i = 0
        for blk in self.blocks:
            x = blk(x, cos, sin)
            if i in self.deepstack_layers:
                kept.append(x)
            i += 1
        deep: List[Tensor] = []
        j = 0
        for merger in self.deepstack_mergers:
            deep.append(merger(kept[j]))
            j += 1
        return self.merger(x), deep


# ---------------------------------------------------------------------------- N1.7: Qwen3-VL text

class Qwen3VLText(nn.Module):
    """Qwen3-VL text decoder (no LM head, no final norm: features are the last layer's output)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.llm_head_dim
        self.rope_theta = cfg.rope_theta
        section = int_list(cfg.mrope_section)
        # Interleaved MRoPE: frequency j takes the height position if j % 3 == 1 and j < 3 * section[1],
        # the width position if j % 3 == 2 and j < 3 * section[2], else the temporal one.
        sel = [0] * (cfg.llm_head_dim // 2)
        for j in range(len(sel)):
            if j % 3 == 1 and j < 3 * section[1]:
                sel[j] = 1
            elif j % 3 == 2 and j < 3 * section[2]:
                sel[j] = 2
        # A buffer, so it is on the model's device: a tensor made from a list in forward is copied from the
        # host, which a CUDA graph cannot capture.
        self.register_buffer("mrope_select", torch.tensor(sel, dtype=torch.long), persistent=False)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.llm_width)
        self.layers = nn.ModuleList([LLMBlock(cfg) for _ in range(cfg.llm_layers)])

    def rope(self, pos: Tensor) -> Tuple[Tensor, Tensor]:
        """pos (3, B, S) -> cos, sin (B, 1, S, head_dim) (fp32)."""
        d = self.head_dim
        exps = torch.arange(0, d, 2, dtype=torch.int64, device=pos.device).float() / d
        inv_freq = 1.0 / torch.pow(self.rope_theta, exps)                        # (d/2,)
        freqs = pos.float()[..., None] * inv_freq                                # (3, B, S, d/2)
        sel = self.mrope_select
        f = torch.where(sel == 1, freqs[1], torch.where(sel == 2, freqs[2], freqs[0]))  # (B, S, d/2)
        emb = torch.cat([f, f], dim=-1)[:, None]                                 # (B, 1, S, d)
        return emb.cos(), emb.sin()

    def embed(self, ids: Tensor) -> Tensor:
        return self.embed_tokens(ids)

    def forward(self, x: Tensor, image_blocks: List[Tuple[int, int]], key_mask: Tensor, pos: Tensor,
                deepstack: List[Tensor], pad_rows: bool) -> Tensor:
        cos, sin = self.rope(pos)
        mask, row_valid = prompt_attention_mask(key_mask, pad_rows, x.dtype)
        i = 0
        n = len(self.layers)
        for layer in self.layers:
            if pad_rows:
                x = layer.forward_rows(x, cos, sin, mask, row_valid)
            else:
                x = layer(x, cos, sin, mask)
            # upstream reads the last kept layer's output before a deepstack addition would follow it
            if i < len(deepstack) and i < n - 1:
                x = add_at_blocks(x, image_blocks, deepstack[i].to(x.dtype))
            i += 1
        return x


def add_at_blocks(x: Tensor, blocks: List[Tuple[int, int]], src: Tensor) -> Tensor:
    """x (B, S, C) with src (B, N, C) added at the positions of `blocks` ((start, length) runs along S, in
    order, their lengths summing to N): what x.index_add(1, positions, src) gives, written with slices.
    index_add is no op of AOTInductor's C shim: a compiled package ran it through the proxy executor, which
    failed at run time on its alpha argument (torch 2.11, gr00t-n1.7-3b on an H100, 2026-12-06); slices
    and an add are fused like any elementwise op, and their backward is a slice, not a scatter."""
    pieces: List[Tensor] = []
    at = 0
    taken = 0
    for block in blocks:
        start, n = block
        if start > at:
            pieces.append(x[:, at:start])
        pieces.append(x[:, start:start + n] + src[:, taken:taken + n])
        at = start + n
        taken += n
    if at < x.shape[1]:
        pieces.append(x[:, at:])
    return torch.cat(pieces, dim=1)


def index_blocks(index: List[int]) -> List[Tuple[int, int]]:
    """Ascending positions -> their (start, length) runs: [0, 1, 2, 7, 8] -> [(0, 3), (7, 2)]."""
    blocks: List[Tuple[int, int]] = []
    for i in index:
        if blocks and blocks[-1][0] + blocks[-1][1] == i:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + 1)
        else:
            blocks.append((i, 1))
    return blocks


def mrope_positions(num_views: int, grid: int, n_extra: int, text_mask: Tensor) -> Tensor:
    """(3, B, S) positions of [num_views x grid^2 image tokens ; n_extra tokens ; text] (see the
    module docstring); grid = merged tokens per image side."""
    B, L = text_mask.shape[0], text_mask.shape[1]
    dev = text_mask.device
    r = torch.arange(grid, device=dev)
    parts: List[Tensor] = []
    start = 0
    for _ in range(num_views):
        t = torch.full([grid * grid], start, dtype=torch.int64, device=dev)
        h = (start + r).repeat_interleave(grid)
        w = (start + r).repeat(grid)
        parts.append(torch.stack([t, h, w]))
        start += grid
    if n_extra > 0:
        parts.append((start + torch.arange(n_extra, device=dev)).unsqueeze(0).expand(3, n_extra))
        start += n_extra
    prefix = torch.cat(parts, dim=1)                                              # (3, S0)
    valid = text_mask.to(torch.int64)
    text = torch.where(text_mask, start + torch.cumsum(valid, dim=1) - 1, torch.zeros_like(valid))  # (B, L)
    return torch.cat([prefix.unsqueeze(1).expand(3, B, prefix.shape[1]), text.unsqueeze(0).expand(3, B, L)], dim=2)


def init_backbone(module: nn.Module) -> None:
    """Normal(0, 0.02) for the position tables and the 3-D patch weight (the Linear, Conv and
    Embedding layers get layers.init_weights)."""
    for m in module.modules():
        if isinstance(m, (EagleVision, Qwen3VLVision)):
            nn.init.normal_(m.pos_embed, std=0.02)
        if isinstance(m, PatchEmbed3d):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)


__all__ = ["EagleVision", "Qwen3VLVision", "Qwen3VLText", "mrope_positions", "init_backbone", "int_list"]
