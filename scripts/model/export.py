"""Export an N16Model to TorchScript for the native trainer.

Usage:
    PYTHONPATH=scripts python -m model.export --config n16-tiny --out n16-tiny.pt \
        [--seed 0] [--set key=value ...] [--tokenizer tokenizer.json]
    (or: python scripts/model/export.py ...)

Contract
- Builds the model on the CPU with torch.manual_seed(--seed), applies the
  config's freezing (requires_grad), `torch.jit.script`s it and saves it with
  these TorchScript extra files (JSON):
    loongforge/config.json      the ModelConfig (its "name" included)
    loongforge/params.json      [{name, shape, numel, role, trainable, decay}] in
                                named_parameters() order (roles: registry.param_role,
                                weight decay: registry.decay_flags)
    loongforge/flops.json       {forward_per_sample, backward_per_sample,
                                 batch_shape, by_role} (flops.py)
    loongforge/counts.json      {total, trainable, by_role: {role: {total, trainable}}}
    loongforge/batch_spec.json  batch.py's batch_spec, plus "tokenizer": the
                                record (kind, file, sha256, vocab_size) of the
                                tokenizer whose ids the model reads: the word hash
                                of tokenizer.py, or --tokenizer's tokenizer.json.
                                The trainer refuses a dataset tokenized otherwise.
                                With --processor (or an import of an upstream
                                checkpoint) also "processor": how the data
                                pipeline prepares state, actions and the
                                embodiment slot for these weights
                                (scripts/gr00t_processor.py; training-semantics s3).
    loongforge/code.json        {"sha256", "files"}: SHA-256 over the model code
                                (scripts/model/*.py, names and bytes in name order)
                                that built the file (model_code_hash); an
                                AOTInductor package compiled from it records the
                                same (scripts/compile_step.py), so a package from
                                other model code is refused.
- Prints a short summary. Everything is fp32; n16-3b and n16-12b need about
  12 GB and 46 GB of host memory.
- --records-only writes a zip holding only the extra files above, byte for byte
  the ones a full export writes, from a model built on the meta device (no
  weights, seconds for any size). It is not a model file the trainer can run:
  it is for scripts/compile_step.py, which reads only these records, so a large
  model's step can be compiled without writing its weights first.
"""

import argparse
import json
import os
import sys
import warnings
from typing import Dict, List

import torch

if __package__ in (None, ""):  # run as a file: make `import model` work
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from model.batch import batch_spec  # noqa: E402
from model.config import CONFIGS, apply_overrides, get_config  # noqa: E402
from model.flops import flops_per_sample  # noqa: E402
from model.registry import build_model, decay_flags, param_role  # noqa: E402
from model import tokenizer as tokenizers_  # noqa: E402

EXTRA_PREFIX = "loongforge/"
MODEL_DIR = os.path.dirname(os.path.abspath(__file__))


