"""The GR00T converter on a checkpoint written by the UPSTREAM action head (lerobot
0.6.1's GR00TN17ActionHead, random weights, saved as safetensors under its
checkpoint names), never by our own inverse table: the file converts onto the
exported upstream-exact head (scripts/model/gr00t_head.py) with --strict,
every tensor lands bit-exactly under its LoongForge name, and the converted
head computes upstream's loss; a transposed tensor, a missing one and an
extra one are refused or reported with their names and shapes; and
scripts/export_gr00t_checkpoint.py writes the imported head back bit for bit."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "test"))
import convert_gr00t_checkpoint as conv  # noqa: E402
import export_gr00t_checkpoint as export_back  # noqa: E402
import gr00t_checkpoint_names as ckpt_names  # noqa: E402
import gr00t_upstream_config as guc  # noqa: E402
import lerobot_oracle  # noqa: E402
from model.gr00t_head import HEAD_CONFIGS, Gr00tHeadConfig, build_head  # noqa: E402

CFG = Gr00tHeadConfig(name="tiny", backbone_width=64, hidden_size=32, input_embedding_dim=48,
                      dit_layers=4, dit_heads=4, dit_head_dim=12, vl_layers=1, vl_heads=4, vl_head_dim=16,
                      max_seq_len=16, num_embodiments=3, max_state_dim=7, max_action_dim=6, action_horizon=4)


@pytest.fixture(scope="module")
def upstream():
    oracle = lerobot_oracle.load()
    torch.manual_seed(0)
    head = oracle.n17.GR00TN17ActionHead(lerobot_oracle.upstream_head_config(oracle, CFG)).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return oracle, head, lerobot_oracle.upstream_head_tensors(head)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """Our head, scripted and saved as the converter's --model (its parameters give names and shapes)."""
    out = tmp_path_factory.mktemp("m") / "gr00t-head-tiny.pt"
    torch.manual_seed(1)
    torch.jit.save(torch.jit.script(build_head(CFG)), str(out))
    return out


