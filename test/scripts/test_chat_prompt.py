"""GR00T N1.7's chat-templated prompt (scripts/chat_template.py, scripts/model/prompt.py) against
upstream's: transformers 5.5.4's Qwen3VLProcessor driven as lerobot 0.6.1's
GrootN17VLMEncodeStep drives it (test/chat_prompt.py), and lerobot's own GR00TN17 (backbone and
head, random-initialised at small sizes, dropout 0) run on the processor's output.

- the ids: the import's template ids with the dataset's text ids in the text slot are the
  processor's input_ids of each sample (two chat templates written for the tests, one and two
  views), left-padded by upstream with the tokenizer's pad id;
- the model: on three samples whose texts have different lengths (so upstream pads two of
  them, and our text slot pads all three further), our model's loss equals GR00TN17's within
  1e-5 relative and the gradient of every tensor within 1e-4 (fp32, CPU); the backbone features
  of every real token and of a pad token equal upstream's within 1e-5;
- the comparison can fail: letting the head's vl_self_attention see every pad of our slot
  (hide_common_pads off) moves the loss by more than the tolerance;
- the text: with the checkpoint's formalize_language (upstream's default), task texts are
  formalized as upstream N1.7's formalize_language does (lower case, punctuation dropped, an
  empty instruction becomes "Perform the task.") before tokenization, and the tokenizer record
  says so (text_form), so that a dataset tokenized raw is refused;
- refusals: a tokenizer whose post-processor adds tokens, a template with the wrong number of
  image placeholders, a checkpoint without a template, a model with the wrong view count.
"""
import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
for p in (REPO / "scripts", REPO / "test", REPO / "test" / "data"):
    sys.path.insert(0, str(p))
import chat_prompt as cp  # noqa: E402
from chat_prompt import dataset_text  # noqa: E402
import chat_template as chat  # noqa: E402
import gr00t_checkpoint_names as ckpt_names  # noqa: E402
import lerobot_oracle  # noqa: E402
import model  # noqa: E402
from gr00t_upstream_config import model_config_from_upstream  # noqa: E402

FWD_RTOL = 1e-5
GRAD_RTOL = 1e-4
TEXTS = ["open the drawer", "pick the cube and place it in the bowl", "push the red block to the left"]
MAX_TEXT = 24
torch.set_num_threads(2)


def rel(a, b) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


@pytest.mark.parametrize("template", ["chatml", "chatml_system"])
@pytest.mark.parametrize("views", [1, 2])
def test_the_import_prompt_is_the_processors_input_ids(tmp_path, template, views):
    tok = cp.write_chat_tokenizer(tmp_path, {"chatml": cp.CHATML, "chatml_system": cp.CHATML_SYSTEM}[template])
    image_id = tok.token_to_id("<|image_pad|>")
    fields, source = chat.import_fields(tmp_path / "tokenizer.json", None, image_id, views, 8192)
    assert source == str(tmp_path / "tokenizer_config.json") and fields["pad_token_id"] == tok.token_to_id("<|endoftext|>")
    cfg = model.get_config("gr00t-n1.7-3b", image_size=64, num_views=views, max_text_len=MAX_TEXT, vocab_size=8192,
                           **fields)
    proc = cp.upstream_processor(tmp_path, cfg)
    enc = cp.upstream_prompt(proc, torch.zeros(3, views, 3, 64, 64), TEXTS)
    ids, mask = dataset_text(tmp_path / "tokenizer.json", TEXTS, MAX_TEXT)
    slots = [int(i) for i in fields["chat_template_ids"].split(",")]
    for b in range(3):
        ours = []
        for i in slots:
            ours += ([image_id] * cfg.tokens_per_view if i == chat.IMAGE_SLOT else
                     ids[b][mask[b]].tolist() if i == chat.TEXT_SLOT else [i])
        real = enc["attention_mask"][b].bool()
        assert enc["input_ids"][b][real].tolist() == ours
        assert bool((enc["input_ids"][b][~real] == fields["pad_token_id"]).all())
        assert torch.equal(real, real.sort(stable=True).values)      # padded on the left
    assert cfg.vl_len() == len(slots) - views - 1 + views * cfg.tokens_per_view + MAX_TEXT