def model_code_hash() -> Dict[str, object]:
    """SHA-256 over scripts/model/*.py (each file's name, a NUL byte, its bytes, a NUL byte; in name order)."""
    import hashlib
    h = hashlib.sha256()
    names = sorted(n for n in os.listdir(MODEL_DIR) if n.endswith(".py"))
    for name in names:
        with open(os.path.join(MODEL_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return {"sha256": h.hexdigest(), "files": len(names)}


def silence_torchscript_deprecation() -> None:
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=DeprecationWarning)


def param_table(model: torch.nn.Module) -> List[Dict]:
    decay = decay_flags(model)
    return [{"name": n, "shape": list(p.shape), "numel": p.numel(), "role": param_role(n),
             "trainable": p.requires_grad, "decay": decay[n]} for n, p in model.named_parameters()]


def counts(params: List[Dict]) -> Dict:
    by_role: Dict[str, Dict[str, int]] = {}
    for p in params:
        r = by_role.setdefault(p["role"], {"total": 0, "trainable": 0})
        r["total"] += p["numel"]
        r["trainable"] += p["numel"] if p["trainable"] else 0
    return {"total": sum(p["numel"] for p in params),
            "trainable": sum(p["numel"] for p in params if p["trainable"]),
            "by_role": by_role}


def tokenizer_record(cfg, tokenizer_path=None, text_form: str = tokenizers_.RAW) -> Dict:
    """The tokenizer the model is built for (and the text form it reads); its ids must fit the text
    embedding."""
    _, record = tokenizers_.load(tokenizer_path, text_form)
    if record["vocab_size"] > cfg.vocab_size:
        raise ValueError(f"--tokenizer {tokenizer_path}: its vocabulary has {record['vocab_size']} ids but the "
                         f"model's vocab_size is {cfg.vocab_size}; pass --set vocab_size={record['vocab_size']} "
                         "(or more)")
    return record


def check_processor(cfg, record: Dict) -> Dict:
    """A processor record (scripts/gr00t_processor.py) that fits the model; ValueError naming what does not."""
    if record.get("form") not in ("gr00t_n17", "gr00t_n16"):
        raise ValueError(f"processor record: form {record.get('form')!r} must be gr00t_n17 or gr00t_n16")
    slot = int(record.get("embodiment_id", 0))
    if not 0 <= slot < cfg.num_embodiments:
        raise ValueError(f"processor record: embodiment_id {slot} is outside the model's {cfg.num_embodiments} slots")
    if record.get("stats") == "checkpoint":
        state, action = record["state"], record["action"]
        if len(state["min"]) > cfg.max_state_dim or len(action["state_index"]) > cfg.max_action_dim:
            raise ValueError(f"processor record: {len(state['min'])} state / {len(action['state_index'])} action "
                             f"values exceed the model's max_state_dim {cfg.max_state_dim} / max_action_dim "
                             f"{cfg.max_action_dim}")
        if any(len(r) != len(action["state_index"]) for r in action["min"] + action["max"]):
            raise ValueError("processor record: every action statistics row must have one value per action value")
    return record


def extra_files(cfg, model: torch.nn.Module, tokenizer_path=None, text_form: str = tokenizers_.RAW,
                processor: Dict = None) -> Dict[str, str]:
    params = param_table(model)
    spec = batch_spec(cfg)
    spec["tokenizer"] = tokenizer_record(cfg, tokenizer_path, text_form)
    if processor:
        spec["processor"] = check_processor(cfg, processor)
    files = {
        "config.json": cfg.to_dict(),
        "params.json": params,
        "flops.json": flops_per_sample(cfg),
        "counts.json": counts(params),
        "batch_spec.json": spec,
        "code.json": model_code_hash(),
    }
    return {EXTRA_PREFIX + k: json.dumps(v, indent=1) for k, v in files.items()}


def export(config: str, out: str, seed: int = 0, overrides: List[str] = (), tokenizer: str = None,
           text_form: str = tokenizers_.RAW, processor: Dict = None) -> Dict[str, str]:
    """Builds, scripts and saves; returns the extra files written."""
    silence_torchscript_deprecation()
    cfg = apply_overrides(get_config(config), list(overrides))
    if tokenizer is not None and not os.path.isfile(tokenizer):
        raise ValueError(f"--tokenizer {tokenizer}: no such file; pass the checkpoint's tokenizer.json")
    torch.manual_seed(seed)
    return save_model(cfg, build_model(cfg), out, tokenizer, text_form, processor)


def save_model(cfg, model: torch.nn.Module, out: str, tokenizer: str = None,
               text_form: str = tokenizers_.RAW, processor: Dict = None) -> Dict[str, str]:
    """Scripts a built model (weights and requires_grad as they are) and saves it with the extra
    files; scripts/convert_gr00t_checkpoint.py calls this after loading upstream weights."""
    silence_torchscript_deprecation()
    files = extra_files(cfg, model, tokenizer, text_form, processor)
    scripted = torch.jit.script(model)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # like any writer of outputs
    torch.jit.save(scripted, out, _extra_files=files)
    return files


def export_records(config: str, out: str, overrides: List[str] = (), tokenizer: str = None,
                   text_form: str = tokenizers_.RAW, processor: Dict = None) -> Dict[str, str]:
    """The extra files of export() without weights or TorchScript, as a zip laid out like
    torch.jit.save's archive (<name>/extra/loongforge/...), written atomically."""
    import zipfile
    cfg = apply_overrides(get_config(config), list(overrides))
    with torch.device("meta"):  # shapes, names and requires_grad only; no memory, no init
        model = build_model(cfg)
    files = extra_files(cfg, model, tokenizer, text_form, processor)
    stem = os.path.splitext(os.path.basename(out))[0] or "records"
    tmp = out + ".partial"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with zipfile.ZipFile(tmp, "w") as z:
        for name, text in files.items():
            z.writestr(f"{stem}/extra/{name}", text)
    os.replace(tmp, out)
    return files


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description="Export an N1.6-style model to TorchScript.")
    ap.add_argument("--config", required=True, help="a named config: " + ", ".join(CONFIGS))
    ap.add_argument("--out", required=True, help="output .pt file")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a ModelConfig field (repeatable), e.g. --set use_imu=true")
    ap.add_argument("--tokenizer", default=None, metavar="TOKENIZER_JSON",
                    help="the Hugging Face tokenizer.json the model reads ids of (convert the dataset with the "
                    "same file); default: the word hash of scripts/model/tokenizer.py")
    ap.add_argument("--formalize-language", nargs="?", const="n17", default=None, choices=("n17", "n16"),
                    help="with --tokenizer: the model reads task texts changed as upstream GR00T N1.7 (n17, the "
                    "default) or Isaac-GR00T N1.6 (n16) does (convert the dataset with the same flag)")
    ap.add_argument("--processor", default=None, metavar="PROCESSOR_JSON",
                    help="a processor record as scripts/gr00t_processor.py makes it (an import of an upstream "
                    "checkpoint writes one): the data pipeline prepares state, actions and the embodiment "
                    "slot as upstream's processor does")
    ap.add_argument("--records-only", action="store_true",
                    help="write only the loongforge/*.json records (no weights, no TorchScript) for "
                    "scripts/compile_step.py; the trainer cannot run such a file")
    args = ap.parse_args(argv)
    form = tokenizers_.FORMALIZE_FLAGS[args.formalize_language] if args.formalize_language else tokenizers_.RAW
    try:
        processor = None
        if args.processor:
            try:
                processor = json.loads(open(args.processor).read())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"--processor {args.processor}: {e}") from None
        if args.records_only:
            files = export_records(args.config, args.out, args.overrides, args.tokenizer, form, processor)
        else:
            files = export(args.config, args.out, args.seed, args.overrides, args.tokenizer, form, processor)
    except ValueError as e:
        print(f"export: {e}", file=sys.stderr)
        return 2
    c = json.loads(files[EXTRA_PREFIX + "counts.json"])
    f = json.loads(files[EXTRA_PREFIX + "flops.json"])
    print(f"exported {args.config} -> {args.out}" + (" (records only)" if args.records_only else ""))
    print(f"  params: {c['total'] / 1e6:.2f} M total, {c['trainable'] / 1e6:.2f} M trainable")
    for role, r in sorted(c["by_role"].items()):
        print(f"    {role:<10} {r['total'] / 1e6:10.2f} M  ({r['trainable'] / 1e6:.2f} M trainable)")
    print(f"  FLOPs/sample: forward {f['forward_per_sample'] / 1e9:.2f} G, "
          f"backward {f['backward_per_sample'] / 1e9:.2f} G  (batch shape {f['batch_shape']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
