"""The LM prompt layout of a chat-templated GR00T N1.7 or N1.6 model (`ModelConfig.chat_template_ids`).

Upstream (lerobot 0.6.1's GrootN17VLMEncodeStep) renders one user message per sample with the
checkpoint's chat template, [image per (frame, view) ..., the task text], has the Qwen3-VL
processor expand each image token into that image's merged tokens, tokenizes the whole
string and pads the batch on the left to its longest prompt. An import renders the same
template once (scripts/chat_template.py) and stores it as token ids with two slot markers:

    IMAGE_SLOT (-1)  one image: that view's tokens (tokens_per_view of them)
    TEXT_SLOT  (-2)  the task text: the dataset's text tokens (max_text_len, text_mask)

e.g. `<|im_start|>user\\n` -1-wrapped-in-vision-start/end ... -2 `<|im_end|>\\n` (N1.7: the images
before the text), or `<|im_start|>user\\n` -2 `<image 1><img>` -1 `</img>` ... `<|im_end|>\\n` (N1.6:
Isaac-GR00T's conversation puts the text first, Eagle's processor expands each `<image-k>`).

Contract
- `parse_ids(text)` -> List[int] (comma-separated; "" = no template).
- `check(ids, num_views, vocab_size, images_first=True)` -> an error message or "" (one TEXT_SLOT,
  num_views IMAGE_SLOTs, with images_first all before it (N1.7's multimodal RoPE positions are
  laid out for that order only), ids inside the vocabulary).
- `PromptLayout(ids, tokens_per_view, merged_grid, max_text_len)`: the model's static sequence
  (the "slot order": the template's tokens where they stand, each image's tokens in its slot,
  the text slot max_text_len wide with its padding where the dataset puts it, at the end of the
  slot) as plain lists the model turns into buffers:
    length         S = fixed template tokens + num_views * tokens_per_view + max_text_len
    slot_ids       (S,) the template's id at each position, IMAGE_SLOT at image tokens, TEXT_SLOT
                   across the text slot
    image_index    positions of the image tokens, view after view (before or after the text slot)
    text_start     first position of the text slot; tail_count the positions after the slot
    head_pos       (3, text_start) multimodal RoPE positions of everything before the text slot
                   (upstream's get_rope_index: text tokens one step each; an image's tokens at
                   t = p, h = p + row, w = p + col, after which p advances by merged_grid)
    text_pos0      the position of the first text token; the tail (the positions after the
                   text slot) continues from text_pos0 + the sample's text length. These
                   two are N1.7's multimodal positions; N1.6's Qwen3 counts every token
                   once (position = slot-order index before the slot, text_start + the
                   number of real tokens before it after that: model/gr00t.py).
  Attention runs in slot order: a token sees the real tokens before it, as upstream's causal
  mask over its left-padded sequence lets it (real tokens keep their order); the RoPE
  positions are upstream's, so the result at every real token is upstream's. Upstream's pad
  tokens see nothing (every key masked; torch's attention gives them a zero output): the
  model zeroes their attention output, so a pad's features depend only on the pad id, as
  upstream's do. Which pads upstream's vl_self_attention sees (the batch is padded to its
  longest prompt) is the head's `hide_common_pads` (model/gr00t_head.py).
"""

from typing import List

IMAGE_SLOT = -1
TEXT_SLOT = -2


def parse_ids(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def check(ids: List[int], num_views: int, vocab_size: int, images_first: bool = True) -> str:
    """'' when ids is a usable template for num_views images, else what is wrong."""
    if ids.count(TEXT_SLOT) != 1:
        return f"must hold exactly one text slot ({TEXT_SLOT}); it has {ids.count(TEXT_SLOT)}"
    if ids.count(IMAGE_SLOT) != num_views:
        return (f"has {ids.count(IMAGE_SLOT)} image slots ({IMAGE_SLOT}) but the model has num_views={num_views}; "
                "re-import with the data's views (--set num_views=N)")
    if images_first and IMAGE_SLOT in ids[ids.index(TEXT_SLOT):]:
        return "puts an image after the text slot; upstream N1.7's prompt has the images first"
    bad = [i for i in ids if i not in (IMAGE_SLOT, TEXT_SLOT) and not 0 <= i < vocab_size]
    if bad:
        return f"holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
    return ""


class PromptLayout:
    def __init__(self, ids: List[int], tokens_per_view: int, merged_grid: int, max_text_len: int):
        def width(tok: int) -> int:
            return tokens_per_view if tok == IMAGE_SLOT else max_text_len if tok == TEXT_SLOT else 1

        self.slot_ids: List[int] = [tok for t in ids for tok in [t] * width(t)]
        self.length = len(self.slot_ids)
        self.image_index = [i for i, t in enumerate(self.slot_ids) if t == IMAGE_SLOT]
        head = ids[:ids.index(TEXT_SLOT)] if TEXT_SLOT in ids else []
        self.text_start = sum(width(t) for t in head) if TEXT_SLOT in ids else -1
        self.tail_count = self.length - self.text_start - max_text_len if TEXT_SLOT in ids else 0
        # N1.7's multimodal positions of everything before the text slot
        self.head_pos: List[List[int]] = [[], [], []]
        pos = 0
        for tok in head:
            if tok == IMAGE_SLOT:
                for r in range(merged_grid):
                    for c in range(merged_grid):
                        self.head_pos[0].append(pos)
                        self.head_pos[1].append(pos + r)
                        self.head_pos[2].append(pos + c)
                pos += merged_grid
            else:
                for d in range(3):
                    self.head_pos[d].append(pos)
                pos += 1
        self.text_pos0 = pos if TEXT_SLOT in ids else -1


__all__ = ["IMAGE_SLOT", "TEXT_SLOT", "parse_ids", "check", "PromptLayout"]