# ---------------------------------------------------------------------------- the model

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(oracle, upstream GR00TN17, our model loaded from its tensors, cfg, tokenizer folder)."""
    oracle = lerobot_oracle.load()
    work = tmp_path_factory.mktemp("chat-prompt")
    tok = cp.write_chat_tokenizer(work / "backbone", cp.CHATML_SYSTEM)
    backbone = cp.small_qwen3vl_config(oracle, tok)
    (work / "backbone/config.json").write_text(json.dumps(backbone))
    d = oracle.n17.GR00T_N1_7_DEFAULTS
    config = oracle.n17.GR00TN17Config(
        model_name=str(work / "backbone"), backbone_model_type="qwen", select_layer=2, backbone_embedding_dim=128,
        hidden_size=128, input_embedding_dim=128, max_seq_len=64, max_state_dim=64, max_action_dim=64,
        action_horizon=16, image_target_size=[64, 64], image_crop_size=[58, 58], state_dropout_prob=0.0,
        dtype="float32", model_dtype="float32", tune_llm=True, tune_visual=True,
        diffusion_model_cfg=dict(d["diffusion_model_cfg"], num_layers=4, num_attention_heads=4, attention_head_dim=32,
                                 dropout=0.0, output_dim=128),
        vl_self_attention_cfg=dict(d["vl_self_attention_cfg"], num_layers=2, num_attention_heads=4,
                                   attention_head_dim=32, dropout=0.0))
    torch.manual_seed(0)
    up = oracle.n17.GR00TN17(config, transformers_loading_kwargs={}, load_backbone_weights=False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in up.named_parameters():
            if bool(p.min() == p.max()):   # constant-initialised: random, so a swap cannot pass
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            if name.startswith("action_head.") and p.dim() >= 2 and "position_embedding" not in name:
                fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    up_config = json.loads(json.dumps(config.to_dict(), default=str))
    cfg = model_config_from_upstream(up_config, backbone, ["num_views=2", f"max_text_len={MAX_TEXT}"])
    fields, _ = chat.import_fields(work / "backbone/tokenizer.json", None, backbone["image_token_id"], 2,
                                   cfg.vocab_size)
    cfg = model.ModelConfig.from_json(json.dumps(dict(json.loads(cfg.to_json()), **fields))).validate()
    cfg.tune_visual = cfg.tune_llm = True
    torch.manual_seed(1)
    ours = model.build_model(cfg)
    converted, report = ckpt_names.convert_tensors(dict(up.state_dict()), dict(ours.state_dict()), strict=True,
                                             layout="n1.7")
    ours.load_state_dict(converted)
    for p in ours.parameters():
        p.requires_grad_(True)
    for p in up.parameters():
        p.requires_grad_(True)
    return oracle, up.eval(), ours.eval(), cfg, work / "backbone"


def batches(cfg, folder: Path):
    """Our batch (three samples, two views, TEXTS) and upstream's processor output for it."""
    from model.batch import example_batch
    batch = example_batch(cfg, 3, seed=5)
    batch["text_tokens"], batch["text_mask"] = dataset_text(folder / "tokenizer.json", TEXTS, MAX_TEXT)
    enc = cp.upstream_prompt(cp.upstream_processor(folder, cfg), batch["images"], TEXTS)
    return batch, enc


def upstream_loss(oracle, up, enc, batch):
    BF = oracle.n17.BatchFeature
    head = up.action_head
    head.sample_time = lambda batch_size, device, dtype: batch["fm_t"].to(device, dtype)
    real_randn = torch.randn
    torch.randn = lambda *a, **k: batch["fm_noise"].clone()
    try:
        features = up.backbone(BF(data={k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values",
                                                             "image_grid_thw")}))
        backbone_out = {k: v.clone() for k, v in features.items()}   # the head replaces backbone_features
        out = head(features, BF(data={"state": batch["state"][:, None], "action": batch["actions"],
                                      "embodiment_id": batch["embodiment_id"], "action_mask": batch["action_mask"]}))
    finally:
        torch.randn = real_randn
        del head.sample_time
    return out["loss"], backbone_out


def test_templated_backbone_features_are_upstreams_at_every_real_token_and_pad(pair):
    oracle, up, ours, cfg, folder = pair
    batch, enc = batches(cfg, folder)
    assert enc["attention_mask"].sum(1).unique().numel() == 3        # three prompt lengths: upstream pads two
    with torch.no_grad():
        _, features = upstream_loss(oracle, up, enc, batch)
        vl, key_mask, image_mask = ours.encode_vl(batch)
    up_feats, up_mask = features["backbone_features"], features["backbone_attention_mask"]
    worst = 0.0
    for b in range(3):
        assert torch.equal(image_mask[b][key_mask[b]], features["image_mask"][b][up_mask[b]])
        worst = max(worst, rel(vl[b][key_mask[b]], up_feats[b][up_mask[b]]))
        if not bool(up_mask[b].all()):     # a pad: position-independent, the same on both sides
            worst = max(worst, rel(vl[b][~key_mask[b]][0], up_feats[b][~up_mask[b]][0]))
    print(f"templated N1.7 backbone: features max rel diff {worst:.3g}")
    assert worst <= FWD_RTOL