def write(tensors, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model-00001-of-00001.safetensors"))
    return folder


def test_an_upstream_written_checkpoint_converts_strictly_and_computes_upstreams_loss(upstream, model_file,
                                                                                       tmp_path):
    oracle, head, tensors = upstream
    report = conv.convert(write(tensors, tmp_path / "src"), model_file, tmp_path / "out.safetensors", strict=True)
    out = load_file(str(tmp_path / "out.safetensors"))
    assert report["mapped"] == len(tensors) == len(out)
    for name, t in tensors.items():
        assert torch.equal(out[ckpt_names.to_loongforge(name)], t), name

    ours = build_head(CFG).eval()
    ours.load_state_dict(out, strict=True)
    B, S, H, A = 2, 6, CFG.action_horizon, CFG.max_action_dim
    g = torch.Generator().manual_seed(3)
    image_mask = torch.tensor([[False, True, True, False, False, False]] * B)
    batch = {"vl": torch.randn(B, S, CFG.backbone_width, generator=g), "vl_mask": torch.ones(B, S, dtype=torch.bool),
             "image_mask": image_mask, "state": torch.randn(B, CFG.max_state_dim, generator=g),
             "actions": torch.randn(B, H, A, generator=g), "action_mask": torch.ones(B, H, A),
             "embodiment_id": torch.tensor([1, 2]), "fm_t": torch.tensor([0.3, 0.7]),
             "fm_noise": torch.randn(B, H, A, generator=g)}
    BF = oracle.n17.BatchFeature
    head.sample_time = lambda batch_size, device, dtype: batch["fm_t"].to(device, dtype)
    real_randn = torch.randn
    torch.randn = lambda *a, **k: batch["fm_noise"].clone()
    try:
        with torch.no_grad():
            up_loss = head(BF(data={"backbone_features": batch["vl"], "backbone_attention_mask": batch["vl_mask"],
                                    "image_mask": image_mask}),
                           BF(data={"state": batch["state"][:, None], "action": batch["actions"],
                                    "embodiment_id": batch["embodiment_id"],
                                    "action_mask": batch["action_mask"]}))["loss"]
    finally:
        torch.randn = real_randn
        del head.sample_time
    with torch.no_grad():
        our_loss = ours(batch)["loss"]
    assert torch.allclose(our_loss, up_loss, rtol=1e-5, atol=0), (our_loss.item(), up_loss.item())


def test_a_transposed_tensor_is_refused_with_names_and_shapes(upstream, model_file, tmp_path):
    _, _, tensors = upstream
    bad = dict(tensors)
    name = "action_head.model.transformer_blocks.0.attn1.to_k.weight"     # (48, 64): cross-attention K
    bad[name] = bad[name].t()
    with pytest.raises(SystemExit, match=rf"{name} \(64, 48\) -> action_head.blocks.0.attn.k.weight \(48, 64\)"):
        conv.convert(write(bad, tmp_path / "src"), model_file, tmp_path / "out.safetensors", strict=True)


def test_a_missing_tensor_fails_strict_and_an_extra_one_is_reported(upstream, model_file, tmp_path):
    _, _, tensors = upstream
    partial = {k: v for k, v in tensors.items() if k != "action_head.vlln.weight"}
    with pytest.raises(SystemExit, match=r"action_head\.vl_norm\.weight"):
        conv.convert(write(partial, tmp_path / "a"), model_file, tmp_path / "a.safetensors", strict=True)
    extra = dict(tensors, **{"action_head.mask_token": torch.zeros(1, 1, CFG.input_embedding_dim)})
    report = conv.convert(write(extra, tmp_path / "b"), model_file, tmp_path / "b.safetensors")
    assert report["unmapped_upstream"] == ["action_head.mask_token"] and report["kept_from_model"] == []


def test_import_then_export_back_gives_the_upstream_file_bit_for_bit(upstream, model_file, tmp_path):
    _, _, tensors = upstream
    conv.convert(write(tensors, tmp_path / "src"), model_file, tmp_path / "ours.safetensors", strict=True)
    report = export_back.export(tmp_path / "ours.safetensors", tmp_path / "back.safetensors", strict=True)
    back = load_file(str(tmp_path / "back.safetensors"))
    assert report == {"layout": "n16", "exported": len(tensors), "no_upstream_name": []}
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


def test_export_back_strict_refuses_a_tensor_without_an_upstream_name(tmp_path):
    save_file({"action_head.vl_norm.weight": torch.ones(3), "llm.extra.weight": torch.ones(2)},
              str(tmp_path / "ours.safetensors"))
    with pytest.raises(SystemExit, match=r"llm\.extra\.weight"):
        export_back.export(tmp_path / "ours.safetensors", tmp_path / "back.safetensors", strict=True)
    report = export_back.export(tmp_path / "ours.safetensors", tmp_path / "back.safetensors")
    assert report == {"layout": "n16", "exported": 1, "no_upstream_name": ["llm.extra.weight"]}
    assert set(load_file(str(tmp_path / "back.safetensors"))) == {"action_head.vlln.weight"}


@pytest.mark.parametrize("cfg", [CFG, HEAD_CONFIGS["gr00t-n1.7-3b"]], ids=["tiny", "n1.7-3b"])
def test_the_head_config_is_read_back_from_upstreams_config_json(upstream, cfg):
    oracle = upstream[0]
    up_cfg = lerobot_oracle.upstream_head_config(oracle, cfg)
    data = json.loads(up_cfg.to_json_string(use_diff=False))
    got = guc.head_config_from_upstream(data, name=cfg.name)
    assert got == cfg
    # and lerobot's own untouched defaults are the gr00t-n1.7-3b preset
    defaults = json.loads(oracle.n17.GR00TN17Config().to_json_string(use_diff=False))
    assert guc.head_config_from_upstream(defaults, name="gr00t-n1.7-3b") == HEAD_CONFIGS["gr00t-n1.7-3b"]


def test_an_unsupported_upstream_setting_is_refused_naming_the_field(upstream):
    oracle = upstream[0]
    data = json.loads(oracle.n17.GR00TN17Config(use_alternate_vl_dit=False).to_json_string(use_diff=False))
    with pytest.raises(ckpt_names.ConversionError, match="use_alternate_vl_dit=False"):
        guc.head_config_from_upstream(data)


def test_an_n16_config_with_state_dropout_gives_the_state_mask_token(upstream):
    """Gr00tN1d6 with state_dropout_prob > 0 reads back as N1.6's mask-token head (converted by the
    table row action_head.mask_token -> action_head.state_mask_token); N1.6's additive state noise
    becomes the head's state_noise_scale (0 when absent)."""
    oracle = upstream[0]
    data = json.loads(lerobot_oracle.upstream_head_config(oracle, CFG).to_json_string(use_diff=False))
    data.update(model_type="Gr00tN1d6", state_dropout_prob=0.3)
    got = guc.head_config_from_upstream(data, name="n16")
    assert got.state_mask_token and got.state_dropout == 0.3
    assert ckpt_names.to_loongforge("action_head.mask_token") == "action_head.state_mask_token"
    head = build_head(got)
    assert tuple(head.action_head.state_mask_token.shape) == (1, 1, CFG.input_embedding_dim)
    assert got.state_noise_scale == 0.0
    assert guc.head_config_from_upstream(dict(data, state_additive_noise_scale=0.1)).state_noise_scale == 0.1


BACKBONE_FIELDS = ("backbone", "image_size", "patch_size", "vit_layers", "vit_width", "vit_heads", "vit_ffn",
                   "vit_pos_grid", "pixel_shuffle", "deepstack_layers", "llm_layers", "llm_width", "llm_heads",
                   "llm_kv_heads", "llm_head_dim", "llm_ffn", "vocab_size", "rope_theta", "mrope_section",
                   "tune_visual", "tune_llm", "tune_top_llm_layers", "vit_window", "vit_full_layers", "vit_rope_base")


def test_lerobots_default_n17_config_json_imports_as_gr00t_n17_3b_with_its_crop(upstream):
    """The released N1.7 config (lerobot's defaults, serialised) picks gr00t-n1.7-3b: the same head,
    backbone and freezing, the image crop 230 / 256 of its image_crop_size / image_target_size."""
    from model.config import get_config
    from model.gr00t_head import head_config_for
    oracle = upstream[0]
    data = json.loads(oracle.n17.GR00TN17Config().to_json_string(use_diff=False))
    got, want = guc.model_config_from_upstream(data, guc.read_backbone_config(data)), get_config("gr00t-n1.7-3b")
    assert {f: getattr(got, f) for f in BACKBONE_FIELDS} == {f: getattr(want, f) for f in BACKBONE_FIELDS}
    assert head_config_for(got) == head_config_for(want)
    assert got.image_crop_fraction == 230 / 256
    # upstream's default N1.7 image transform (antialiased bicubic; test/reference/test_image_resample.py)
    assert got.image_resample == "bicubic_aa" and got.image_resize_edge == int(data.get("shortest_image_edge") or 0)
    assert (got.image_target_size, got.image_size) == (256, 256)
    assert not got.image_letterbox
    data["model_name"] = "someone/else"
    with pytest.raises(guc.UpstreamConfigError, match="model_name='someone/else'.*--backbone-config"):
        guc.read_backbone_config(data)


def test_n17_image_settings_come_from_processor_config_as_upstreams_processor_takes_them(upstream):
    """lerobot 0.6.1 (processor_groot.py, make_groot_n1_7_pre_post_processors) takes a raw N1.7
    checkpoint's image geometry from processor_config.json's processor_kwargs when they name an
    image_target_size, else its defaults (256, crop 230), and never from config.json; likewise
    use_albumentations and letter_box_transform (false unless booleans)."""
    oracle = upstream[0]
    data = json.loads(oracle.n17.GR00TN17Config().to_json_string(use_diff=False))
    bb = guc.read_backbone_config(data)

    def imported(config=data, kwargs=None):
        return guc.model_config_from_upstream(config, bb, processor_kwargs=kwargs)

    def geometry(c):
        return c.image_target_size, c.image_size, c.image_crop_fraction, c.image_resize_edge, c.image_letterbox
    # config.json's image fields are not what upstream's processor uses
    assert geometry(imported(dict(data, image_target_size=[224, 224], image_crop_size=[202, 202]))) == \
        (256, 256, 230 / 256, 0, False)
    # processor_kwargs naming a target are taken; a target below the processor's 65,536 pixels
    # reaches the ViT at the processor's size (test/reference/test_n17_pixel_values.py)
    small = {"image_target_size": [224, 224], "image_crop_size": [202, 202], "formalize_language": True}
    assert geometry(imported(kwargs=small)) == (224, 256, 202 / 224, 0, False)
    # without a crop size there is no crop; crop_fraction and shortest_image_edge are upstream's own keys
    assert geometry(imported(kwargs={"image_target_size": [256, 256]})) == (256, 256, 1.0, 0, False)
    assert geometry(imported(kwargs={"image_target_size": [256, 256], "crop_fraction": 0.95,
                                     "shortest_image_edge": 288})) == (256, 256, 0.95, 288, False)
    # kwargs without a target keep upstream's default geometry; letterboxing is read either way
    assert geometry(imported(kwargs={"image_crop_size": [100, 100], "letter_box_transform": True})) == \
        (256, 256, 230 / 256, 0, True)
    assert not imported(kwargs={"letter_box_transform": "yes"}).image_letterbox   # not a boolean: false
    # use_albumentations: cv2's INTER_AREA transform, whose last resize goes to shortest_image_edge
    # (else the target): that size is the target, the processor's smart_resize of it the model's
    alb = imported(kwargs={"use_albumentations": True})
    assert (alb.image_resample, geometry(alb), alb.image_random_crop) == \
        ("cv2_area", (256, 256, 230 / 256, 0, False), True)        # lerobot trains with a random window
    assert not imported(kwargs={"use_albumentations": True, "image_target_size": [256, 256]}).image_random_crop
    alb = imported(kwargs={"use_albumentations": True, "image_target_size": [256, 256], "crop_fraction": 0.95,
                           "shortest_image_edge": 224, "letter_box_transform": True})
    assert (alb.image_resample, geometry(alb)) == ("cv2_area", (224, 256, 0.95, 0, True))
    assert imported(kwargs={"use_albumentations": "yes"}).image_resample == "bicubic_aa"  # not a boolean: false
    assert imported(dict(data, use_albumentations=True)).image_resample == "bicubic_aa"   # config.json's: not read


def test_the_import_reads_processor_config_and_says_which_image_fields_upstream_ignores(tmp_path):
    import convert_gr00t_checkpoint as conv
    assert guc.read_processor_kwargs(tmp_path) is None
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_kwargs": {
        "image_target_size": [224, 224], "image_crop_size": [202, 202], "letter_box_transform": True,
        "formalize_language": False}}))
    kwargs = guc.read_processor_kwargs(tmp_path)
    assert kwargs["image_target_size"] == [224, 224] and not conv.formalizes_language(kwargs)
    assert conv.formalizes_language({}) and conv.formalizes_language(None)
    (tmp_path / "processor_config.json").write_text("{not json")
    with pytest.raises(guc.UpstreamConfigError, match=r"processor_config.json: not JSON"):
        guc.read_processor_kwargs(tmp_path)
    from model.config import get_config
    import dataclasses
    cfg = dataclasses.replace(get_config("gr00t-n1.7-3b"), image_target_size=224, image_crop_fraction=202 / 224,
                              image_letterbox=True)
    image = guc.n17_image_settings(kwargs)
    line = conv.image_note(cfg, {"image_target_size": [64, 64], "image_crop_size": [202, 202]}, image)
    assert line.startswith("image geometry from processor_config.json: target 224, crop 0.901786 of each side, "
                           "resize edge 224, letterbox on"), line
    assert "config.json's image_target_size=[64, 64] not used" in line and "image_crop_size" not in line.split("\n")[1]
    assert line.split("\n")[2] == "image transform: antialiased bicubic (upstream's default)"
    alb = conv.image_note(dataclasses.replace(cfg, image_resample="cv2_area"), {}, image)
    assert alb.split("\n")[1].startswith("image transform: OpenCV's INTER_AREA (use_albumentations)"), alb


