"""Import of an upstream GR00T N1.7 checkpoint, end to end (issue #10 item 3).

The checkpoint is made by the upstream code itself: lerobot 0.6.1's GR00TN17
(test/lerobot_oracle.py), a random SMALL model (Qwen3-VL backbone from a small
config.json in a local `model_name` folder, 3 text layers truncated at
select_layer 2, ViT 3 x 64 with patch 16 and deepstack 0/2; the head at gr00t-tiny's shapes, its
matrices drawn at N(0, 1/fan_in); dropout and state dropout 0), written by its own
`save_pretrained`
(model.safetensors + config.json), plus a small byte-level BPE tokenizer.json
(trained here, with Qwen's special tokens) and a tokenizer_config.json holding a
ChatML chat template written for the test (test/chat_prompt.py) in the folder.
Then, through the real tools and binary:

  scripts/convert_gr00t_checkpoint.py CKPT --out model.pt --strict
      (no --model: the config is picked from config.json; the export records
      CKPT/tokenizer.json; the prompt is CKPT's chat template)
  scripts/convert_lerobot.py robot_sim.PickNPlace --tokenizer CKPT/tokenizer.json
      --formalize-language (episodes 0 and 1; upstream N1.7 formalizes task texts)
  loongforge-train (fp32, CPU, one thread) STEPS steps

and checks:
- the import picked gr00t-tiny's head and the checkpoint's tokenizer (the trainer
  refuses a model/dataset tokenizer mismatch, so training at all shows the record);
- export back (scripts/export_gr00t_checkpoint.py's table) of the imported model's
  tensors equals the upstream file bit for bit (less the tensors upstream never reads);
- the trainer's first-step loss equals the upstream module's loss on the trainer's
  first batch (rebuilt in Python by scripts/reference/lf_dataset.py's SampleBuilder,
  as the parity tests do): upstream's backbone gets the same normalized images and
  each sample's task text through transformers' Qwen3VLProcessor as lerobot's
  GrootN17VLMEncodeStep drives it (the chat template, the image placeholders
  expanded, left padding: test/chat_prompt.py); its head the same state, actions,
  mask, noise and time (its
  torch.randn and sample_time handed the trainer's draws). Tolerance 1e-5
  relative (fp32; the two compute with different kernels, and upstream divides by
  sum(mask) + 1e-6);
- the comparison can fail: rolling the batch's images by one sample moves upstream's
  loss by more than the tolerance;
- the loss decreases: the mean of the last 5 steps is below the mean of the first 5.

What this does not cover: upstream's resampling run here (both sides get the trainer's
frames: the import's bicubic_aa transform to the 64 target with the 58/64 crop, then the
processor's resize to 256; that those equal upstream's transform and processor is
test/reference/test_n17_pixel_values.py's); the bundled episodes share one task
text, so upstream's batch has no pads (prompts of different lengths:
test/scripts/test_chat_prompt.py). The N1.6 layout: test_gr00t_import_n16.py.

Environment (ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_MODELS (scratch),
LOONGFORGE_IMPORT_STEPS (default 300; the CI form runs fewer, the long form 300).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
STEPS = int(os.environ.get("LOONGFORGE_IMPORT_STEPS", "300"))
FIXTURE = Path(os.environ.get("LOONGFORGE_PICKNPLACE",
                              REPO.parent / "shared" / "datasets" / "robot_sim.PickNPlace")).resolve()
for p in (REPO / "scripts", REPO / "scripts" / "reference", REPO / "test", REPO / "test" / "data"):
    sys.path.insert(0, str(p))
import export_gr00t_checkpoint as export_back  # noqa: E402
import gr00t_checkpoint_names as ckpt_names  # noqa: E402
import chat_prompt  # noqa: E402
import lerobot_oracle  # noqa: E402

LOSS_RTOL = 1e-5
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """(oracle, the upstream GR00TN17 in memory, its checkpoint folder)."""
    oracle = lerobot_oracle.load()
    work = tmp_path_factory.mktemp("gr00t-import")
    tok = chat_prompt.write_chat_tokenizer(work / "tokenizer", chat_prompt.CHATML)
    (work / "backbone").mkdir()
    (work / "backbone/config.json").write_text(json.dumps(chat_prompt.small_qwen3vl_config(oracle, tok)))
    d = oracle.n17.GR00T_N1_7_DEFAULTS
    config = oracle.n17.GR00TN17Config(
        model_name=str(work / "backbone"), backbone_model_type="qwen", select_layer=2, backbone_embedding_dim=128,
        hidden_size=128, input_embedding_dim=128, max_seq_len=64, max_state_dim=64, max_action_dim=64,
        action_horizon=16, image_target_size=[64, 64], image_crop_size=[58, 58], state_dropout_prob=0.0,
        dtype="float32", model_dtype="float32",
        diffusion_model_cfg=dict(d["diffusion_model_cfg"], num_layers=4, num_attention_heads=4, attention_head_dim=32,
                                 dropout=0.0, output_dim=128),
        vl_self_attention_cfg=dict(d["vl_self_attention_cfg"], num_layers=2, num_attention_heads=4,
                                   attention_head_dim=32, dropout=0.0))
    torch.manual_seed(0)
    model = oracle.n17.GR00TN17(config, transformers_loading_kwargs={}, load_backbone_weights=False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            assert p.dtype == torch.float32
            if bool(p.min() == p.max()):   # constant-initialised (norms, biases): random, so a swap cannot pass
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            if name.startswith("action_head.") and p.dim() >= 2 and "position_embedding" not in name:
                # the head's matrices at N(0, 1/fan_in) instead of upstream's 0.02-scale init: the
                # predicted velocity is then not negligible next to the target, so the loss depends
                # on the backbone features (see the rolled-images check)
                fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    ckpt = work / "ckpt"
    model.save_pretrained(str(ckpt))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (ckpt / name).write_bytes((work / "tokenizer" / name).read_bytes())
    # the processor's settings, where a raw N1.7 checkpoint keeps them (upstream reads its image
    # geometry there, not from config.json)
    (ckpt / "processor_config.json").write_text(json.dumps({"processor_kwargs": {
        "image_target_size": [64, 64], "image_crop_size": [58, 58], "formalize_language": True}}))
    return oracle, model, ckpt


@pytest.fixture(scope="module")
def imported(upstream, tmp_path_factory):
    """(model.pt, the import's stdout, the converted dataset)."""
    _, _, ckpt = upstream
    work = tmp_path_factory.mktemp("imported")
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    r = subprocess.run([sys.executable, str(REPO / "scripts/convert_gr00t_checkpoint.py"), str(ckpt), "--out",
                        str(work / "model.pt"), "--strict"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(FIXTURE), str(work / "ds"),
                    "--tokenizer", str(ckpt / "tokenizer.json"), "--formalize-language", "--episodes", "0,1",
                    "--quiet"],
                   check=True, env=env)
    return work / "model.pt", r.stdout, work / "ds"


def trainer_sets(model, data, out):
    return [f"model.path={model}", f"data.path={data}", f"trainer.max_steps={STEPS}", "run.device=cpu",
            "precision.mode=fp32", "logging.progress=off", "checkpoint.interval_steps=100000", "run.threads=1",
            f"run.output_dir={out}", "run.name=import"]


def train_imported(sets, out):
    """Runs loongforge-train (n16-tiny.yaml + sets, run.name=import) and returns its STEPS losses."""
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml")]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (out / "import/metrics.jsonl").read_text().splitlines()]
    assert len(losses) == STEPS
    return losses


def test_the_import_picks_the_config_and_the_checkpoints_tokenizer(upstream, imported):
    _, _, ckpt = upstream
    model_pt, stdout, _ = imported
    assert "'gr00t_head': 'gr00t-tiny'" in stdout and "'backbone': 'qwen3vl'" in stdout, stdout
    assert f"tokenizer: {ckpt / 'tokenizer.json'}" in stdout, stdout
    assert f"chat template: {ckpt / 'tokenizer_config.json'}" in stdout, stdout
    assert "task texts formalized as upstream N1.7's" in stdout, stdout
    assert "image geometry from processor_config.json: target 64, crop 0.90625 of each side" in stdout, stdout
    assert ("data processing as upstream N1.7's for embodiment 'new_embodiment': slot 10 (upstream's table of "
            "released N1.7 tags); state/action min-max in float32 from the dataset's min / max") in stdout, stdout
    extra = {"loongforge/batch_spec.json": "", "loongforge/config.json": ""}
    torch.jit.load(str(model_pt), map_location="cpu", _extra_files=extra)
    record = json.loads(extra["loongforge/batch_spec.json"])["tokenizer"]
    assert record["kind"] == "hf_tokenizer_json" and record["file"] == str((ckpt / "tokenizer.json").resolve())
    assert record["text_form"] == "gr00t_formalized"
    cfg = json.loads(extra["loongforge/config.json"])
    assert (cfg["llm_layers"], cfg["vit_layers"], cfg["image_size"], cfg["gr00t_dropout"]) == (2, 3, 256, 0.0)
    assert cfg["image_target_size"] == 64                    # upstream's processor resizes 64 to 256
    assert cfg["image_crop_fraction"] == 58 / 64            # image_crop_size / image_target_size
    assert cfg["chat_template_ids"].count("-1") == 1 and cfg["chat_template_ids"].count("-2") == 1


def test_import_then_export_back_gives_the_upstream_tensors_bit_for_bit(upstream, imported):
    from safetensors.torch import load_file
    _, _, ckpt = upstream
    scripted = torch.jit.load(str(imported[0]), map_location="cpu")
    back, report = export_back.export_tensors({n: p.detach() for n, p in scripted.named_parameters()}, strict=True)
    src = {k: v for k, v in load_file(str(ckpt / "model.safetensors")).items()
           if not ckpt_names.known_unused(k, "n1.7")}
    assert report["layout"] == "n1.7" and set(back) == set(src)
    for k, v in src.items():
        assert torch.equal(back[k], v), k


def test_a_use_albumentations_checkpoint_imports_with_cv2s_transform_and_trains(upstream, imported, tmp_path):
    """The same checkpoint with processor_config.json's use_albumentations (Isaac-GR00T's default):
    the import takes upstream's cv2 INTER_AREA transform (image_resample cv2_area, its frames equal
    upstream's pixel_values: test_n17_pixel_values.py) with the crop's window drawn per sample as
    lerobot trains (image_random_crop), and loongforge-train trains with it, from another first loss
    than the default transform's frames give."""
    import shutil
    _, _, ckpt = upstream
    alb = tmp_path / "ckpt-albumentations"
    shutil.copytree(ckpt, alb)
    kw = json.loads((alb / "processor_config.json").read_text())
    kw["processor_kwargs"]["use_albumentations"] = True
    (alb / "processor_config.json").write_text(json.dumps(kw))
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    r = subprocess.run([sys.executable, str(REPO / "scripts/convert_gr00t_checkpoint.py"), str(alb), "--out",
                        str(tmp_path / "model.pt"), "--strict"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "image transform: OpenCV's INTER_AREA (use_albumentations)" in r.stdout, r.stdout
    extra = {"loongforge/config.json": ""}
    torch.jit.load(str(tmp_path / "model.pt"), map_location="cpu", _extra_files=extra)
    cfg = json.loads(extra["loongforge/config.json"])
    assert (cfg["image_resample"], cfg["image_target_size"], cfg["image_size"], cfg["image_resize_edge"],
            cfg["image_random_crop"]) == ("cv2_area", 64, 256, 0, True)   # the 58/64 crop's window drawn per sample
    sets = [s for s in trainer_sets(tmp_path / "model.pt", imported[2], tmp_path) if not s.startswith("trainer.max")]
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml")]
    for s in sets + ["trainer.max_steps=2"]:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads(line)["loss"] for line in (tmp_path / "import/metrics.jsonl").read_text().splitlines()]
    assert len(got) == 2 and all(x == x for x in got)
    default = tmp_path / "default"
    base = [s for s in trainer_sets(imported[0], imported[2], default) if not s.startswith("trainer.max")]
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml")]
    for s in base + ["trainer.max_steps=1"]:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True)
    first_default = json.loads((default / "import/metrics.jsonl").read_text().splitlines()[0])["loss"]
    print(f"use_albumentations import: step-1 loss {got[0]:.7f}, the default transform's {first_default:.7f}")
    assert got[0] != first_default


def upstream_loss_on(oracle, model, batch, ckpt, cfg) -> torch.Tensor:
    """The upstream GR00TN17's loss for our batch (its task texts through upstream's processor and
    the checkpoint's chat template), its noise and time draws replaced by the batch's."""
    from tokenizers import Tokenizer
    BF = oracle.n17.BatchFeature
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    texts = [tok.decode(ids[mask].tolist(), skip_special_tokens=False)
             for ids, mask in zip(batch["text_tokens"], batch["text_mask"])]
    enc = chat_prompt.upstream_prompt(chat_prompt.upstream_processor(ckpt, cfg), batch["images"], texts)
    head = model.action_head
    head.sample_time = lambda batch_size, device, dtype: batch["fm_t"].to(device, dtype)
    real_randn = torch.randn
    torch.randn = lambda *a, **k: batch["fm_noise"].clone()
    try:
        with torch.no_grad():
            features = model.backbone(BF(data={k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values",
                                                                   "image_grid_thw")}))
            out = head(features, BF(data={"state": batch["state"][:, None], "action": batch["actions"],
                                          "embodiment_id": batch["embodiment_id"],
                                          "action_mask": batch["action_mask"]}))
    finally:
        torch.randn = real_randn
        del head.sample_time
    return out["loss"]


