"""GR00T-named models: a backbone + the upstream-exact action head of gr00t_head.py
(TorchScript-able).

Contract
- Built by registry.build_model when `ModelConfig.gr00t_head` names a
  gr00t_head.HEAD_CONFIGS entry; `gr00t_model_class(cfg)` picks the class by
  `cfg.backbone`:
    "n16"     Gr00tModel         N16Model's backbone (model/layers.py; gr00t-tiny; not upstream's)
    "eagle"   Gr00tEagleModel    GR00T N1.6's exact backbone (model/backbones.py)
    "qwen3vl" Gr00tQwen3VLModel  GR00T N1.7's exact backbone (model/backbones.py)
  Same batch keys and result as N16Model (model/batch.py, "loss", "num_valid",
  "pred_velocity"); children vision, [connector,] imu_encoder, audio_encoder,
  llm, action_head, embodiment, so registry.param_role, is_trainable,
  apply_freezing and decay_flags apply unchanged. The exact backbones keep
  upstream's projector inside `vision` (N1.6 `vision.mlp1`, N1.7
  `vision.merger` and `vision.deepstack_mergers`), so tune_visual freezes it
  as upstream's tune_visual does.
- Sequence: [the image tokens of every view ; imu ; audio ; text], or for
  "qwen3vl" and "eagle" with cfg.chat_template_ids upstream's chat-templated
  prompt (model/prompt.py: the template's tokens, each view's image tokens in
  its slot, the text, in the order upstream's processor builds it - N1.7 the
  images first, N1.6 the text first; its pads are upstream's left pads, and
  the head's vl_self_attention sees as many of them as upstream's batch has:
  gr00t_head.py hide_common_pads). Positions: N1.7's multimodal RoPE
  (get_rope_index); N1.6's Qwen3 counts its tokens one by one from its first
  real token (upstream counts from its first left pad, a shift per sample that
  rotary attention does not see).
- image_mask: the vision tokens of every view; the imu/audio tokens and the
  text count as non-image tokens (upstream has none of the former).
- What is exact to upstream: everything after the backbone features (see
  gr00t_head.py) and, for "eagle" / "qwen3vl", the backbone on that sequence
  (model/backbones.py). Not: the flow-matching time the trainers draw
  (docs/training-semantics.md s3 draws (s - Beta)/s; upstream N1.6/N1.7 draw
  (1 - Beta) * s; these models sample upstream's form only when the batch
  has no fm_t).
- In training mode the head's dropout and state dropout draw from torch's
  default generator (gr00t_head.py); eval mode is deterministic. The batch
  may carry the state dropout and state noise draws (the optional keys
  state_drop (B,) and state_noise (B, 1, w) of model/batch.py); the head then
  uses them instead of drawing.
"""

from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .backbones import EagleVision, Qwen3VLText, Qwen3VLVision, index_blocks, init_backbone, mrope_positions
from .config import ModelConfig
from .gr00t_head import Gr00tHead, Gr00tHeadConfig, head_config_for, head_draws
from .layers import Connector, LanguageModel, SeriesEncoder, VisionEncoder, init_weights, pixel_shuffle
from .prompt import PromptLayout, parse_ids