def n16_config_json():
    """Isaac-GR00T's Gr00tN1d6Config defaults, written out field by field (its code ships in no package),
    with state dropout on."""
    dit = {"positional_embeddings": None, "num_layers": 32, "num_attention_heads": 32, "attention_head_dim": 48,
           "norm_type": "ada_norm", "dropout": 0.2, "final_dropout": True, "output_dim": 1024,
           "interleave_self_attention": True}
    return {"model_type": "Gr00tN1d6", "model_name": "nvidia/Eagle-Block2A-2B-v2", "tune_top_llm_layers": 4,
            "backbone_embedding_dim": 2048, "tune_llm": False, "tune_visual": False, "select_layer": 16,
            "image_crop_size": None, "image_target_size": None, "shortest_image_edge": 256, "crop_fraction": 0.95,
            "max_state_dim": 29, "max_action_dim": 29, "action_horizon": 16, "hidden_size": 1024,
            "input_embedding_dim": 1536, "add_pos_embed": True, "use_vlln": True, "max_seq_len": 1024,
            "use_alternate_vl_dit": True, "attend_text_every_n_blocks": 2, "diffusion_model_cfg": dit,
            "noise_beta_alpha": 1.5, "noise_beta_beta": 1.0, "noise_s": 0.999, "num_timestep_buckets": 1000,
            "state_dropout_prob": 0.2, "state_additive_noise_scale": 0.0, "max_num_embodiments": 32}


