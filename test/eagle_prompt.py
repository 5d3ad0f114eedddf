"""Test fixtures for chat-templated N1.6 prompts (scripts/chat_template.py with Eagle's processor,
scripts/model/prompt.py).

- `write_eagle_tokenizer(folder, template)`: a small byte-level BPE tokenizer.json trained here with
  the special tokens Eagle-Block2A-2B-v2's processor uses (<|endoftext|> as the pad, <|im_start|>,
  <|im_end|>, <img>, </img>, <IMG_CONTEXT>) and no post-processor, and a tokenizer_config.json
  carrying `template` as its chat_template. Returns the tokenizers.Tokenizer.
- EAGLE_CHAT: a chat template written for these tests (not Eagle's own, which ships in no package):
  a system message, then one ChatML user message whose images render as `<image-k>` markers
  numbered in order, the markers Eagle's processor expands.
- `upstream_eagle_prompt(folder, texts, num_images, tokens_per_image)` -> (input_ids, attention_mask):
  Isaac-GR00T's N1.6 steps: Gr00tN1d6Processor._apply_vlm_processing's conversation (the text,
  then one image per view), apply_chat_template (tokenize=False, add_generation_prompt=False) with
  transformers' tokenizer of the folder, Eagle3_VLProcessor.replace_media_placeholder's expansion
  (`<image-k>` -> `<image k><img>` + `<IMG_CONTEXT>` x tokens + `</img>`; Isaac-GR00T
  processing_eagle3_vl.py, transcribed: the processor ships in no package), and the collator's
  tokenization with left padding.
"""
import re
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>"]
CORPUS = ["pick the cube and place it in the bowl", "open the drawer", "push the red block to the left",
          "stack the green cup on the plate", "user assistant system image", "<image 1> <image 2> robot",
          "You are a helpful robot.", "perform the task"]

EAGLE_CHAT = (
    "{% set n = namespace(images=0) %}<|im_start|>system\nYou are a helpful robot.<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.content is string %}"
    "{{ message.content }}{% else %}{% for item in message.content %}{% if item.type == 'image' %}"
    "{% set n.images = n.images + 1 %}<image-{{ n.images }}>{% elif item.type == 'text' %}{{ item.text }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_eagle_tokenizer(folder: Path, template: str, vocab_size: int = 320):
    from chat_prompt import write_chat_tokenizer
    return write_chat_tokenizer(folder, template, vocab_size, SPECIALS, CORPUS)


def upstream_eagle_prompt(folder: Path, texts, num_images: int, tokens_per_image: int):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    rendered = []
    for text in texts:
        conversation = [{"role": "user", "content": [{"type": "text", "text": text},
                                                     *[{"type": "image", "image": None} for _ in range(num_images)]]}]
        rendered.append(tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False))
    marker = re.compile(r"<(image|video)-(\d+)>")
    expanded = [marker.sub(lambda m: f"<image {m.group(2)}><img>{'<IMG_CONTEXT>' * tokens_per_image}</img>", r)
                for r in rendered]
    enc = tokenizer(expanded, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]
