"""Test fixtures for chat-templated N1.7 prompts (scripts/chat_template.py, scripts/model/prompt.py).

- `write_chat_tokenizer(folder, template, specials=SPECIALS, corpus=CORPUS)`: a small byte-level
  BPE tokenizer.json trained here, with Qwen-style special tokens (<|endoftext|> as the pad,
  <|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|>) and
  no post-processor, and a tokenizer_config.json carrying `template` as its chat_template, as a
  Hugging Face tokenizer folder has them. Returns the tokenizers.Tokenizer.
- `dataset_text(tokenizer_json, texts, max_len)` -> (ids, mask): the text tokens the dataset
  converter stores (scripts/convert_lerobot.py --tokenizer).
- CHATML / CHATML_SYSTEM: two chat templates written for these tests (not a model's own):
  one user message in ChatML with each image wrapped in <|vision_start|> ... <|vision_end|>;
  the second adds a system message, the bos_token variable and a "Picture N: " label per image.
- `upstream_processor(folder, cfg)`: transformers' Qwen3VLProcessor as lerobot 0.6.1 builds it
  (`_build_n1_7_processor`: AutoTokenizer of the folder, the tokenizer's chat template, left
  padding), with the image processor at the model's patch/merge sizes.
- `upstream_prompt(proc, images, texts)`: GrootN17VLMEncodeStep's steps for already normalized
  images: one user message per sample ([image per view ..., text]), apply_chat_template
  (tokenize=False, add_generation_prompt=False), then the processor with padding=True
  (resize, rescale and normalize off: the images are the trainer's model input).
- `small_qwen3vl_config(oracle, tok)`: Cosmos-Reason2-2B's backbone config (lerobot's hard-coded
  copy) at small sizes, with the tokenizer's image and vision token ids.
"""
import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
CORPUS = ["pick the cube and place it in the bowl", "open the drawer", "push the red block to the left",
          "stack the green cup on the plate", "user assistant system picture", "Picture 1: Picture 2: robot",
          "You are a helpful robot."]

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% for item in message.content %}{% if item.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item.type == 'text' %}{{ item.text }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CHATML_SYSTEM = (
    "{{ bos_token }}<|im_start|>system\nYou are a helpful robot.<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{% set n = namespace(i=0) %}"
    "{% for item in message.content %}{% if item.type == 'image' %}{% set n.i = n.i + 1 %}"
    "Picture {{ n.i }}: <|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ item.text }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}")


def write_chat_tokenizer(folder: Path, template: str, vocab_size: int = 320, specials=SPECIALS, corpus=CORPUS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus * 4, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "bos_token": "<|im_start|>", "chat_template": template, "model_max_length": 4096}))
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def dataset_text(tok_json: Path, texts, max_len: int):
    """The text tokens and mask the dataset converter stores (scripts/convert_lerobot.py --tokenizer)."""
    import torch
    from model.tokenizer import HFTokenizer
    h = HFTokenizer(str(tok_json))
    rows = [h.encode(t, max_len) for t in texts]
    ids = torch.tensor([r[0] for r in rows])
    mask = torch.arange(max_len)[None] < torch.tensor([r[1] for r in rows])[:, None]
    return ids, mask


def upstream_processor(folder: Path, cfg):
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    proc = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=cfg.patch_size,
                                                                  temporal_patch_size=cfg.vit_temporal_patch,
                                                                  merge_size=cfg.pixel_shuffle),
                            tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(),
                            chat_template=tokenizer.chat_template)
    proc.tokenizer.padding_side = "left"
    return proc


def upstream_prompt(proc, images, texts):
    """images (B, V, 3, H, W) normalized floats, texts [B] -> the processor's BatchFeature."""
    B, V = images.shape[:2]
    rendered, flat = [], []
    for b in range(B):
        frames = [images[b, v] for v in range(V)]
        conversation = [{"role": "user", "content": [*[{"type": "image", "image": f} for f in frames],
                                                     {"type": "text", "text": texts[b]}]}]
        rendered.append(proc.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False))
        flat.extend(frames)
    return proc(text=rendered, images=flat, return_tensors="pt", padding=True, do_resize=False, do_rescale=False,
                do_normalize=False)


def small_qwen3vl_config(oracle, tok) -> dict:
    """Cosmos-Reason2-2B's config (lerobot's hard-coded copy) at small sizes."""
    cfg = oracle.n17._cosmos_reason2_qwen3_vl_config().to_dict()
    cfg["vision_config"].update(depth=3, hidden_size=64, num_heads=2, intermediate_size=128,
                                num_position_embeddings=36, patch_size=16, deepstack_visual_indexes=[0, 2],
                                out_hidden_size=128)
    cfg["text_config"].update(num_hidden_layers=3, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=32, intermediate_size=384, vocab_size=8192, pad_token_id=None,
                              rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": 5000000,
                                                                  "mrope_interleaved": True,
                                                                  "mrope_section": [6, 5, 5]})
    for key, token in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                       ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")):
        cfg[key] = tok.token_to_id(token)
    return cfg