def test_an_n16_config_json_imports_as_gr00t_n16_3b_with_the_mask_token_and_crop_095():
    """Isaac-GR00T's Gr00tN1d6Config defaults with state dropout on pick gr00t-n1.6-3b's backbone and
    head, the learned state mask token, the top 4 LM layers trainable and the 0.95 center crop."""
    from model.config import get_config
    from model.gr00t_head import head_config_for
    data = n16_config_json()
    dit = data["diffusion_model_cfg"]
    got, want = guc.model_config_from_upstream(data, guc.read_backbone_config(data)), get_config("gr00t-n1.6-3b")
    assert {f: getattr(got, f) for f in BACKBONE_FIELDS} == {f: getattr(want, f) for f in BACKBONE_FIELDS}
    head = head_config_for(got)
    assert head.state_mask_token and head.state_dropout == 0.2 and got.image_crop_fraction == 0.95
    assert got.image_resample == "box"  # no processor_config.json: config.json's crop, the box resize
    assert dataclasses_replace(head, state_dropout=0.0) == head_config_for(want)
    with pytest.raises(guc.UpstreamConfigError, match="nearest 'gr00t-n1.6-3b' differs in dit_layers=31"):
        guc.model_config_from_upstream(dict(data, diffusion_model_cfg=dict(dit, num_layers=31)))


