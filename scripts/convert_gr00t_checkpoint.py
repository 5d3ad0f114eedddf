#!/usr/bin/env python3
"""Convert a GR00T-N1.6-style Hugging Face checkpoint to LoongForge names.

    python3 scripts/convert_gr00t_checkpoint.py SRC_DIR --out MODEL.pt [--strict] [--set KEY=VALUE ...]
        [--backbone-config CONFIG_JSON] [--tokenizer TOKENIZER_JSON] [--seed N]
        [--chat-template FILE | --no-chat-template] [--embodiment-tag TAG]
    python3 scripts/convert_gr00t_checkpoint.py SRC --model MODEL.pt --out OUT.safetensors [--strict]

Import (no --model): SRC_DIR is an upstream checkpoint folder (safetensors
shards + config.json, as `save_pretrained` writes it; GR00T N1.7 or N1.6).
The ModelConfig is picked from config.json (scripts/gr00t_upstream_config.py:
the head preset with the same shapes, the released backbone or the one named
by --backbone-config / a local `model_name` folder, upstream's freezing),
`--set` applies ModelConfig overrides (num_views, max_text_len: the data's
shape), the weights are converted onto it and MODEL.pt is written as
scripts/model/export.py writes exports, ready for `model.path`. The
tokenizer the export records is SRC_DIR/tokenizer.json when the checkpoint has
one (or --tokenizer): convert the dataset with the same file
(scripts/convert_lerobot.py --tokenizer); without one, the word hash. An N1.7
import, and an N1.6 import with a tokenizer (N1.6's is Eagle-Block2A-2B-v2's, in
Isaac-GR00T's gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2/, not in the
checkpoint: pass it with --tokenizer), also takes the tokenizer's chat template
(chat_template.jinja, chat_template.json or tokenizer_config.json next to that
tokenizer.json, or --chat-template) as upstream's prompt (scripts/chat_template.py,
scripts/model/prompt.py) and refuses without one unless --no-chat-template,
and reads processor_config.json's processor_kwargs as upstream's N1.7
processor does: formalize_language (the text form the export records) and
the image geometry (gr00t_upstream_config.n17_image_settings; a line says
what was taken and which config.json image fields upstream ignores). An N1.7
import also records how upstream's processor prepares state and actions for
--embodiment-tag (default new_embodiment, lerobot's default): its slot, the
checkpoint's statistics.json (or the dataset's) in float32 min-max with
clip_outliers, relative action groups, state dropout
(scripts/gr00t_processor.py; a line says what was taken). An N1.6 import
takes its image transform from processor_config.json's processor_kwargs as
Isaac-GR00T's Gr00tN1d6Processor builds it when they name an
image_target_size (gr00t_upstream_config.n16_image_settings), else
config.json's crop and the box resize (a line says which); with a
processor_config.json it also records Isaac-GR00T's N1.6 state/action
preparation for --embodiment-tag (gr00t_processor.n16_processor_record: its
slot table, float64 statistics, numpy's min-max, relative groups only with
use_relative_action) and formalize_language's N1.6 text form.

With --model, SRC is a safetensors file or a folder of them (sharded `model-0000X-of-0000N.safetensors`).
MODEL.pt is the exported LoongForge model the weights are for: its parameters
not found in SRC keep their values from MODEL.pt (and are listed), SRC tensors
with no LoongForge counterpart are listed and dropped, and a shape mismatch is
an error naming both keys. --strict turns any unmapped tensor into an error.
OUT loads with `safetensors.torch.load_file` into scripts/model and as
model.safetensors of a LoongForge checkpoint. A SRC folder holding a
tokenizer.json must match the tokenizer MODEL.pt was exported for (else an
error saying how to re-export).

The mapping (upstream name -> LoongForge name) is the table LAYOUT_MAPPING of
scripts/gr00t_checkpoint_names.py, one row per module kind and backbone layout, `{i}` a layer index and
`{p}` weight/bias; it is the single source of names and shapes (no tensor needs
a transpose: each LoongForge parameter has its upstream tensor's shape).
Layouts: "n1.7" (GR00T N1.7: `backbone.model.model.visual.*` Qwen3-VL ViT with
its merger and deepstack mergers, `backbone.model.model.language_model.*`),
"n1.6" (GR00T N1.6: `backbone.model.vision_model.vision_model.*` SigLIP-2,
`backbone.model.mlp1.*`, `backbone.model.language_model.model.*` Qwen3), and
"n16" (N1.5-style `backbone.eagle_model.*` names onto the n16 backbone,
scripts/model/layers.py, never checked against upstream code). The layout is read from the
target model's parameter names (`layout_of_model`). Tensors upstream's forward
never reads (the LM head, N1.7's final text norm, SigLIP's pooling head:
KNOWN_UNUSED) are reported as unused_known and never fail --strict.

test/scripts/test_gr00t_backbones.py converts random upstream backbones (the
lerobot 0.6.1 Qwen3Backbone for N1.7; transformers' Siglip2VisionModel and
Qwen3 for N1.6) with this table and checks features and gradients.

The action-head and embodiment rows are exact for the upstream-exact head of
scripts/model/gr00t_head.py (N1.6/N1.7: `vlln`, `vl_self_attention`,
AlternateVLDiT `action_head.model.*`, `position_embedding`, the
CategorySpecific MLPs; no tensor needs a transpose):
test/scripts/test_convert_gr00t_head.py converts a checkpoint written by
upstream's own GR00TN17ActionHead (lerobot 0.6.1) with --strict, and
test/model/test_gr00t_head.py uses `convert_tensors` to load upstream's
weights before comparing outputs and gradients. test/e2e/test_gr00t_import.py
(N1.7: lerobot's own save_pretrained) and test_gr00t_import_n16.py (the N1.6
layout) import whole checkpoints and train them with loongforge-train.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import model` (scripts/model)
from gr00t_checkpoint_names import ConversionError, convert_tensors  # noqa: E402

# torch, safetensors, scripts/model and the modules that import it (gr00t_upstream_config,
# chat_template, gr00t_processor) are imported in the functions that use them, so that --help
# answers without loading torch.


def load_source(src: Path) -> Dict:
    from safetensors.torch import load_file
    files = [src] if src.is_file() else sorted(src.glob("*.safetensors"))
    if not files:
        sys.exit(f"convert_gr00t_checkpoint: no .safetensors in {src}")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def checkpoint_tokenizer(src: Path):
    """SRC's tokenizer.json (a folder's own), or None."""
    path = src / "tokenizer.json" if src.is_dir() else None
    return path if path is not None and path.is_file() else None


def check_tokenizer(src: Path, model_path: Path, spec_text: str) -> None:
    """A checkpoint's tokenizer.json must be the one the target model reads ids of."""
    from model import tokenizer as tokenizers_
    tok = checkpoint_tokenizer(src)
    if tok is None:
        return
    want = tokenizers_.load(str(tok))[1]
    have = json.loads(spec_text).get("tokenizer", {}) if spec_text else {}
    if (have.get("kind"), have.get("sha256")) != (want["kind"], want["sha256"]):
        raise SystemExit(f"convert_gr00t_checkpoint: {tok} (sha256 {want['sha256'][:16]}...) is not the tokenizer "
                         f"{model_path} was exported for ({have.get('kind', 'word_hash')} {have.get('file', '')}); "
                         f"re-export it with scripts/model/export.py --tokenizer {tok}, or import without --model")


