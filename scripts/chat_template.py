"""A GR00T N1.7 or N1.6 checkpoint's chat template as the token ids of model/prompt.py.

Upstream N1.7 (lerobot 0.6.1 GrootN17VLMEncodeStep) formats each sample as one user message,
[{"type": "image"} per (frame, view) ..., {"type": "text", "text": task}], renders it with the
tokenizer's chat template (add_generation_prompt False; transformers' processor passes the
tokenizer's special tokens to the template), expands each image token into the image's
merged tokens and tokenizes the whole string. Upstream N1.6 (Isaac-GR00T Gr00tN1d6Processor with
Eagle-Block2A-2B-v2's Eagle3_VLProcessor) puts the text first, [{"type": "text"}, {"type":
"image"} per view ...], and Eagle's processor replaces each `<image-k>` the template renders by
`<image k>` + image_start_token + image_token x (H W / pixels_per_token) + image_end_token
(`EAGLE_PROCESSOR`, overridable by the tokenizer folder's processor_config.json) before it
tokenizes. `template_ids` renders the same message once, with the text replaced by a sentinel,
and tokenizes the pieces between the image tokens and the sentinel; the task text itself is the
dataset's (scripts/convert_lerobot.py --tokenizer).

Contract
- `find_template(folder)` -> (template text, the file it came from) or None: the folder's
  chat_template.jinja, chat_template.json ("chat_template"), or tokenizer_config.json's
  "chat_template" (a string, or the "default" entry of a list of named templates), in that
  order, as transformers reads a tokenizer's template.
- `read_template(path)` -> template text of a .jinja/.txt file or a .json file as above.
- `template_ids(template, tokenizer_json, image_token_id, num_images, special, eagle=None,
  probe_text=PROBE_TEXT)` -> (ids with IMAGE_SLOT/TEXT_SLOT, rendered text); eagle (the Eagle
  processor's settings) selects N1.6's message and expansion: raises TemplateError (what and how
  to fix) when the template cannot be rendered offline, does not produce exactly num_images
  images (N1.7: all before the text; N1.6: `<image-1>` ... `<image-N>` in order) and one text,
  or when its pieces do not tokenize as the whole string does (then the dataset's separately
  tokenized text would not be upstream's ids); the check tokenizes a probe prompt with
  probe_text the way the processor does (special tokens of the tokenizer's post-processor
  included).
- `eagle_settings(folder)` -> EAGLE_PROCESSOR with the folder's processor_config.json values of
  the same keys.
- `import_fields(tokenizer_json, template_file, image_token_id, num_images, vocab_size, n16=None)`
  -> ({"chat_template_ids", "pad_token_id"}, template source) for
  scripts/convert_gr00t_checkpoint.py; pad_token_id is the tokenizer_config.json pad_token's id
  (0 without one: upstream's processor then cannot pad a batch of prompts of different lengths
  at all). n16 = {"tokens_per_view", "image_size", "probe_text"} makes it N1.6's prompt: the
  image token is the Eagle processor's image_token (its id must be image_token_id when that is
  not None), and an image's token count H W / pixels_per_token must be tokens_per_view.
- `special_tokens(folder)` -> {"bos_token": "...", ...} from tokenizer_config.json (what
  transformers passes the template); `pad_token_id(folder, tokenizer_json)` -> the id of its
  pad_token or None.
"""

import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from model.prompt import IMAGE_SLOT, TEXT_SLOT

SENTINEL = "\u2063LOONGFORGE_TASK_TEXT\u2063"
PROBE_TEXT = "Perform the task."   # upstream's default instruction
# Eagle3_VLProcessor's __init__ defaults (Isaac-GR00T processing_eagle3_vl.py, Eagle-Block2A-2B-v2)
EAGLE_PROCESSOR = {"image_token": "<IMG_CONTEXT>", "image_placeholder": "image", "video_placeholder": "video",
                   "image_start_token": "<img>", "image_end_token": "</img>", "pixels_per_token": 28 * 28}


class TemplateError(ValueError):
    pass


def _template_of_json(data, source: Path) -> Optional[str]:
    t = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(t, list):
        named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
        t = named.get("default")
    if t is not None and not isinstance(t, str):
        raise TemplateError(f"{source}: chat_template is neither a string nor a list of named templates")
    return t


