"""Import of a GR00T N1.6-layout checkpoint, end to end (issue #10 item 3, the N1.6 layout).

No package ships N1.6's model (Isaac-GR00T's Gr00tN1d6 on Eagle-Block2A-2B-v2),
so the checkpoint is assembled from upstream parts under N1.6's tensor names:
transformers' Siglip2VisionModel (run as Eagle's windowed, 2-D rotary SigLIP-2:
2 x 2 windows, layer 1 over the whole image) and Qwen3ForCausalLM with the Eagle
glue (test/scripts/test_gr00t_backbones.py's EagleReference: the same assembly its
backbone equivalence test checks) as `backbone.model.*`, lerobot 0.6.1's
GR00TN17ActionHead at N1.6's head structure (no vl_self_attention; shapes of
the gr00t-probe preset; dropout and state dropout 0, so no mask token) as
`action_head.*`. config.json carries Isaac-GR00T's Gr00tN1d6Config field names
(model_type Gr00tN1d6, crop_fraction 0.95, tune_top_llm_layers 1), the
backbone's config.json the SigLIP-2 and Qwen3 configs as transformers writes
them. Then, as test_gr00t_import.py does for N1.7: import with
scripts/convert_gr00t_checkpoint.py --strict (config picked from config.json,
the checkpoint's tokenizer.json recorded with its chat template: a small BPE
tokenizer with Eagle's special tokens and a template written for the tests,
test/eagle_prompt.py), dataset converted with that tokenizer, loongforge-train
STEPS steps; the step-1 loss equals the assembled upstream model's loss on the
trainer's first batch within 1e-5 relative, upstream's backbone getting each
sample's task text in Isaac-GR00T's N1.6 prompt (the text, then the images in
Eagle's markers, left-padded: test/eagle_prompt.py's upstream_eagle_prompt) (a
rolled-images control shows the loss depends on the images far more than
that), and the loss falls (mean of the last 5 steps below the first 5).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from test_gr00t_import import FIXTURE, LOSS_RTOL, REPO, STEPS, TRAIN, train_imported, trainer_sets

sys.path.insert(0, str(REPO / "test" / "scripts"))
sys.path.insert(0, str(REPO / "test"))
import lerobot_oracle  # noqa: E402
import model  # noqa: E402
from model.gr00t_head import get_head_config  # noqa: E402
from test_gr00t_backbones import N16_CASES, EagleReference  # noqa: E402
import eagle_prompt  # noqa: E402
torch.set_num_threads(1)


def n16_config_json(backbone_dir) -> dict:
    """Isaac-GR00T Gr00tN1d6Config fields (its defaults, small shapes)."""
    dit = {"positional_embeddings": None, "num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16,
           "norm_type": "ada_norm", "dropout": 0.0, "final_dropout": True, "output_dim": 32,
           "interleave_self_attention": True}
    return {"model_type": "Gr00tN1d6", "model_name": str(backbone_dir), "backbone_model_type": "eagle",
            "tune_top_llm_layers": 1, "backbone_embedding_dim": 128, "tune_llm": False, "tune_visual": False,
            "select_layer": 2, "image_crop_size": None, "image_target_size": None, "shortest_image_edge": 256,
            "crop_fraction": 0.95, "max_state_dim": 64, "max_action_dim": 64, "action_horizon": 16,
            "hidden_size": 32, "input_embedding_dim": 32, "add_pos_embed": True, "use_vlln": True,
            "max_seq_len": 64, "use_alternate_vl_dit": True, "attend_text_every_n_blocks": 2,
            "diffusion_model_cfg": dit, "noise_beta_alpha": 1.5, "noise_beta_beta": 1.0, "noise_s": 0.999,
            "num_timestep_buckets": 1000, "state_dropout_prob": 0.0, "state_additive_noise_scale": 0.0,
            "max_num_embodiments": 32}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """(oracle, EagleReference backbone, lerobot head, checkpoint folder)."""
    from safetensors.torch import save_file
    oracle = lerobot_oracle.load()
    work = tmp_path_factory.mktemp("gr00t-n16")
    cfg = model.get_config("gr00t-n1.6-3b", gr00t_head="gr00t-probe", max_state_dim=64, max_action_dim=64,
                           action_horizon=16, **N16_CASES["tiny"])
    ckpt = work / "ckpt"
    tok = eagle_prompt.write_eagle_tokenizer(ckpt, eagle_prompt.EAGLE_CHAT)
    image_token = tok.token_to_id("<IMG_CONTEXT>")
    torch.manual_seed(0)
    backbone = EagleReference(cfg, image_token=image_token)
    (work / "backbone").mkdir()
    # Eagle-Block2A-2B-v2's SigLIP-2 fields (its modeling_siglip2.py config) over transformers' ones
    vision = dict(backbone.vision_model.config.to_dict(), window_size=cfg.vit_window, use_windows_attn=True,
                  use_rope=True, full_attention_indexes=[int(i) for i in cfg.vit_full_layers.split(",")])
    (work / "backbone/config.json").write_text(json.dumps({
        "vision_config": vision, "text_config": backbone.language_model.config.to_dict(), "select_layer": -1,
        "downsample_ratio": 0.5, "force_image_size": cfg.image_size, "image_token_index": image_token}, default=str))
    config = n16_config_json(work / "backbone")
    head_cfg = get_head_config("gr00t-probe", backbone_width=128, max_state_dim=64, max_action_dim=64,
                               action_horizon=16, dropout=0.0, state_dropout=0.0)
    head = oracle.n17.GR00TN17ActionHead(lerobot_oracle.upstream_head_config(oracle, head_cfg))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for part in (backbone, head):
            for name, p in part.named_parameters():
                if bool(p.min() == p.max()):
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
                if part is head and p.dim() >= 2 and "position_embedding" not in name:
                    fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]   # see test_gr00t_import.py
                    p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    tensors = {"backbone.model." + k: v.clone() for k, v in backbone.state_dict().items()}
    tensors.update({"action_head." + k: v.clone() for k, v in head.state_dict().items()})
    save_file(tensors, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps(config))
    return oracle, backbone.eval(), head, ckpt


def upstream_loss_on(oracle, backbone, head, batch, ckpt) -> torch.Tensor:
    """The assembled upstream model's loss for our batch: each sample's task text (decoded from the
    dataset's ids) in Isaac-GR00T's N1.6 prompt, the head's noise and time draws replaced by the batch's."""
    from tokenizers import Tokenizer
    BF = oracle.n17.BatchFeature
    V = batch["images"].shape[1]
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    texts = [tok.decode(ids[mask].tolist(), skip_special_tokens=False)
             for ids, mask in zip(batch["text_tokens"], batch["text_mask"])]
    # 56 px / patch 14 = 4 x 4 patches -> 2 x 2 tokens per image
    ids, mask = eagle_prompt.upstream_eagle_prompt(ckpt, texts, V, 4)
    head.sample_time = lambda batch_size, device, dtype: batch["fm_t"].to(device, dtype)
    real_randn = torch.randn
    torch.randn = lambda *a, **k: batch["fm_noise"].clone()
    try:
        with torch.no_grad():
            feats = backbone(batch["images"].flatten(0, 1), ids, mask)
            out = head(BF(data={"backbone_features": feats, "backbone_attention_mask": mask.bool(),
                                "image_mask": ids == backbone.image_token}),
                       BF(data={"state": batch["state"][:, None], "action": batch["actions"],
                                "embodiment_id": batch["embodiment_id"], "action_mask": batch["action_mask"]}))
    finally:
        torch.randn = real_randn
        del head.sample_time
    return out["loss"]


def test_an_n16_layout_checkpoint_imports_trains_and_starts_at_upstreams_loss(upstream, tmp_path):
    from lf_dataset import LFDataset, SampleBuilder
    from model.config import ModelConfig
    from train_torch import effective_config
    oracle, backbone, head, ckpt = upstream
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    r = subprocess.run([sys.executable, str(REPO / "scripts/convert_gr00t_checkpoint.py"), str(ckpt), "--out",
                        str(tmp_path / "model.pt"), "--strict"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "'gr00t_head': 'gr00t-probe', 'backbone': 'eagle'" in r.stdout, r.stdout
    assert f"chat template: {ckpt / 'tokenizer_config.json'}" in r.stdout, r.stdout
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(FIXTURE), str(tmp_path / "ds"),
                    "--tokenizer", str(ckpt / "tokenizer.json"), "--episodes", "0,1", "--quiet"], check=True, env=env)
    extra = {"loongforge/config.json": ""}
    torch.jit.load(str(tmp_path / "model.pt"), map_location="cpu", _extra_files=extra)
    mcfg = ModelConfig.from_json(extra["loongforge/config.json"])
    assert (mcfg.image_size, mcfg.image_crop_fraction, mcfg.llm_layers, mcfg.tune_top_llm_layers) == (56, 0.95, 2, 1)
    assert (mcfg.vit_window, mcfg.vit_full_layers, mcfg.vit_rope_base) == (2, "1", 2.0)
    slots = [int(i) for i in mcfg.chat_template_ids.split(",")]
    assert slots.index(-2) < slots.index(-1), slots             # N1.6: the text before the images

    sets = trainer_sets(tmp_path / "model.pt", tmp_path / "ds", tmp_path)
    losses = train_imported(sets, tmp_path)

    cfg, _ = effective_config(TRAIN, str(REPO / "configs/n16-tiny.yaml"), sets)
    batch = SampleBuilder(LFDataset(tmp_path / "ds"), mcfg, cfg).micro_batch(0, 0)
    head.train()
    up = float(upstream_loss_on(oracle, backbone, head, batch, ckpt))
    rolled = float(upstream_loss_on(oracle, backbone, head, dict(batch, images=batch["images"].roll(1, dims=0)),
                                    ckpt))
    diff = abs(losses[0] - up) / abs(up)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    report = {"steps": STEPS, "trainer_step1_loss": losses[0], "upstream_loss": up, "rel_diff": diff,
              "rolled_images_rel_diff": abs(rolled - up) / abs(up), "mean_first5": first, "mean_last5": last}
    print(json.dumps(report))
    assert diff <= LOSS_RTOL < report["rolled_images_rel_diff"], report
    assert last < first, report


def test_with_isaac_groots_processor_files_the_import_records_n16s_data_processing(upstream, tmp_path):
    """A checkpoint with the files Isaac-GR00T's Gr00tN1d6Processor saves (processor_config.json,
    statistics.json, embodiment_id.json; test/gr00t_sidecars.py writes them from the dataset): the import
    records N1.6's state/action preparation for --embodiment-tag (slot, q01/q99, a relative group) and its
    text form; the dataset converted with --formalize-language n16; loongforge-train's step-1 loss equals
    the upstream model's on the batch the reference pipeline builds with that record, and the dataset form's
    batch gives another loss."""
    import shutil

    from gr00t_sidecars import write_checkpoint
    from lf_dataset import LFDataset, SampleBuilder
    from model.config import ModelConfig
    from train_torch import effective_config
    oracle, backbone, head, ckpt = upstream
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(FIXTURE), str(tmp_path / "ds"),
                    "--tokenizer", str(ckpt / "tokenizer.json"), "--formalize-language", "n16", "--episodes", "0,1",
                    "--quiet"], check=True, env=env)
    src = tmp_path / "ckpt"
    shutil.copytree(ckpt, src)
    write_checkpoint(src, LFDataset(tmp_path / "ds"), "robot", relative=("left_arm",), rows=16, delta=16,
                     use_percentiles=True, use_relative_action=True)
    shutil.copy(ckpt / "config.json", src / "config.json")   # the sidecars' writer puts an N1.7 one there
    (src / "embodiment_id.json").write_text(json.dumps({"robot": 3}))
    r = subprocess.run([sys.executable, str(REPO / "scripts/convert_gr00t_checkpoint.py"), str(src), "--out",
                        str(tmp_path / "model.pt"), "--strict", "--embodiment-tag", "robot"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "data processing as upstream N1.6's for embodiment 'robot': slot 3 (embodiment_id.json)" in r.stdout
    assert "relative actions ['left_arm']" in r.stdout and "--formalize-language n16" in r.stdout, r.stdout
    extra = {"loongforge/config.json": "", "loongforge/batch_spec.json": ""}
    torch.jit.load(str(tmp_path / "model.pt"), map_location="cpu", _extra_files=extra)
    spec = json.loads(extra["loongforge/batch_spec.json"])
    record = spec["processor"]
    assert record["form"] == "gr00t_n16" and spec["tokenizer"]["text_form"] == "gr00t_n16_formalized"
    mcfg = ModelConfig.from_json(extra["loongforge/config.json"])

    sets = [s for s in trainer_sets(tmp_path / "model.pt", tmp_path / "ds", tmp_path)
            if not s.startswith("trainer.max_steps=")] + ["trainer.max_steps=2"]
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml")]
    for s in sets:
        cmd += ["--set", s]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "prepared as upstream GR00T N1.6's processor for embodiment 'robot' (slot 3)" in run.stdout + run.stderr
    loss = json.loads((tmp_path / "import/metrics.jsonl").read_text().splitlines()[0])["loss"]

    cfg, _ = effective_config(TRAIN, str(REPO / "configs/n16-tiny.yaml"), sets)
    head.train()
    batch = SampleBuilder(LFDataset(tmp_path / "ds"), mcfg, cfg, processor=record).micro_batch(0, 0)
    assert (batch["embodiment_id"] == 3).all()
    up = float(upstream_loss_on(oracle, backbone, head, batch, src))
    plain = SampleBuilder(LFDataset(tmp_path / "ds"), mcfg, cfg).micro_batch(0, 0)
    other = float(upstream_loss_on(oracle, backbone, head, dict(plain, embodiment_id=batch["embodiment_id"]), src))
    report = {"trainer_step1_loss": loss, "upstream_loss": up, "rel_diff": abs(loss - up) / abs(up),
              "dataset_form_rel_diff": abs(other - up) / abs(up)}
    print(json.dumps(report))
    assert report["rel_diff"] <= LOSS_RTOL < report["dataset_form_rel_diff"], report