def convert(src: Path, model_path: Path, out: Path, strict: bool = False) -> Dict:
    import torch
    from safetensors.torch import save_file
    extra = {"loongforge/batch_spec.json": ""}
    from model import ops
    ops.load_if_built()  # model files with category_linear=grouped call loongforge:: operators
    scripted = torch.jit.load(str(model_path), map_location="cpu", _extra_files=extra)
    check_tokenizer(src, model_path, extra["loongforge/batch_spec.json"])
    ours = {n: p.detach().clone() for n, p in scripted.named_parameters()}
    try:
        converted, report = convert_tensors(load_source(src), ours, strict)
    except ConversionError as e:
        raise SystemExit(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(converted, str(out), metadata={"converted_from": str(src)})
    return report


def formalizes_language(processor_kwargs: Optional[Dict]) -> bool:
    """Whether upstream formalizes the task text: processor_config.json's processor_kwargs.formalize_language
    (lerobot 0.6.1's N1.7 and Isaac-GR00T's N1.6 processor read it there), true when absent."""
    value = (processor_kwargs or {}).get("formalize_language", True)
    return value if isinstance(value, bool) else True


def image_note(cfg, config: Dict, image: Dict) -> str:
    """One line on the N1.7 image geometry taken, and config.json's image fields that upstream's
    processor does not read when they differ from it."""
    crop = "none" if cfg.image_crop_fraction >= 1.0 else f"{cfg.image_crop_fraction:.6g} of each side"
    line = (f"image geometry from {image['source']}: target {cfg.image_target_size}, crop {crop}, "
            f"resize edge {cfg.image_resize_edge or cfg.image_target_size}, letterbox "
            f"{'on' if cfg.image_letterbox else 'off'}; the ViT sees {cfg.image_size} x {cfg.image_size}")
    from gr00t_upstream_config import N17_IMAGE_KEYS
    ignored = [k for k in N17_IMAGE_KEYS if k in config and config[k] is not None and config[k] != image.get(k)]
    if ignored:
        line += ("\nnote: config.json's " + ", ".join(f"{k}={config[k]!r}" for k in ignored) +
                 " not used: upstream's N1.7 processor reads processor_config.json (or its defaults)")
    window = ("a window drawn per sample, as upstream trains" if cfg.image_random_crop else "the center")
    line += (f"\nimage transform: OpenCV's INTER_AREA (use_albumentations), the crop at {window}"
             if cfg.image_resample == "cv2_area" else "\nimage transform: antialiased bicubic (upstream's default)")
    return line


def n16_image_note(cfg, processor: Optional[Dict]) -> str:
    """One line on the N1.6 image transform taken (Isaac-GR00T's Gr00tN1d6Processor from processor_config.json,
    or config.json's crop with the box resize)."""
    crop = "none" if cfg.image_crop_fraction >= 1.0 else f"{cfg.image_crop_fraction:.6g} of each side"
    if cfg.image_resample == "box":
        why = ("processor_config.json names no image_target_size" if processor is not None
               else "no processor_config.json")
        return (f"image transform: config.json's crop ({crop}), then the box resize to {cfg.image_size} ({why}; "
                "Isaac-GR00T's N1.6 processor is reproduced from processor_config.json only)")
    kind = ("OpenCV's INTER_AREA (use_albumentations), the crop at a window drawn per sample, as upstream trains"
            if cfg.image_resample == "cv2_area" else
            "antialiased bilinear (torchvision's), the crop at a window drawn per view, as upstream's RandomCrop trains"
            if cfg.image_random_crop else "antialiased bilinear (torchvision's), the center crop")
    return (f"image transform from processor_config.json: {kind}; target {cfg.image_target_size}, crop {crop}; "
            f"the ViT sees {cfg.image_size} x {cfg.image_size} (Eagle's processor does not resize)")


def import_checkpoint(src: Path, out: Path, strict: bool = False, overrides=(), backbone_config=None,
                      tokenizer=None, seed: int = 0, chat_template=None, no_chat_template: bool = False,
                      embodiment_tag: str = None) -> Dict:
    """SRC_DIR (config.json + safetensors) -> our export at out (see the module docstring). Returns the
    conversion report plus "config" (the ModelConfig's name and gr00t_head) and "tokenizer" (the file
    recorded, or None for the word hash) and "chat_template" (its source, or None) and "processor" (the data
    processing record of embodiment_tag, scripts/gr00t_processor.py; None for an N1.6 checkpoint without
    processor_config.json)."""
    import dataclasses

    import torch

    import chat_template as chat
    from gr00t_upstream_config import (UpstreamConfigError, model_config_from_upstream, n17_image_settings,
                                       read_backbone_config, read_processor_kwargs)
    from model import tokenizer as tokenizers_
    from model.export import save_model
    from model.registry import build_model
    if not (src / "config.json").is_file():
        raise SystemExit(f"convert_gr00t_checkpoint: {src}/config.json not found; importing needs the checkpoint "
                         "folder (safetensors + config.json), or pass --model for a bare tensor file")
    config = json.loads((src / "config.json").read_text())
    try:
        processor = read_processor_kwargs(src)
    except UpstreamConfigError as e:
        raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    try:
        backbone = read_backbone_config(config, backbone_config)
        cfg = model_config_from_upstream(config, backbone, list(overrides), processor_kwargs=processor)
    except (UpstreamConfigError, ValueError) as e:
        where = "config.json and processor_config.json" if processor is not None else "config.json"
        raise SystemExit(f"convert_gr00t_checkpoint: {src}/{where}: {e}") from None
    images = (image_note(cfg, config, n17_image_settings(processor)) if cfg.backbone == "qwen3vl"
              else n16_image_note(cfg, processor))
    data_processor = None
    if cfg.backbone == "qwen3vl":
        # upstream N1.7's state/action preparation for this embodiment (statistics.json, processor_kwargs)
        from gr00t_processor import DEFAULT_TAG, ProcessorError, n17_processor_record
        try:
            data_processor = n17_processor_record(src, processor, embodiment_tag or DEFAULT_TAG)
        except ProcessorError as e:
            raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    elif processor is not None:
        # Isaac-GR00T N1.6's state/action preparation for this embodiment (statistics.json, processor_kwargs)
        from gr00t_processor import DEFAULT_TAG, ProcessorError, n16_processor_record
        try:
            data_processor = n16_processor_record(src, processor, embodiment_tag or DEFAULT_TAG)
        except ProcessorError as e:
            raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    elif embodiment_tag:
        raise SystemExit(f"convert_gr00t_checkpoint: --embodiment-tag picks the statistics of processor_config.json "
                         f"and statistics.json, which {src} does not have; the import keeps the dataset's "
                         "normalization (docs/models.md s5)")
    tok = Path(tokenizer) if tokenizer else checkpoint_tokenizer(src)
    text_form = tokenizers_.RAW
    if tok is not None and formalizes_language(processor):
        # upstream formalizes the task text (processor_config.json's processor_kwargs, default true; N1.6's
        # processor is reproduced only from its processor_config.json)
        if cfg.backbone == "qwen3vl":
            text_form = tokenizers_.GR00T_FORMALIZED
        elif processor is not None:
            text_form = tokenizers_.GR00T_N16_FORMALIZED
    template_source = None
    n16_prompt = cfg.backbone == "eagle" and tok is not None
    if (cfg.backbone == "qwen3vl" or n16_prompt) and not no_chat_template:
        # upstream's prompt: the tokenizer's chat template around the images and the text (N1.7: images
        # first; N1.6: the text first, each image in Eagle's markers)
        n16 = None
        if n16_prompt:
            image_token_id = (backbone or {}).get("image_token_index")
            n16 = {"tokens_per_view": cfg.tokens_per_view, "image_size": cfg.image_size,
                   "probe_text": tokenizers_.formalize(chat.PROBE_TEXT, text_form)
                   if text_form == tokenizers_.GR00T_N16_FORMALIZED else chat.PROBE_TEXT}
        else:
            image_token_id = int((backbone or {}).get("image_token_id", chat.QWEN3VL_IMAGE_TOKEN_ID))
        try:
            fields, template_source = chat.import_fields(tok, Path(chat_template) if chat_template else None,
                                                         None if image_token_id is None else int(image_token_id),
                                                         cfg.num_views, cfg.vocab_size, n16)
            cfg = dataclasses.replace(cfg, **fields).validate()
        except (chat.TemplateError, ValueError) as e:
            raise SystemExit(f"convert_gr00t_checkpoint: {src}: {e}") from None
    elif chat_template:
        raise SystemExit("convert_gr00t_checkpoint: --chat-template is for N1.7 imports and N1.6 imports with a "
                         "tokenizer, and cannot be combined with --no-chat-template")
    torch.manual_seed(seed)
    model = build_model(cfg)
    ours = {n: p.detach() for n, p in model.named_parameters()}
    try:
        converted, report = convert_tensors(load_source(src), ours, strict)
    except ConversionError as e:
        raise SystemExit(str(e)) from None
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(converted[n])
    try:
        save_model(cfg, model, str(out), str(tok) if tok else None, text_form, data_processor)
    except ValueError as e:
        raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    return dict(report, config={"name": cfg.name, "gr00t_head": cfg.gr00t_head, "backbone": cfg.backbone},
                tokenizer=str(tok) if tok else None, chat_template=template_source, text_form=text_form,
                images=images, processor=data_processor)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("--model", type=Path, default=None,
                    help="an exported LoongForge model to convert onto (then --out is a .safetensors)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="import: a ModelConfig override (num_views, max_text_len, ...)")
    ap.add_argument("--backbone-config", type=Path, default=None,
                    help="import: the backbone's config.json when the checkpoint's model_name is not the released one")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="import: the tokenizer.json to record (default: SRC_DIR/tokenizer.json when present)")
    ap.add_argument("--seed", type=int, default=0, help="import: seed for parameters the checkpoint lacks")
    ap.add_argument("--chat-template", type=Path, default=None,
                    help="import (N1.7, N1.6 with a tokenizer): the chat template (.jinja, or a .json with "
                         "chat_template) instead of the one next to the tokenizer")
    ap.add_argument("--no-chat-template", action="store_true",
                    help="import (N1.7, N1.6 with a tokenizer): no chat template: the LM sees [images ; text] "
                         "(not upstream's prompt)")
    ap.add_argument("--embodiment-tag", default=None,
                    help="import: the embodiment whose statistics, slot and settings the data pipeline uses, "
                         "as lerobot's GrootConfig.embodiment_tag / Isaac-GR00T's embodiment tag (default "
                         "new_embodiment)")
    args = ap.parse_args(argv)
    if args.model is None:
        from model import tokenizer as tokenizers_
        r = import_checkpoint(args.src, args.out, args.strict, args.overrides, args.backbone_config, args.tokenizer,
                              args.seed, args.chat_template, args.no_chat_template, args.embodiment_tag)
        print(f"imported {args.src} as {r['config']} ({r['mapped']} tensors) -> {args.out}; tokenizer: "
              f"{r['tokenizer'] or 'word hash (no tokenizer.json in the checkpoint)'}"
              + (f"; chat template: {r['chat_template']}" if r["chat_template"] else "")
              + ("; task texts formalized as upstream N1.7's (convert the dataset with --formalize-language)"
                 if r["text_form"] == tokenizers_.GR00T_FORMALIZED else "")
              + ("; task texts formalized as Isaac-GR00T N1.6's (convert the dataset with --formalize-language n16)"
                 if r["text_form"] == tokenizers_.GR00T_N16_FORMALIZED else ""))
        if r["images"]:
            print(r["images"])
        if r["processor"]:
            from gr00t_processor import describe
            print(describe(r["processor"]))
    else:
        if (args.overrides or args.backbone_config or args.tokenizer or args.chat_template or args.no_chat_template
                or args.embodiment_tag):
            ap.error("--set, --backbone-config, --tokenizer, --(no-)chat-template and --embodiment-tag are for "
                     "importing (without --model)")
        r = convert(args.src, args.model, args.out, args.strict)
        print(f"mapped {r['mapped']} tensors -> {args.out}")
    if r["unused_known"]:
        print(f"dropped {len(r['unused_known'])} upstream tensors GR00T never reads: {r['unused_known']}")
    if r["unmapped_upstream"]:
        print(f"dropped {len(r['unmapped_upstream'])} upstream tensors without a LoongForge counterpart, e.g. "
              f"{r['unmapped_upstream'][:3]}")
    if r["kept_from_model"]:
        print(f"kept {len(r['kept_from_model'])} LoongForge parameters from "
              f"{args.model or 'the model built from config.json'}, e.g. {r['kept_from_model'][:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
