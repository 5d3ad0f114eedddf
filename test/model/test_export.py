# Proves export.py writes a TorchScript file the native trainer can use on its
# own: torch.jit.load with the loongforge/* extra files gives back the config,
# a parameter table that matches the loaded module's named_parameters (names,
# shapes, trainability, weight decay as model.registry.decay_flags decides it), counts that add up, positive FLOPs and a batch spec
# from which a batch can be built that the loaded module accepts.
import json
import subprocess
import sys
from pathlib import Path

import torch

import model
from model import export

NAMES = ["config.json", "params.json", "flops.json", "counts.json", "batch_spec.json", "code.json"]
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_with_extras(path: Path):
    extras = {"loongforge/" + n: "" for n in NAMES}
    module = torch.jit.load(str(path), _extra_files=extras)
    return module, {n: json.loads(extras["loongforge/" + n]) for n in NAMES}


def batch_from_spec(spec, batch_size: int):
    dtypes = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}
    dims = dict(spec["dims"], **{spec["batch_dim"]: batch_size})
    batch = {}
    for i in spec["inputs"]:
        shape = [dims[s] if isinstance(s, str) else s for s in i["shape"]]
        if i["key"] == "action_mask":
            batch[i["key"]] = torch.ones(shape)
        elif i["dtype"] == "float32":
            batch[i["key"]] = torch.rand(shape)
        elif i["dtype"] == "bool":
            batch[i["key"]] = torch.ones(shape, dtype=torch.bool)
        else:
            batch[i["key"]] = torch.ones(shape, dtype=dtypes[i["dtype"]])
    return batch


def test_export_round_trip_of_n16_tiny_carries_consistent_metadata(tmp_path):
    out = tmp_path / "tiny.pt"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "model" / "export.py"), "--config", "n16-tiny",
                           "--out", str(out), "--seed", "3", "--set", "use_imu=true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert "M total" in proc.stdout and "FLOPs/sample" in proc.stdout

    module, meta = load_with_extras(out)
    cfg = model.ModelConfig.from_json(json.dumps(meta["config.json"]))
    assert cfg == model.get_config("n16-tiny", use_imu=True) and cfg.name == "n16-tiny"

    loaded = list(module.named_parameters())
    params = meta["params.json"]
    assert [p["name"] for p in params] == [n for n, _ in loaded]
    assert [p["shape"] for p in params] == [list(t.shape) for _, t in loaded]
    assert [p["trainable"] for p in params] == [t.requires_grad for _, t in loaded]
    assert all(p["numel"] == t.numel() for p, (_, t) in zip(params, loaded))
    assert {p["role"] for p in params} == {"vision", "llm", "action", "embodiment", "small"}

    counts = meta["counts.json"]
    assert counts["total"] == sum(t.numel() for _, t in loaded)
    assert counts["trainable"] == sum(t.numel() for _, t in loaded if t.requires_grad)
    assert sum(r["total"] for r in counts["by_role"].values()) == counts["total"]
    assert sum(r["trainable"] for r in counts["by_role"].values()) == counts["trainable"]

    flops = meta["flops.json"]
    assert flops["forward_per_sample"] > 0 and flops["backward_per_sample"] > 0
    assert flops["batch_shape"]["H"] == 16 and flops["batch_shape"]["L"] == 32

    spec = meta["batch_spec.json"]
    assert [i["key"] for i in spec["inputs"]] == ["images", "text_tokens", "text_mask", "state", "actions",
                                                 "action_mask", "embodiment_id", "fm_t", "fm_noise", "imu"]
    # The model code that wrote the file: every scripts/model/*.py, hashed as compile_step.py records it.
    code = meta["code.json"]
    assert code == export.model_code_hash() and len(code["sha256"]) == 64
    assert code["files"] == len(list((SCRIPTS / "model").glob("*.py")))

    result = module(batch_from_spec(spec, 2))
    assert result["loss"].dim() == 0 and result["num_valid"].item() == 2 * 16 * 64

    torch.manual_seed(3)  # same seed, same weights as the eager build
    eager = model.build_model(cfg)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(eager.named_parameters(), loaded))
    assert [p["decay"] for p in params] == list(model.decay_flags(eager).values())


def test_decay_flags_decay_weights_but_not_biases_2d_ones_included_nor_norm_weights():
    m = model.build_model(model.get_config("n16-tiny"), device=torch.device("meta"))
    flags = model.decay_flags(m)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert list(flags) == list(shapes)
    E = model.get_config("n16-tiny").num_embodiments
    # CategorySpecificLinear: weight (E, in, out) decays, bias (E, out) does not.
    assert shapes["embodiment.state_encoder.layer1.weight"][0] == E and flags["embodiment.state_encoder.layer1.weight"]
    assert shapes["embodiment.state_encoder.layer1.bias"] == (E, 128)
    assert not flags["embodiment.state_encoder.layer1.bias"]
    assert not flags["action_head.vl_norm.weight"] and not flags["action_head.vl_norm.bias"]   # LayerNorm
    assert not flags["llm.norm.weight"]                                                        # RMSNorm
    assert flags["action_head.pos_embed"] and flags["llm.embed_tokens.weight"]
    # Every 2-D+ parameter that does not decay is a bias; every 1-D one does not decay.
    assert all(n.endswith(".bias") for n, f in flags.items() if not f and len(shapes[n]) >= 2)
    assert not any(f for n, f in flags.items() if len(shapes[n]) < 2)


def test_export_rejects_an_unknown_override_with_a_message_naming_the_key(tmp_path, capsys):
    rc = export.main(["--config", "n16-tiny", "--out", str(tmp_path / "x.pt"), "--set", "vit_depth=3"])
    assert rc == 2
    assert "vit_depth" in capsys.readouterr().err


def test_records_only_export_writes_the_full_exports_records_byte_for_byte_and_compile_step_reads_them(tmp_path):
    sets = ["--set", "use_imu=true", "--set", "tune_llm=true"]
    full, records = tmp_path / "tiny.pt", tmp_path / "tiny.records.zip"
    assert export.main(["--config", "n16-tiny", "--out", str(full)] + sets) == 0
    assert export.main(["--config", "n16-tiny", "--out", str(records), "--records-only"] + sets) == 0
    import zipfile

    def extras(path):
        with zipfile.ZipFile(path) as z:
            return {n.split("/extra/", 1)[1]: z.read(n) for n in z.namelist() if "/extra/loongforge/" in n}

    a, b = extras(full), extras(records)
    assert sorted(b) == sorted("loongforge/" + n for n in NAMES)
    assert a == b  # the same bytes: a package compiled from the records matches the full file's hash
    sys.path.insert(0, str(SCRIPTS))
    import compile_step
    config, params, code = compile_step.read_records(str(records))
    assert json.loads(params) == json.loads(a["loongforge/params.json"]) and code
    assert compile_step.manifest_hash(config, params) == compile_step.manifest_hash(
        a["loongforge/config.json"].decode(), a["loongforge/params.json"].decode())
    # It is no model file: the trainer's loader (torch.jit.load) refuses it.
    import pytest
    with pytest.raises(Exception):
        torch.jit.load(str(records))
