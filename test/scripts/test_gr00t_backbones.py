"""The upstream-exact GR00T backbones (scripts/model/backbones.py) against upstream modules
that none of us wrote, random-initialised at reduced depth:

- N1.7: lerobot 0.6.1's own `Qwen3Backbone` (test/lerobot_oracle.py) built offline from
  its hard-coded Cosmos-Reason2-2B config with only depths (and, for the tiny case, widths
  and the vocabulary) changed, run through its forward (transformers 5.5.4 Qwen3-VL:
  patches from transformers' Qwen2VLImageProcessor, multimodal RoPE ids, deepstack, the
  last kept decoder layer's output);
- N1.6: transformers' `Siglip2VisionModel` modules run the way Eagle-Block2A-2B-v2's own
  SigLIP-2 runs them (Isaac-GR00T modeling_siglip2.py, transcribed in `eagle_siglip2`:
  the image's patches regrouped into windows, attention per window - one varlen segment
  each, as its flash-attention packing runs them - except in the full-attention layers,
  per image; Rope2DPosEmb's complex 2-D rotation of q and k with its base; post_layernorm,
  then back to raster order), and `Qwen3ForCausalLM` (truncated to
  select_layer as Isaac-GR00T's EagleBackbone does, features after the final norm as
  `hidden_states[-1]` is in the transformers 4.53 Isaac-GR00T pins); the Eagle glue
  between them (per-image pixel unshuffle of the (C, h, w) map and `mlp1` =
  LayerNorm, Linear, GELU, Linear; image embeddings written over the image-token
  embeddings) follows Eagle3_VL's extract_feature / forward step by step, because
  Eagle's code ships in no package.

Each upstream state dict goes through scripts/convert_gr00t_checkpoint.py (strict: every
tensor maps or is one upstream never reads, every backbone parameter of ours receives
one), is loaded into our model, and the backbone features (every position, padded text
included: the head's vl_self_attention sees them) must agree within 1e-5 relative and
the gradient of every backbone tensor (all made trainable) within 1e-4 relative, for the
same images, tokens and masks (fp32, CPU). The measured maxima are printed."""
import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "test"))
import export_gr00t_checkpoint as export_back  # noqa: E402
import gr00t_checkpoint_names as ckpt_names  # noqa: E402
import lerobot_oracle  # noqa: E402
import model  # noqa: E402
from model.batch import example_batch  # noqa: E402

FWD_RTOL = 1e-5
GRAD_RTOL = 1e-4
torch.set_num_threads(2)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