def test_an_eagle_backbone_config_gives_its_windows_and_rotary_and_another_select_layer_is_refused():
    """Eagle-Block2A-2B-v2's SigLIP-2 fields (Isaac-GR00T modeling_siglip2.py Siglip2VisionConfig: window_size
    14, full_attention_indexes [7, 14, 21, 26], use_rope and use_windows_attn true by default; the rotary
    base is window_size, as upstream passes it) and Eagle3_VL's select_layer (-4 by default: not reproduced)."""
    vision = {"patch_size": 14, "num_hidden_layers": 27, "hidden_size": 1152, "num_attention_heads": 16,
              "intermediate_size": 4304, "num_patches": 256}
    text = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 6144,
            "vocab_size": 151936}
    base = {"vision_config": vision, "text_config": text, "select_layer": -1}

    def vit(b):
        f = guc.eagle_fields(b)
        return f["vit_window"], f["vit_full_layers"], f["vit_rope_base"]
    assert vit(base) == (14, "7,14,21,26", 14.0)
    assert vit(dict(base, vision_config=dict(vision, window_size=8, full_attention_indexes=[3, 1]))) == (8, "1,3", 8.0)
    assert vit(dict(base, vision_config=dict(vision, use_rope=False, use_windows_attn=False))) == (0, "7,14,21,26", 0.0)
    with pytest.raises(guc.UpstreamConfigError, match="select_layer=-4: must be -1"):
        guc.eagle_fields(dict(base, select_layer=-4))
    with pytest.raises(guc.UpstreamConfigError, match="select_layer=.absent .Eagle3_VLConfig's -4"):
        guc.eagle_fields({"vision_config": vision, "text_config": text})