class Gr00tModel(Gr00tHead):
    """The n16 backbone + Gr00tHead (its action_head and embodiment children and head_loss)."""

    prompt_image_blocks: List[Tuple[int, int]]  # (start, length) runs of prompt_image_index; empty without a template

    def __init__(self, cfg: ModelConfig):
        cfg.validate()
        super().__init__(head_config_for(cfg))
        self.pixel_shuffle = cfg.pixel_shuffle
        self.beta_alpha = cfg.beta_alpha
        self.noise_s = cfg.noise_s
        self.vision = VisionEncoder(cfg)
        self.connector = Connector(cfg)
        self.imu_encoder = (SeriesEncoder(cfg.imu_channels, cfg.series_hidden, cfg.imu_tokens, cfg.llm_width)
                            if cfg.use_imu else None)
        self.audio_encoder = (SeriesEncoder(cfg.audio_features, cfg.series_hidden, cfg.audio_tokens, cfg.llm_width)
                              if cfg.use_audio else None)
        self.llm = LanguageModel(cfg)
        # The backbone gets layers.init_weights; the head keeps upstream's (PyTorch defaults, 0.02-normal
        # category weights and position embedding).
        for child in (self.vision, self.connector, self.imu_encoder, self.audio_encoder, self.llm):
            if child is not None:
                init_weights(child)

    def series_tokens(self, batch: Dict[str, Tensor], parts: List[Tensor]) -> List[Tensor]:
        """Appends the imu / audio tokens (when the model has those encoders) to parts."""
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
        return parts

    def masks(self, batch: Dict[str, Tensor], prefix: Tensor, n_image: int) -> Tuple[Tensor, Tensor]:
        """-> key mask (B, S) (prefix tokens valid, text by text_mask) and image mask (B, S)."""
        B = prefix.shape[0]
        text_mask = batch["text_mask"].to(torch.bool)                  # (B, L)
        prefix_mask = torch.ones(B, prefix.shape[1], dtype=torch.bool, device=prefix.device)
        key_mask = torch.cat([prefix_mask, text_mask], dim=1)          # (B, S)
        image_mask = torch.zeros_like(key_mask)
        image_mask[:, :n_image].fill_(True)  # not `= True`: TorchScript copies that from a host tensor
        return key_mask, image_mask

    def encode_vl(self, batch: Dict[str, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """-> VL tokens (B, S, C_llm), their key mask (B, S) and image mask (B, S), both bool."""
        images = batch["images"]                                       # (B, V, 3, IMG, IMG)
        B, V = images.shape[0], images.shape[1]
        feats = self.vision(images.flatten(0, 1))                      # (B*V, P, C_vit)
        tokens = self.connector(pixel_shuffle(feats, self.pixel_shuffle))  # (B*V, T, C)
        parts = [tokens.reshape(B, V * tokens.shape[1], tokens.shape[2])]  # (B, V*T, C)
        n_image = parts[0].shape[1]
        parts = self.series_tokens(batch, parts)
        prefix = torch.cat(parts, dim=1)                               # (B, S0, C)
        key_mask, image_mask = self.masks(batch, prefix, n_image)
        vl = self.llm(prefix, batch["text_tokens"], key_mask)          # (B, S, C)
        return vl, key_mask, image_mask

    def register_prompt(self, cfg: ModelConfig, merged_grid: int) -> PromptLayout:
        """The chat-templated prompt's buffers (model/prompt.py; not saved: derived from the config):
        the template's ids before and after the text slot (the pad id where an image goes) and the
        image tokens' positions."""
        lay = PromptLayout(parse_ids(cfg.chat_template_ids), cfg.tokens_per_view, merged_grid, cfg.max_text_len)
        self.templated = bool(cfg.chat_template_ids)
        self.hide_common_pads = self.templated
        self.pad_token_id = cfg.pad_token_id
        fixed = [cfg.pad_token_id if i < 0 else i for i in lay.slot_ids]
        self.register_buffer("prompt_head_ids", torch.tensor(fixed[:max(lay.text_start, 0)], dtype=torch.long),
                             persistent=False)
        self.register_buffer("prompt_tail_ids", torch.tensor(fixed[lay.length - lay.tail_count:], dtype=torch.long),
                             persistent=False)
        self.register_buffer("prompt_image_index", torch.tensor(lay.image_index, dtype=torch.long), persistent=False)
        self.prompt_image_blocks = index_blocks(lay.image_index)
        return lay

    def prompt_sequence(self, batch: Dict[str, Tensor], image_tokens: Tensor,
                        embed_table: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """The chat-templated sequence in slot order (model/prompt.py): [template head ; the text
        slot ; template tail] embedded by embed_table, each view's image tokens written over its
        slot. -> (x (B, S, C), key mask (B, S), image mask (B, S), text_mask (B, L)), masks bool."""
        B, C = image_tokens.shape[0], image_tokens.shape[2]
        dev = image_tokens.device
        if image_tokens.shape[1] != self.prompt_image_index.shape[0]:
            raise RuntimeError("batch images do not fill the chat template's image slots: the model was imported "
                               "for another num_views or image size")
        text_mask = batch["text_mask"].to(torch.bool)                   # (B, L)
        text_ids = torch.where(text_mask, batch["text_tokens"], torch.full_like(batch["text_tokens"],
                                                                               self.pad_token_id))
        n_head = self.prompt_head_ids.shape[0]
        n_tail = self.prompt_tail_ids.shape[0]
        head = F.embedding(self.prompt_head_ids, embed_table).to(image_tokens.dtype).unsqueeze(0).expand(B, n_head, C)
        text = F.embedding(text_ids, embed_table).to(image_tokens.dtype)
        tail = F.embedding(self.prompt_tail_ids, embed_table).to(image_tokens.dtype).unsqueeze(0).expand(B, n_tail, C)
        x = torch.cat([head, text, tail], dim=1).index_copy(1, self.prompt_image_index, image_tokens)  # (B, S, C)
        ones_head = torch.ones(B, n_head, dtype=torch.bool, device=dev)
        ones_tail = torch.ones(B, n_tail, dtype=torch.bool, device=dev)
        key_mask = torch.cat([ones_head, text_mask, ones_tail], dim=1)  # (B, S)
        image_mask = torch.zeros_like(key_mask).index_fill(1, self.prompt_image_index, True)
        return x, key_mask, image_mask, text_mask

    def forward(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        actions = batch["actions"]                                     # (B, H, A)
        B = actions.shape[0]
        if "fm_t" in batch:
            t = batch["fm_t"].to(actions.dtype)                        # (B,)
        else:  # upstream N1.6/N1.7: t = (1 - Beta(alpha, 1)) * s, Beta(alpha, 1) = u^(1/alpha)
            u = torch.rand([B], dtype=actions.dtype, device=actions.device)
            t = (1.0 - u.pow(1.0 / self.beta_alpha)) * self.noise_s
        if "fm_noise" in batch:
            noise = batch["fm_noise"].to(actions.dtype)                # (B, H, A)
        else:
            noise = torch.randn_like(actions)
        vl, vl_mask, image_mask = self.encode_vl(batch)
        state_drop, state_noise = head_draws(batch)
        return self.head_loss(vl, vl_mask, image_mask, batch["state"], actions, batch["action_mask"],
                              batch["embodiment_id"], t, noise, state_drop, state_noise)


class Gr00tEagleModel(Gr00tModel):
    """GR00T N1.6: SigLIP-2 + pixel unshuffle + mlp1 (vision) and a Qwen3 LM with its final norm (llm)."""

    def __init__(self, cfg: ModelConfig):
        cfg.validate()
        Gr00tHead.__init__(self, head_config_for(cfg))
        self.beta_alpha = cfg.beta_alpha
        self.noise_s = cfg.noise_s
        self.vision = EagleVision(cfg)
        self.imu_encoder = (SeriesEncoder(cfg.imu_channels, cfg.series_hidden, cfg.imu_tokens, cfg.llm_width)
                            if cfg.use_imu else None)
        self.audio_encoder = (SeriesEncoder(cfg.audio_features, cfg.series_hidden, cfg.audio_tokens, cfg.llm_width)
                              if cfg.use_audio else None)
        self.llm = LanguageModel(cfg)
        for child in (self.vision, self.imu_encoder, self.audio_encoder, self.llm):
            if child is not None:
                init_weights(child)
        init_backbone(self.vision)
        self.register_prompt(cfg, 1)

    def encode_vl(self, batch: Dict[str, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        images = batch["images"]                                       # (B, V, 3, IMG, IMG)
        B, V = images.shape[0], images.shape[1]
        tokens = self.vision(images.flatten(0, 1))                     # (B*V, T, C)
        if self.templated:
            return self.encode_prompt(batch, tokens.reshape(B, V * tokens.shape[1], tokens.shape[2]))
        parts = [tokens.reshape(B, V * tokens.shape[1], tokens.shape[2])]
        n_image = parts[0].shape[1]
        parts = self.series_tokens(batch, parts)
        prefix = torch.cat(parts, dim=1)                               # (B, S0, C)
        key_mask, image_mask = self.masks(batch, prefix, n_image)
        vl = self.llm(prefix, batch["text_tokens"], key_mask)          # (B, S, C)
        return vl, key_mask, image_mask

    def encode_prompt(self, batch: Dict[str, Tensor], image_tokens: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """N1.6's chat-templated prompt (text first, each image in Eagle's `<image k><img> ... </img>`),
        positions counted over the real tokens."""
        x, key_mask, image_mask, text_mask = self.prompt_sequence(batch, image_tokens, self.llm.embed_tokens.weight)
        B = x.shape[0]
        n_head = self.prompt_head_ids.shape[0]
        n_tail = self.prompt_tail_ids.shape[0]
        m = text_mask.to(torch.int64)
        head_pos = torch.arange(n_head, device=x.device)[None].expand(B, n_head)
        text_pos = torch.where(text_mask, n_head + torch.cumsum(m, dim=1) - 1, torch.zeros_like(m))
        tail_pos = n_head + m.sum(dim=1, keepdim=True) + torch.arange(n_tail, device=x.device)[None]
        pos = torch.cat([head_pos, text_pos, tail_pos], dim=1)         # (B, S)
        return self.llm.forward_at(x, pos, key_mask), key_mask, image_mask


class Gr00tQwen3VLModel(Gr00tModel):
    """GR00T N1.7: the Qwen3-VL ViT with its mergers (vision) and the Qwen3-VL text decoder (llm);
    with cfg.chat_template_ids, the prompt of model/prompt.py."""

    def __init__(self, cfg: ModelConfig):
        cfg.validate()
        Gr00tHead.__init__(self, head_config_for(cfg))
        self.beta_alpha = cfg.beta_alpha
        self.noise_s = cfg.noise_s
        self.merged_grid = cfg.image_size // cfg.patch_size // cfg.pixel_shuffle
        self.vision = Qwen3VLVision(cfg)
        self.imu_encoder = (SeriesEncoder(cfg.imu_channels, cfg.series_hidden, cfg.imu_tokens, cfg.llm_width)
                            if cfg.use_imu else None)
        self.audio_encoder = (SeriesEncoder(cfg.audio_features, cfg.series_hidden, cfg.audio_tokens, cfg.llm_width)
                              if cfg.use_audio else None)
        self.llm = Qwen3VLText(cfg)
        for child in (self.vision, self.imu_encoder, self.audio_encoder, self.llm):
            if child is not None:
                init_weights(child)
        init_backbone(self.vision)
        lay = self.register_prompt(cfg, self.merged_grid)
        self.register_buffer("prompt_head_pos", torch.tensor(lay.head_pos, dtype=torch.long).view(3, -1),
                             persistent=False)
        self.text_pos0 = lay.text_pos0

    def encode_vl(self, batch: Dict[str, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        images = batch["images"]                                       # (B, V, 3, IMG, IMG)
        B, V = images.shape[0], images.shape[1]
        tokens, deep = self.vision(images.flatten(0, 1))               # (B*V, T, C), [(B*V, T, C)]
        T, C = tokens.shape[1], tokens.shape[2]
        deepstack = [d.reshape(B, V * T, C) for d in deep]
        if self.templated:
            return self.encode_prompt(batch, tokens.reshape(B, V * T, C), deepstack)
        parts = [tokens.reshape(B, V * T, C)]
        n_image = V * T
        parts = self.series_tokens(batch, parts)
        prefix = torch.cat(parts, dim=1)                               # (B, S0, C)
        key_mask, image_mask = self.masks(batch, prefix, n_image)
        text_mask = batch["text_mask"].to(torch.bool)
        pos = mrope_positions(V, self.merged_grid, prefix.shape[1] - n_image, text_mask)  # (3, B, S)
        x = torch.cat([prefix, self.llm.embed(batch["text_tokens"]).to(prefix.dtype)], dim=1)
        vl = self.llm(x, [(0, n_image)], key_mask, pos, deepstack, False)
        return vl, key_mask, image_mask

    def encode_prompt(self, batch: Dict[str, Tensor], image_tokens: Tensor,
                      deepstack: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """N1.7's chat-templated prompt (images first), at get_rope_index's multimodal positions."""
        x, key_mask, image_mask, text_mask = self.prompt_sequence(batch, image_tokens, self.llm.embed_tokens.weight)
        B, dev = x.shape[0], x.device
        n_head = self.prompt_head_ids.shape[0]
        n_tail = self.prompt_tail_ids.shape[0]
        m = text_mask.to(torch.int64)
        text_pos = torch.where(text_mask, self.text_pos0 + torch.cumsum(m, dim=1) - 1, torch.zeros_like(m))
        tail_pos = self.text_pos0 + m.sum(dim=1, keepdim=True) + torch.arange(n_tail, device=dev)[None]
        pos = torch.cat([self.prompt_head_pos[:, None].expand(3, B, n_head), text_pos[None].expand(3, B, -1),
                         tail_pos[None].expand(3, B, n_tail)], dim=2)  # (3, B, S)
        vl = self.llm(x, self.prompt_image_blocks, key_mask, pos, deepstack, True)
        return vl, key_mask, image_mask


def gr00t_model_class(cfg: ModelConfig):
    """The model class of a gr00t-* config, by cfg.backbone."""
    return {"n16": Gr00tModel, "eagle": Gr00tEagleModel, "qwen3vl": Gr00tQwen3VLModel}[cfg.backbone]


__all__ = ["Gr00tModel", "Gr00tEagleModel", "Gr00tQwen3VLModel", "gr00t_model_class", "Gr00tHeadConfig"]