def randomize_constants(module: torch.nn.Module, seed: int) -> None:
    """Norm weights/biases and other constant-initialised tensors get random values, so a swapped
    or mis-mapped tensor cannot pass (norm weights stay near 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if bool(p.min() == p.max()):
                base = 1.0 if float(p.flatten()[0]) == 1.0 else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))


def our_model(cfg: model.ModelConfig, upstream: dict, layout: str):
    """Our model for cfg with its backbone loaded from upstream's tensors through the converter (strict
    over the backbone), every backbone tensor trainable, eval mode."""
    torch.manual_seed(1)
    m = model.build_model(cfg)
    backbone = {n: p.detach().clone() for n, p in m.named_parameters() if n.split(".")[0] in ("vision", "llm")}
    converted, report = ckpt_names.convert_tensors(upstream, backbone, strict=True, layout=layout)
    missing, unexpected = m.load_state_dict(converted, strict=False)
    assert not unexpected and all(n.split(".")[0] in ("action_head", "embodiment") for n in missing)
    for n, p in m.named_parameters():
        p.requires_grad_(n.split(".")[0] in ("vision", "llm"))
    return m.eval(), report


def compare(ours_feats, up_feats, ours_model, up_params: dict, layout: str, label: str, rounding_zero: float = 0.0):
    """Forward within FWD_RTOL; then the same random projection of the features backpropagated on
    both sides, every backbone gradient within GRAD_RTOL. rounding_zero > 0: a gradient whose largest
    value is below rounding_zero x the largest of all on both sides is zero but for rounding (the
    attention key biases: softmax ignores a shift shared by a row's logits) and is not compared
    relatively. Returns (forward rel, worst gradient rel)."""
    fwd = rel(ours_feats.detach(), up_feats.detach())
    proj = torch.randn(up_feats.shape, generator=torch.Generator().manual_seed(7))
    (ours_feats * proj).sum().backward()
    (up_feats * proj).sum().backward()
    ours_params = dict(ours_model.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in up_params.values() if p.grad is not None)
    worst, worst_name, n_checked = 0.0, "", 0
    for up_name, p in up_params.items():
        mine = ckpt_names.to_loongforge(up_name, layout)
        if not mine:
            assert ckpt_names.known_unused(up_name, layout), up_name
            continue
        assert p.grad is not None and ours_params[mine].grad is not None, up_name
        if float(p.grad.abs().max()) <= rounding_zero * scale:
            assert float(ours_params[mine].grad.abs().max()) <= rounding_zero * scale, up_name
            n_checked += 1
            continue
        r = rel(ours_params[mine].grad, p.grad)
        assert torch.isfinite(ours_params[mine].grad).all() and p.grad.abs().max() > 0, up_name
        n_checked += 1
        if r > worst:
            worst, worst_name = r, mine
    print(f"{label}: features max rel diff {fwd:.3g}; gradients of {n_checked} tensors, max rel diff "
          f"{worst:.3g} ({worst_name})")
    assert fwd <= FWD_RTOL, fwd
    assert worst <= GRAD_RTOL, (worst, worst_name)
    assert n_checked == sum(1 for n, _ in ours_model.named_parameters() if n.split(".")[0] in ("vision", "llm"))
    return fwd, worst


# ---------------------------------------------------------------------------- N1.7 (Qwen3-VL)

@pytest.fixture(scope="module")
def oracle():
    return lerobot_oracle.load()


N17_CASES = {
    # name: (our config overrides, upstream vision config changes, upstream text config changes)
    "tiny": (dict(image_size=64, patch_size=8, vit_layers=4, vit_width=64, vit_heads=2, vit_ffn=96, vit_pos_grid=6,
                  deepstack_layers="1,3", llm_layers=3, llm_width=128, llm_heads=4, llm_kv_heads=2,
                  llm_head_dim=32, llm_ffn=192, vocab_size=8192, mrope_section="6,5,5"),
             dict(depth=4, hidden_size=64, num_heads=2, intermediate_size=96, num_position_embeddings=36,
                  patch_size=8, deepstack_visual_indexes=[1, 3], out_hidden_size=128),
             dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  intermediate_size=192, vocab_size=8192, rope_scaling=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000000, "mrope_interleaved": True,
                                   "mrope_section": [6, 5, 5]})),
    # N1.7's widths (ViT 1024 x 16 heads patch 16, 48 x 48 position table; text 2048, 16 q / 8 kv of
    # 128, FFN 6144, theta 5e6, mrope 24/20/20); 2 ViT layers, the second deepstack, 2 text layers of 3.
    "n1.7-widths": (dict(deepstack_layers="1", vit_layers=2, llm_layers=2, vocab_size=8192, image_size=64),
                    dict(depth=2, deepstack_visual_indexes=[1]),
                    dict(num_hidden_layers=3, vocab_size=8192)),
}


def n17_pair(oracle, tmp_path, case: str):
    ours_over, vis_over, text_over = N17_CASES[case]
    cfg = model.get_config("gr00t-n1.7-3b", gr00t_head="gr00t-probe", max_state_dim=8, max_action_dim=8,
                           action_horizon=4, num_embodiments=2, max_text_len=7, **ours_over)
    base = oracle.n17._cosmos_reason2_qwen3_vl_config().to_dict()
    base["vision_config"].update(vis_over)
    base["text_config"].update(text_over)
    base["image_token_id"] = 8191          # inside the reduced vocabulary
    base["text_config"]["pad_token_id"] = None
    (tmp_path / "config.json").write_text(json.dumps(base))
    torch.manual_seed(0)
    up = oracle.n17.Qwen3Backbone(model_name=str(tmp_path), tune_llm=True, tune_visual=True,
                                  select_layer=cfg.llm_layers, load_pretrained_weights=False,
                                  transformers_loading_kwargs={})
    randomize_constants(up, seed=3)
    up = up.eval()
    tensors = {"backbone." + k: v for k, v in up.state_dict().items()}
    ours, report = our_model(cfg, tensors, "n1.7")
    return cfg, up, ours, tensors, report


def n17_inputs(cfg, up, batch):
    """Upstream's inputs for our batch: [image tokens ; text] ids with the image-token id, the
    attention mask, and the processor's patches of each image."""
    from transformers import Qwen2VLImageProcessor
    from transformers.feature_extraction_utils import BatchFeature
    B, V = batch["images"].shape[:2]
    proc = Qwen2VLImageProcessor(patch_size=cfg.patch_size, temporal_patch_size=cfg.vit_temporal_patch,
                                 merge_size=cfg.pixel_shuffle)
    pix = proc(images=list(batch["images"].flatten(0, 1)), do_resize=False, do_rescale=False, do_normalize=False,
               return_tensors="pt")
    n_img = V * cfg.tokens_per_view
    ids = torch.cat([torch.full((B, n_img), up.model.config.image_token_id), batch["text_tokens"]], dim=1)
    mask = torch.cat([torch.ones(B, n_img, dtype=torch.long), batch["text_mask"].long()], dim=1)
    return BatchFeature(data={"input_ids": ids, "attention_mask": mask, "pixel_values": pix["pixel_values"],
                              "image_grid_thw": pix["image_grid_thw"]})


@pytest.mark.parametrize("case", list(N17_CASES))
def test_n17_backbone_equals_lerobots_qwen3_backbone(oracle, tmp_path, case):
    cfg, up, ours, tensors, report = n17_pair(oracle, tmp_path, case)
    assert report["unmapped_upstream"] == [] and report["kept_from_model"] == []
    assert sorted(report["unused_known"]) == ["backbone.model.lm_head.weight",
                                              "backbone.model.model.language_model.norm.weight"]
    batch = example_batch(cfg, 2, seed=4)
    batch["text_tokens"] = batch["text_tokens"] % 8000                          # inside the reduced vocabulary
    assert not batch["text_mask"].all()                                         # padded text is compared too
    out = up(n17_inputs(cfg, up, batch))
    vl, key_mask, image_mask = ours.encode_vl(batch)
    assert torch.equal(key_mask, out["backbone_attention_mask"]) and torch.equal(image_mask, out["image_mask"])
    compare(vl, out["backbone_features"], ours, dict(up.named_parameters(prefix="backbone")), "n1.7",
            f"N1.7 backbone ({case})")


def test_n17_converted_checkpoint_exports_back_bit_for_bit(oracle, tmp_path):
    _, _, ours, tensors, _ = n17_pair(oracle, tmp_path, "tiny")
    mine = {n: p.detach() for n, p in ours.named_parameters() if n.split(".")[0] in ("vision", "llm")}
    back, report = export_back.export_tensors(mine, strict=True)
    assert report["layout"] == "n1.7"
    expected = {k: v for k, v in tensors.items() if not ckpt_names.known_unused(k, "n1.7")}
    assert set(back) == set(expected)
    for k, v in expected.items():
        assert torch.equal(back[k], v), k


def test_n17_a_transposed_or_missing_tensor_is_refused_by_name(oracle, tmp_path):
    cfg, _, ours, tensors, _ = n17_pair(oracle, tmp_path, "tiny")
    mine = {n: p.detach() for n, p in ours.named_parameters() if n.split(".")[0] in ("vision", "llm")}
    bad = dict(tensors)
    name = "backbone.model.model.visual.deepstack_merger_list.1.linear_fc2.weight"   # (128, 256)
    bad[name] = bad[name].t()
    with pytest.raises(ckpt_names.ConversionError, match=rf"{name} \(256, 128\) -> "
                                                   r"vision\.deepstack_mergers\.1\.fc2\.weight \(128, 256\)"):
        ckpt_names.convert_tensors(bad, mine, layout="n1.7")
    partial = {k: v for k, v in tensors.items() if "blocks.2.attn.qkv.bias" not in k}
    with pytest.raises(ckpt_names.ConversionError, match=r"vision\.blocks\.2\.qkv\.bias"):
        ckpt_names.convert_tensors(partial, mine, strict=True)


# ---------------------------------------------------------------------------- N1.6 (Eagle)

def eagle_siglip2(vt, images: torch.Tensor, patch: int, window: int, full, theta: float) -> torch.Tensor:
    """Eagle-Block2A-2B-v2's Siglip2VisionTransformer.forward over transformers' Siglip2 modules (vt =
    Siglip2VisionModel.vision_model): images (N, 3, H, W) -> last hidden state (N, h*w, C), raster order.
    window: Siglip2VisionConfig.window_size (use_windows_attn; 0 = off), full: full_attention_indexes,
    theta: the Rope2DPosEmb base (upstream passes window_size; 0 = use_rope off)."""
    import math
    N, _, H, W = images.shape
    h, w = H // patch, W // patch
    emb = vt.embeddings
    C = emb.patch_embedding.out_features
    heads = vt.encoder.layers[0].self_attn.num_heads
    d = C // heads
    # Siglip2VisionEmbeddings: patches in (p_h, p_w, C) order, Linear, the resized position table
    patches = images.reshape(N, 3, h, patch, w, patch).permute(0, 2, 4, 3, 5, 1).reshape(N * h * w, -1)
    G = math.isqrt(emb.position_embedding.weight.shape[0])
    table = emb.position_embedding.weight.reshape(G, G, C).permute(2, 0, 1).unsqueeze(0).float()
    pos = torch.nn.functional.interpolate(table, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    x = (emb.patch_embedding(patches).reshape(N, h * w, C) + pos.reshape(C, h * w).t()).reshape(N * h * w, C)
    # split_patch_embeddings_to_windows_with_meta: per image, windows row by row, cropped at the edges,
    # each window's tokens row-major, packed into one sequence
    ws = window if window > 0 else max(h, w)
    order, windows = [], []
    for n in range(N):
        for r0 in range(0, h, ws):
            for c0 in range(0, w, ws):
                idx = [n * h * w + (r0 + u) * w + c0 + v for u in range(min(ws, h - r0)) for v in range(min(ws, w - c0))]
                order += idx
                windows.append(len(idx))
    order = torch.tensor(order)
    x = x[order]
    # Rope2DPosEmb: freqs_cis[row, col] = per frequency j (cis(col f_j), cis(row f_j)), f_j = theta^(-4j/d)
    rows = ((order % (h * w)) // w).float()
    cols = (order % w).float()
    cis = None
    if theta > 0:
        f = 1.0 / (theta ** (torch.arange(0, d, 4)[: d // 4].float() / d))
        xc = torch.polar(torch.ones(len(order), d // 4), torch.outer(cols, f))
        yc = torch.polar(torch.ones(len(order), d // 4), torch.outer(rows, f))
        cis = torch.cat([xc.unsqueeze(-1), yc.unsqueeze(-1)], dim=-1).reshape(len(order), d // 2)

    def rope(t):
        z = torch.view_as_complex(t.float().reshape(t.shape[0], heads, d // 2, 2))
        return torch.view_as_real(z * cis.unsqueeze(1)).flatten(-2).type_as(t)

    for i, layer in enumerate(vt.encoder.layers):
        a = layer.self_attn
        lens = windows if (window > 0 and i not in full) else [h * w] * N    # flash-attention varlen segments
        y = layer.layer_norm1(x)
        q, k = a.q_proj(y).view(-1, heads, d), a.k_proj(y).view(-1, heads, d)
        v = a.v_proj(y).view(-1, heads, d)
        if cis is not None:
            q, k = rope(q), rope(k)
        out, at = [], 0
        for L in lens:
            seg = [t[at:at + L].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            out.append(torch.nn.functional.scaled_dot_product_attention(*seg)[0].transpose(0, 1))
            at += L
        x = x + a.out_proj(torch.cat(out).reshape(-1, C))
        x = x + layer.mlp(layer.layer_norm2(x))
    x = vt.post_layernorm(x)
    return x[torch.argsort(order)].reshape(N, h * w, C)


class EagleReference(torch.nn.Module):
    """Upstream N1.6's backbone assembled from transformers modules the way Isaac-GR00T's
    EagleBackbone / Eagle3_VLForConditionalGeneration does, under upstream's tensor names
    (vision_model, mlp1, language_model)."""

    def __init__(self, cfg: model.ModelConfig, image_token: int):
        super().__init__()
        from transformers import Qwen3Config, Qwen3ForCausalLM, Siglip2VisionConfig, Siglip2VisionModel
        self.image_token = image_token
        self.patch = cfg.patch_size
        self.window, self.rope_theta = cfg.vit_window, cfg.vit_rope_base
        self.full = [int(i) for i in cfg.vit_full_layers.split(",") if i.strip()]
        self.vision_model = Siglip2VisionModel(Siglip2VisionConfig(
            hidden_size=cfg.vit_width, intermediate_size=cfg.vit_ffn, num_hidden_layers=cfg.vit_layers,
            num_attention_heads=cfg.vit_heads, num_patches=cfg.vit_pos_grid ** 2, patch_size=cfg.patch_size,
            vision_use_head=True, attn_implementation="sdpa"))
        c4 = cfg.vit_width * cfg.pixel_shuffle ** 2
        self.mlp1 = torch.nn.Sequential(torch.nn.LayerNorm(c4), torch.nn.Linear(c4, cfg.llm_width), torch.nn.GELU(),
                                        torch.nn.Linear(cfg.llm_width, cfg.llm_width))
        self.language_model = Qwen3ForCausalLM(Qwen3Config(
            vocab_size=cfg.vocab_size, hidden_size=cfg.llm_width, intermediate_size=cfg.llm_ffn,
            num_hidden_layers=cfg.llm_layers + 1, num_attention_heads=cfg.llm_heads,
            num_key_value_heads=cfg.llm_kv_heads, head_dim=cfg.llm_head_dim, rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.rms_eps, tie_word_embeddings=True, attn_implementation="sdpa"))
        while len(self.language_model.model.layers) > cfg.llm_layers:     # EagleBackbone: pop to select_layer
            self.language_model.model.layers.pop(-1)
        self.shuffle = cfg.pixel_shuffle

    def forward(self, images, input_ids, attention_mask):
        N, _, H, W = images.shape
        h, w = H // self.patch, W // self.patch
        vit = eagle_siglip2(self.vision_model.vision_model, images, self.patch, self.window, self.full,
                            self.rope_theta)                                  # select_layer -1
        C = vit.shape[-1]
        per_image = [x.transpose(0, 1).reshape(C, h, w) for x in vit]        # pixel_shuffle_back
        down = torch.nn.functional.pixel_unshuffle(torch.stack(per_image), self.shuffle)
        vit_embeds = self.mlp1(down.flatten(2).transpose(1, 2)).reshape(-1, self.mlp1[1].out_features)
        embeds = self.language_model.get_input_embeddings()(input_ids)
        B, S, D = embeds.shape
        embeds = embeds.reshape(B * S, D)
        selected = input_ids.reshape(B * S) == self.image_token
        embeds[selected] = embeds[selected] * 0.0 + vit_embeds
        return self.language_model.model(inputs_embeds=embeds.reshape(B, S, D),
                                         attention_mask=attention_mask).last_hidden_state


N16_CASES = {
    # 4 x 4 patches in 2 x 2 windows (layer 0), layer 1 attending over the image; the rotary base is
    # the window size, as upstream passes it
    "tiny": dict(image_size=56, patch_size=14, vit_layers=2, vit_width=64, vit_heads=4, vit_ffn=96, vit_pos_grid=3,
                 vit_window=2, vit_full_layers="1", vit_rope_base=2.0,
                 llm_layers=2, llm_width=128, llm_heads=4, llm_kv_heads=2, llm_head_dim=32, llm_ffn=192,
                 vocab_size=8192, tune_top_llm_layers=1),
    # N1.6's widths (SigLIP-2 so400m 1152 x 16 heads, FFN 4304, patch 14, 16 x 16 table, here on
    # 112 px so the table is downsampled with antialias; Qwen3-1.7B 2048, 16 q / 8 kv of 128, FFN
    # 6144, theta 1e6), 1 ViT and 2 LM layers; 8 x 8 patches in windows of 3 (the edge ones cropped
    # to 2), the 2-D rotary's base 3.
    "n1.6-widths": dict(vit_layers=1, llm_layers=2, vocab_size=8192, tune_top_llm_layers=1, image_size=112,
                        vit_window=3, vit_full_layers="", vit_rope_base=3.0),
}


def n16_pair(case: str):
    cfg = model.get_config("gr00t-n1.6-3b", gr00t_head="gr00t-probe", max_state_dim=8, max_action_dim=8,
                           action_horizon=4, num_embodiments=2, max_text_len=7, **N16_CASES[case])
    torch.manual_seed(0)
    up = EagleReference(cfg, image_token=8191)
    randomize_constants(up, seed=3)
    up = up.eval()
    tensors = {"backbone.model." + k: v for k, v in up.state_dict().items()}
    ours, report = our_model(cfg, tensors, "n1.6")
    return cfg, up, ours, tensors, report


@pytest.mark.parametrize("case", list(N16_CASES))
def test_n16_backbone_equals_siglip2_eagle_glue_and_qwen3(case):
    cfg, up, ours, tensors, report = n16_pair(case)
    assert report["unmapped_upstream"] == [] and report["kept_from_model"] == []
    assert "backbone.model.language_model.lm_head.weight" in report["unused_known"]
    assert all(n == "backbone.model.language_model.lm_head.weight" or ".vision_model.head." in n
               for n in report["unused_known"])
    batch = example_batch(cfg, 2, seed=4)
    batch["text_tokens"] = batch["text_tokens"] % 8000
    assert not batch["text_mask"].all()
    B, V = batch["images"].shape[:2]
    n_img = V * cfg.tokens_per_view
    ids = torch.cat([torch.full((B, n_img), 8191), batch["text_tokens"]], dim=1)
    mask = torch.cat([torch.ones(B, n_img, dtype=torch.long), batch["text_mask"].long()], dim=1)
    up_feats = up(batch["images"].flatten(0, 1), ids, mask)
    vl, key_mask, _ = ours.encode_vl(batch)
    assert torch.equal(key_mask, mask.bool())
    up_params = {n: p for n, p in up.named_parameters(prefix="backbone.model")
                 if not ckpt_names.known_unused(n, "n1.6")}   # the SigLIP pooling head has no gradient here
    compare(vl, up_feats, ours, up_params, "n1.6", f"N1.6 backbone ({case})")


def test_n16_converted_checkpoint_exports_back_bit_for_bit():
    _, _, ours, tensors, _ = n16_pair("tiny")
    mine = {n: p.detach() for n, p in ours.named_parameters() if n.split(".")[0] in ("vision", "llm")}
    back, report = export_back.export_tensors(mine, strict=True)
    assert report["layout"] == "n1.6"
    expected = {k: v for k, v in tensors.items() if not ckpt_names.known_unused(k, "n1.6")}
    assert set(back) == set(expected)
    for k, v in expected.items():
        assert torch.equal(back[k], v), k


# ---------------------------------------------------------------------------- export, FLOPs, freezing

@pytest.mark.parametrize("name", ["gr00t-n1.6-tiny", "gr00t-n1.7-tiny"])
def test_tiny_exact_backbone_configs_export_and_count_their_flops(name, tmp_path):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    from model import export
    from model.flops import flops_per_sample
    files = export.export(name, str(tmp_path / "m.pt"), seed=0)
    scripted = torch.jit.load(str(tmp_path / "m.pt"))
    cfg = model.get_config(name)
    torch.manual_seed(0)
    eager = model.build_model(cfg)
    batch = example_batch(cfg, 2, seed=3)
    scripted.eval(), eager.eval()
    a, b = eager(batch), scripted(batch)
    assert torch.equal(a["loss"], b["loss"])
    counts = json.loads(files["loongforge/counts.json"])
    assert counts["total"] == sum(p.numel() for p in eager.parameters())
    for overrides in ({}, {"tune_visual": True, "tune_llm": True}, {"num_views": 2, "max_text_len": 9}):
        c = model.get_config(name, **overrides)
        torch.manual_seed(0)
        m = model.build_model(c)
        bt = example_batch(c, 1, seed=0)
        with sdpa_kernel(SDPBackend.MATH):
            fwd = FlopCounterMode(display=False)
            with fwd:
                out = m(bt)
            bwd = FlopCounterMode(display=False)
            with bwd:
                out["loss"].backward()
        f = flops_per_sample(c)
        assert (f["forward_per_sample"], f["backward_per_sample"]) == (fwd.get_total_flops(), bwd.get_total_flops()), \
            (name, overrides)


def test_exact_backbones_freeze_like_upstream():
    """N1.6: ViT and mlp1 frozen (tune_visual), LM frozen but its top 4 layers; the final norm stays
    frozen as upstream's language_model.requires_grad_(False) leaves it. N1.7: everything frozen."""
    m = model.build_model(model.get_config("gr00t-n1.6-3b"), torch.device("meta"))
    train = {n for n, p in m.named_parameters() if p.requires_grad}
    assert not any(n.startswith("vision.") for n in train)
    assert {n.split(".")[2] for n in train if n.startswith("llm.")} == {"12", "13", "14", "15"}
    m = model.build_model(model.get_config("gr00t-n1.7-3b"), torch.device("meta"))
    assert not any(p.requires_grad for n, p in m.named_parameters() if n.split(".")[0] in ("vision", "llm"))


def test_eagles_rotary_in_real_arithmetic_is_upstreams_complex_product():
    """model.backbones.rope_pairs turns pairs with real products and sums (so a compiled step fuses it):
    bit for bit ATen's complex product on the CPU's vector path (whole vectors of pairs), within one
    float32 rounding where its scalar tail fuses a multiply-add; gradients likewise."""
    from model.backbones import rope_pairs
    for shape, exact in (((2, 64, 4, 32), True), ((3, 37, 5, 14), False)):
        B, N, H, D = shape
        g = torch.Generator().manual_seed(D)
        x = torch.randn(shape, generator=g)
        cis = torch.polar(torch.ones(N, D // 2), torch.randn(N, D // 2, generator=g) * 30)
        ours_in, theirs_in = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours = rope_pairs(ours_in, cis.real.contiguous(), cis.imag.contiguous())
        z = torch.view_as_complex(theirs_in.reshape(B, N, H, D // 2, 2))
        theirs = torch.view_as_real(z * cis[None, :, None, :]).reshape(shape)
        up = torch.randn(shape, generator=g)
        (ours * up).sum().backward()
        (theirs * up).sum().backward()
        for a, b in ((ours, theirs), (ours_in.grad, theirs_in.grad)):
            if exact:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_eagles_rotary_compiles_to_fused_kernels_without_aten_calls():
    """Inductor (the compiled step's compiler) generates the rotary's forward and backward itself: no ATen
    fallback such as the complex form's view_as_complex / complex mul / view_as_real / clone, which ran as
    separate kernels in gr00t-n1.6-3b's compiled step (docs/benchmarks.md, session 51)."""
    import re
    from torch._inductor.utils import run_and_get_code
    from model.backbones import rope_pairs
    B, N, H, D = 2, 16, 2, 8
    cis = torch.polar(torch.ones(N, D // 2), torch.randn(N, D // 2, generator=torch.Generator().manual_seed(1)))
    cos, sin = cis.real.contiguous(), cis.imag.contiguous()

    def step(q):
        r = rope_pairs(q, cos, sin)
        (r * r).sum().backward()

    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(step), torch.randn(B, N, H, D, requires_grad=True))
    code = "\n".join(codes)
    assert "def call" in code  # Inductor's wrapper was generated
    assert re.findall(r"torch\.ops\.aten\.\w+|extern_kernels\.\w+", code) == []