def test_n16_image_transform_comes_from_processor_config_as_isaac_gr00ts_processor_builds_it():
    """Isaac-GR00T's Gr00tN1d6Processor (gr00t/model/gr00t_n1d6/processing_gr00t_n1d6.py) builds its
    image transform from processor_config.json's processor_kwargs: torchvision's (Resize to
    image_target_size, CenterCrop of image_crop_size, Resize back: bilinear_aa,
    test/reference/test_image_resample.py; trained with RandomCrop, a window per frame) or, with
    use_albumentations, the INTER_AREA one (cv2_area,
    trained with a random window). Eagle's processor does not resize, so the ViT sees the transform's
    size. Keys absent from the file take the constructor's defaults (shortest_image_edge 512)."""
    import convert_gr00t_checkpoint as conv
    data = n16_config_json()
    bb = guc.read_backbone_config(data)

    def imported(kwargs):
        return guc.model_config_from_upstream(data, bb, processor_kwargs=kwargs)

    def transform(c):
        return (c.image_resample, c.image_target_size, c.image_size, c.image_crop_fraction, c.image_random_crop)
    # no processor_config.json, or one without a target: config.json's 0.95 crop and the box resize
    assert transform(imported(None)) == ("box", 0, 224, 0.95, False)
    assert transform(imported({"crop_fraction": 0.9})) == ("box", 0, 224, 0.95, False)
    tv = imported({"image_target_size": [224, 224], "image_crop_size": [212, 212], "crop_fraction": 0.5,
                   "shortest_image_edge": 256})   # the torchvision transform reads neither of the last two
    assert transform(tv) == ("bilinear_aa", 224, 224, 212 / 224, True) and not tv.image_letterbox
    uncropped = imported({"image_target_size": [224, 224], "image_crop_size": [224, 224]})
    assert transform(uncropped) == ("bilinear_aa", 224, 224, 1.0, False)   # no crop, no window to draw
    alb = imported({"image_target_size": [224, 224], "image_crop_size": [212, 212], "use_albumentations": True,
                    "shortest_image_edge": 224, "crop_fraction": 0.95})
    assert transform(alb) == ("cv2_area", 224, 224, 0.95, True)
    alb = imported({"image_target_size": [224, 224], "image_crop_size": [212, 212], "use_albumentations": True,
                    "shortest_image_edge": None, "crop_fraction": None})
    assert transform(alb) == ("cv2_area", 224, 224, 212 / 224, True)
    with pytest.raises(guc.UpstreamConfigError, match=r"shortest_image_edge=512: gives 512 x 512 images, which "
                                                      r"Eagle's process_vision_info resizes"):
        imported({"image_target_size": [224, 224], "use_albumentations": True})   # the default edge, 512
    with pytest.raises(guc.UpstreamConfigError, match=r"image_target_size=\[238, 238\]: gives 238 x 238 images"):
        imported({"image_target_size": [238, 238], "image_crop_size": [224, 224]})   # 238 = 17 x 14, not 28
    with pytest.raises(guc.UpstreamConfigError, match=r"image_crop_size=None: is needed without use_albumentations"):
        imported({"image_target_size": [224, 224]})
    assert "antialiased bilinear (torchvision's), the crop at a window drawn per view, as upstream's RandomCrop " \
           "trains; target 224, crop 0.946429 of each side; the ViT sees 224 x 224" \
           in conv.n16_image_note(tv, {"image_target_size": [224, 224]})
    assert "antialiased bilinear (torchvision's), the center crop; target 224" in \
        conv.n16_image_note(uncropped, {"image_target_size": [224, 224]})
    assert "no processor_config.json" in conv.n16_image_note(imported(None), None)


def dataclasses_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


def test_with_model_a_checkpoint_tokenizer_json_must_be_the_models(upstream, model_file, tmp_path):
    """The checkpoint's tokenizer.json passes through: converting onto an export made for another
    tokenizer (here the word hash) is refused, naming the file and the fix."""
    sys.path.insert(0, str(REPO / "test" / "data"))
    from test_tokenizer_hf import train_bpe
    _, _, tensors = upstream
    src = write(tensors, tmp_path / "src")
    train_bpe(src / "tokenizer.json")
    with pytest.raises(SystemExit, match=r"tokenizer\.json \(sha256 .*\) is not the tokenizer .* was exported for "
                                         r"\(word_hash .*re-export it with scripts/model/export\.py --tokenizer"):
        conv.convert(src, model_file, tmp_path / "out.safetensors", strict=True)