def test_templated_model_loss_and_gradients_equal_upstream_gr00t_n17(pair):
    oracle, up, ours, cfg, folder = pair
    batch, enc = batches(cfg, folder)
    up.zero_grad()
    ours.zero_grad()
    up_loss, _ = upstream_loss(oracle, up, enc, batch)
    our_loss = ours(batch)["loss"]
    up_loss.backward()
    our_loss.backward()
    our_value, up_value = our_loss.item(), up_loss.item()
    loss_rel = abs(our_value - up_value) / abs(up_value)
    mine = dict(ours.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in up.parameters() if p.grad is not None)
    worst, worst_name, checked, zero = 0.0, "", 0, []
    for name, p in up.named_parameters():
        ours_name = ckpt_names.to_loongforge(name, "n1.7")
        if not ours_name:
            assert ckpt_names.known_unused(name, "n1.7"), name
            continue
        if p.grad is None:     # upstream's forward never reaches it (e.g. a deepstack after the last kept layer)
            assert mine[ours_name].grad is None or float(mine[ours_name].grad.abs().max()) == 0, name
            continue
        if float(p.grad.abs().max()) <= 1e-7 * scale:
            # zero but for rounding on both sides (the attention key biases: softmax ignores a shift
            # shared by a row's logits), so not compared relatively
            assert float(mine[ours_name].grad.abs().max()) <= 1e-6 * scale, name
            zero.append(ours_name)
            continue
        r = rel(mine[ours_name].grad, p.grad)
        checked += 1
        if r > worst:
            worst, worst_name = r, ours_name
    print(f"templated N1.7 model: loss {our_value:.7f} vs {up_value:.7f} (rel {loss_rel:.3g}); "
          f"gradients of {checked} tensors, max rel diff {worst:.3g} ({worst_name}); {len(zero)} zero: {zero}")
    assert loss_rel <= FWD_RTOL, (our_value, up_value)
    assert worst <= GRAD_RTOL, (worst, worst_name)
    assert checked >= 60


def test_the_comparison_fails_when_vl_self_attention_sees_every_pad_of_the_slot(pair):
    oracle, up, ours, cfg, folder = pair
    batch, enc = batches(cfg, folder)
    with torch.no_grad():
        up_loss = float(upstream_loss(oracle, up, enc, batch)[0])
        ours.hide_common_pads = False
        try:
            seen_all = float(ours(batch)["loss"])
        finally:
            ours.hide_common_pads = True
    assert abs(seen_all - up_loss) / abs(up_loss) > 10 * FWD_RTOL


def test_formalized_task_text_is_upstreams_formalize_language():
    """The text form N1.7 imports read (scripts/model/tokenizer.py formalize) against lerobot's own
    prepare_n1_7_language_batch(formalize_language=True)."""
    from model.tokenizer import formalize
    utils = lerobot_oracle.load().utils
    texts = ["Pick the cube, then place it IN the bowl!", "open drawer #3 (top)", "move_left 10cm", "",
             "Stack the Caf\u00e9 cups: \u00c9tape 2.", "tab\tand\nnewline", "\u00bd turn \u2013 left"]
    assert [formalize(t) for t in texts] == utils.prepare_n1_7_language_batch(texts, len(texts),
                                                                             formalize_language=True)


# ---------------------------------------------------------------------------- refusals

def test_a_tokenizer_that_adds_tokens_around_text_is_refused(tmp_path):
    from test_tokenizer_hf import train_bpe
    tok = train_bpe(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0].content[0].type }}"
                                                                "<unk>{{ messages[0].content[1].text }}"}))
    with pytest.raises(chat.TemplateError, match="do not tokenize as its whole prompt"):
        chat.import_fields(tmp_path / "tokenizer.json", None, tok.token_to_id("<unk>"), 1, 8192)


def test_a_template_with_another_number_of_images_is_refused(tmp_path):
    tok = cp.write_chat_tokenizer(tmp_path, cp.CHATML)
    (tmp_path / "one.jinja").write_text("<|vision_start|><|image_pad|><|vision_end|>{{ messages[0].content[-1].text }}")
    with pytest.raises(chat.TemplateError, match="renders 1 image placeholders .* for 2 images"):
        chat.import_fields(tmp_path / "tokenizer.json", tmp_path / "one.jinja", tok.token_to_id("<|image_pad|>"), 2,
                           8192)


def test_a_tokenizer_without_a_template_is_refused_naming_the_options(tmp_path):
    cp.write_chat_tokenizer(tmp_path, cp.CHATML)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(chat.TemplateError, match="--chat-template FILE, or --no-chat-template"):
        chat.import_fields(tmp_path / "tokenizer.json", None, 5, 1, 8192)


def test_a_model_whose_views_do_not_fill_the_template_is_refused():
    with pytest.raises(ValueError, match="chat_template_ids.*2 image slots .* num_views=1"):
        model.get_config("gr00t-n1.7-3b", chat_template_ids="1,-1,4,-1,4,-2,2")
    with pytest.raises(ValueError, match="only the exact backbones"):
        model.get_config("gr00t-tiny", chat_template_ids="1,-1,-2")
    with pytest.raises(ValueError, match="puts an image after the text slot"):
        model.get_config("gr00t-n1.7-3b", chat_template_ids="1,-2,-1")
    model.get_config("gr00t-n1.6-3b", chat_template_ids="1,-2,-1")      # N1.6: the text first
