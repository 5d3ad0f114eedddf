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
  `torch.jit.script`. The backbone (ViT, connector, LM, imu / audio encoders) is
  made of model/layers.py's modules, shared with model/gr00t.py; this file adds
  the DiT action head and the per-embodiment MLPs. Nothing here touches the
  trainer; model/registry.py builds the model (build_model) and holds the only
  policies (`apply_freezing`, `param_role`, `decay_flags`; see their docstrings).
- Mixed dtypes: the forward does no casting of its own; run frozen bf16 weights
  under autocast.
"""

import math
from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .embodiment import CategoryLinear, CategoryMLP
from .layers import (Attention, Connector, GeluMLP, LanguageModel, SeriesEncoder, VisionEncoder, init_weights,
                     pixel_shuffle)


# ---------------------------------------------------------------------------- timestep features

def sinusoid(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal features of a float tensor t (any shape) -> t.shape + (dim,).

    feature[i] = cos(t * w_i) for i < dim/2, sin(t * w_(i-dim/2)) after, with
    w_i = exp(-ln(10000) * i / (dim/2))."""
    half = dim // 2
    exponent = torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / half)
    freqs = torch.exp(exponent)  # (half,)
    args = t.float().unsqueeze(-1) * freqs  # (..., half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


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

    Children (their names are the parameter-name prefixes used by registry.param_role and
    registry.is_trainable): vision, connector, imu_encoder, audio_encoder (None when
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
        init_weights(self, (VisionEncoder, ActionHead))

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