def test_the_trainer_starts_at_upstreams_loss_and_lowers_it(upstream, imported, tmp_path):
    from lf_dataset import LFDataset, SampleBuilder
    from model.config import ModelConfig
    from train_torch import effective_config
    oracle, model, _ = upstream
    model_pt, _, ds = imported
    sets = trainer_sets(model_pt, ds, tmp_path)
    losses = train_imported(sets, tmp_path)

    cfg, _ = effective_config(Path(TRAIN), str(REPO / "configs/n16-tiny.yaml"), sets)
    extra = {"loongforge/config.json": "", "loongforge/batch_spec.json": ""}
    torch.jit.load(str(model_pt), map_location="cpu", _extra_files=extra)
    mcfg = ModelConfig.from_json(extra["loongforge/config.json"])
    record = json.loads(extra["loongforge/batch_spec.json"])["processor"]
    sb = SampleBuilder(LFDataset(ds), mcfg, cfg, processor=record)
    batch = sb.micro_batch(0, 0)
    # upstream's processor for this checkpoint (no statistics.json: the dataset's min / max; the default
    # tag new_embodiment: slot 10), as both trainers apply it (equal to upstream's: python_n17_processor)
    assert record["form"] == "gr00t_n17" and record["stats"] == "dataset" and record["clip"]
    assert (batch["embodiment_id"] == 10).all()
    model.train()
    up = float(upstream_loss_on(oracle, model, batch, upstream[2], mcfg))
    diff = abs(losses[0] - up) / abs(up)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # the comparison is sharp: the same batch with its images rolled by one sample moves upstream's loss
    # by far more than the tolerance
    rolled = float(upstream_loss_on(oracle, model, dict(batch, images=batch["images"].roll(1, dims=0)), upstream[2],
                                    mcfg))
    report = {"steps": STEPS, "trainer_step1_loss": losses[0], "upstream_loss": up, "rel_diff": diff,
              "rolled_images_rel_diff": abs(rolled - up) / abs(up), "mean_first5": first, "mean_last5": last}
    print(json.dumps(report))
    assert diff <= LOSS_RTOL < report["rolled_images_rel_diff"], report
    assert last < first, report