def read_template(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as e:
        raise TemplateError(f"{path}: cannot read the chat template ({e})") from None
    if path.suffix == ".json":
        try:
            t = _template_of_json(json.loads(text), path)
        except json.JSONDecodeError as e:
            raise TemplateError(f"{path}: not JSON ({e})") from None
        if t is None:
            raise TemplateError(f"{path}: has no chat_template")
        return t
    return text


def find_template(folder: Path) -> Optional[Tuple[str, Path]]:
    if (folder / "chat_template.jinja").is_file():
        return read_template(folder / "chat_template.jinja"), folder / "chat_template.jinja"
    for name in ("chat_template.json", "tokenizer_config.json"):
        p = folder / name
        if p.is_file():
            try:
                t = _template_of_json(json.loads(p.read_text()), p)
            except json.JSONDecodeError as e:
                raise TemplateError(f"{p}: not JSON ({e})") from None
            if t is not None:
                return t, p
    return None


def _token_text(v) -> Optional[str]:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def special_tokens(folder: Path) -> Dict[str, str]:
    p = folder / "tokenizer_config.json"
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        t = _token_text(data.get(k))
        if t is not None:
            out[k] = t
    return out


def _tokenizer(tokenizer_json: Path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(tokenizer_json))


def pad_token_id(folder: Path, tokenizer_json: Path) -> Optional[int]:
    t = special_tokens(folder).get("pad_token")
    return None if t is None else _tokenizer(tokenizer_json).token_to_id(t)


def eagle_settings(folder: Path) -> Dict:
    out = dict(EAGLE_PROCESSOR)
    p = folder / "processor_config.json"
    if p.is_file():
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise TemplateError(f"{p}: not JSON ({e})") from None
        for k in out:
            if k in data:
                if not isinstance(data[k], type(out[k])):
                    raise TemplateError(f"{p}: {k} must be a {type(out[k]).__name__}, not {data[k]!r}")
                out[k] = data[k]
    return out


def eagle_expand(rendered: str, num_images: int, eagle: Dict) -> str:
    """Eagle3_VLProcessor.replace_media_placeholder on a rendered prompt, each image's tokens given as
    one image_token: `<image-k>` -> `<image k>` start image_token end. Refuses videos and markers
    that are not `<image-1>` ... `<image-num_images>` in order (each takes that image of the sample)."""
    pattern = re.compile(rf"<({re.escape(eagle['image_placeholder'])}|{re.escape(eagle['video_placeholder'])})"
                         r"-(\d+)>")
    seen: List[int] = []

    def repl(m):
        if m.group(1) != eagle["image_placeholder"]:
            raise TemplateError(f"the chat template renders a video marker {m.group(0)!r} for a message of images")
        seen.append(int(m.group(2)))
        return f"<image {m.group(2)}>{eagle['image_start_token']}{eagle['image_token']}{eagle['image_end_token']}"

    out = pattern.sub(repl, rendered)
    if seen != list(range(1, num_images + 1)):
        raise TemplateError(f"the chat template renders the image markers {seen} for {num_images} images (num_views); "
                            f"Eagle's processor needs <{eagle['image_placeholder']}-1> ... in order")
    return out


def render(template: str, num_images: int, text: str, special: Dict[str, str], text_first: bool = False) -> str:
    """The template rendered for upstream's message: num_images images, then the text (N1.7), or the
    text, then the images (text_first: N1.6)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    images = [{"type": "image", "image": "image"} for _ in range(num_images)]
    content = [{"type": "text", "text": text}] + images if text_first else images + [{"type": "text", "text": text}]
    try:
        return env.from_string(template).render(messages=[{"role": "user", "content": content}], tools=None,
                                                documents=None, add_generation_prompt=False, **special)
    except jinja2.exceptions.TemplateError as e:
        raise TemplateError(f"the chat template does not render offline for one user message of {num_images} "
                            f"images and a text ({type(e).__name__}: {e})") from None


def template_ids(template: str, tokenizer_json: Path, image_token_id: int, num_images: int,
                 special: Dict[str, str], eagle: Optional[Dict] = None,
                 probe_text: str = PROBE_TEXT) -> Tuple[List[int], str]:
    tok = _tokenizer(tokenizer_json)
    image_token = tok.id_to_token(image_token_id)
    if image_token is None:
        raise TemplateError(f"{tokenizer_json}: has no token of the backbone's image_token_id {image_token_id}")

    def prompt(text: str) -> str:
        if eagle is None:
            return render(template, num_images, text, special)
        return eagle_expand(render(template, num_images, text, special, text_first=True), num_images, eagle)

    rendered = prompt(SENTINEL)
    if rendered.count(SENTINEL) != 1:
        raise TemplateError(f"the chat template puts the task text {rendered.count(SENTINEL)} times into the prompt; "
                            "upstream's message has it once")
    before, after = rendered.split(SENTINEL)
    if rendered.count(image_token) != num_images or (eagle is None and image_token in after):
        raise TemplateError(f"the chat template renders {rendered.count(image_token)} image placeholders "
                            f"({image_token!r}) for {num_images} images (num_views)"
                            + (", all before the text" if eagle is None else ""))
    ids: List[int] = []
    for part, slot in ((before, [TEXT_SLOT]), (after, [])):
        for i, piece in enumerate(part.split(image_token)):
            if i:
                ids.append(IMAGE_SLOT)
            ids.extend(tok.encode(piece, add_special_tokens=False).ids)
        ids.extend(slot)
    # the processor tokenizes the whole prompt (post-processor included) with each image token
    # expanded; the pieces must give the same ids, the text the ids the dataset stores
    probe_ids = tok.encode(probe_text, add_special_tokens=False).ids
    probe = prompt(probe_text)
    whole = tok.encode(probe.replace(image_token, image_token * 2)).ids
    expect = [j for i in ids for j in ([image_token_id] * 2 if i == IMAGE_SLOT else probe_ids if i == TEXT_SLOT else [i])]
    if whole != expect:
        raise TemplateError(f"{tokenizer_json}: the chat template's pieces do not tokenize as its whole prompt does "
                            f"for the text {probe_text!r} (whole {whole[:24]}..., pieces {expect[:24]}...): a token "
                            "spans an image token or the text's edge, or the tokenizer's post-processor adds tokens; "
                            "this prompt cannot be built from the dataset's text ids")
    return ids, rendered


QWEN3VL_IMAGE_TOKEN_ID = 151655    # transformers' Qwen3VLConfig default (Cosmos-Reason2-2B's)


def import_fields(tokenizer_json: Optional[Path], template_file: Optional[Path], image_token_id: Optional[int],
                  num_images: int, vocab_size: int, n16: Optional[Dict] = None) -> Tuple[Dict, str]:
    """ModelConfig fields (chat_template_ids, pad_token_id) of an N1.7 import (an N1.6 one with n16,
    see the module docstring) and where the template came from: template_file, else the tokenizer's
    folder (find_template). Raises TemplateError saying how to go on."""
    version = "N1.6" if n16 else "N1.7"
    if tokenizer_json is None:
        raise TemplateError(f"an {version} prompt is its chat template tokenized by the checkpoint's tokenizer, and "
                            "the import has no tokenizer.json: pass --tokenizer FILE (or --no-chat-template to "
                            "train on [images ; text], which is not upstream's prompt)")
    folder = tokenizer_json.parent
    if template_file is not None:
        found = (read_template(template_file), template_file)
    else:
        found = find_template(folder)
    if found is None:
        raise TemplateError(f"no chat template next to {tokenizer_json} (chat_template.jinja, chat_template.json or "
                            "tokenizer_config.json's chat_template, where upstream's processor reads it): pass "
                            "--chat-template FILE, or --no-chat-template to train on [images ; text], which is not "
                            "upstream's prompt")
    template, source = found
    eagle, probe_text = None, PROBE_TEXT
    if n16:
        eagle = eagle_settings(folder)
        probe_text = n16["probe_text"]
        found_id = _tokenizer(tokenizer_json).token_to_id(eagle["image_token"])
        if found_id is None:
            raise TemplateError(f"{tokenizer_json}: has no token {eagle['image_token']!r}, the image token of Eagle's "
                                "processor; is this the Eagle backbone's tokenizer?")
        if image_token_id is not None and found_id != image_token_id:
            raise TemplateError(f"{tokenizer_json}: Eagle's image token {eagle['image_token']!r} is id {found_id}, but "
                                f"the backbone's image_token_index is {image_token_id}")
        image_token_id = found_id
        per_image = n16["image_size"] ** 2 // eagle["pixels_per_token"]
        if per_image != n16["tokens_per_view"]:
            raise TemplateError(f"Eagle's processor gives a {n16['image_size']} px image {per_image} tokens "
                                f"(pixels_per_token {eagle['pixels_per_token']}), the backbone makes "
                                f"{n16['tokens_per_view']}")
    ids, _ = template_ids(template, tokenizer_json, image_token_id, num_images, special_tokens(folder), eagle,
                          probe_text)
    bad = [i for i in ids if i >= vocab_size]
    if bad:
        raise TemplateError(f"{source}: the prompt's token ids {bad[:5]} are outside the backbone's vocabulary "
                            f"({vocab_size}); is {tokenizer_json} the backbone's tokenizer?")
    pad = pad_token_id(folder, tokenizer_json)
    return {"chat_template_ids": ",".join(str(i) for i in ids), "pad_token_id": 0 if pad is None else pad}, str(source)


__all__ = ["TemplateError", "find_template", "read_template", "special_tokens", "pad_token_id", "render",
           "eagle_settings", "eagle_expand", "template_ids", "import_fields", "EAGLE_PROCESSOR",
           "QWEN3VL_IMAGE_TOKEN_ID"]
