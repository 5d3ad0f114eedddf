"""loongforge-train refuses a model and a dataset whose task tokens come from
different tokenizers (Note [Tokenizer match] in src/data/batch.cpp), naming the
dataset file, both tokenizers and the two ways to fix it (an export older than
the tokenizer record counts as the word hash), and trains when both
were made with the same Hugging Face tokenizer.json (a small BPE trained here).

Environment as in test_train_run.py (set by ctest): LOONGFORGE_TRAIN,
LOONGFORGE_TEST_DATASET (converted with the word hash), LOONGFORGE_TEST_MODELS
(n16-tiny.pt exported with the word hash).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
FIXTURE = Path(os.environ.get("LOONGFORGE_PICKNPLACE",
                              REPO.parent / "shared" / "datasets" / "robot_sim.PickNPlace")).resolve()
sys.path.insert(0, str(REPO / "test" / "data"))
from test_tokenizer_hf import train_bpe  # noqa: E402


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(tokenizer.json, dataset converted with it, n16-tiny exported with it)."""
    work = tmp_path_factory.mktemp("hf")
    tok = work / "tokenizer.json"
    train_bpe(tok)
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(FIXTURE), str(work / "ds"),
                    "--tokenizer", str(tok), "--episodes", "0,1", "--quiet"], check=True, env=env)
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out",
                    str(work / "model.pt"), "--tokenizer", str(tok)], check=True, env=env, capture_output=True)
    return tok, work / "ds", work / "model.pt"


def train(tmp_path, model, data, steps=3):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={model}",
           "--set", f"data.path={data}", "--set", f"run.output_dir={tmp_path}", "--set", f"trainer.max_steps={steps}",
           "--set", "logging.interval_steps=1"]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_a_dataset_tokenized_with_a_tokenizer_json_is_refused_by_a_word_hash_model(hf, tmp_path):
    tok, ds, _ = hf
    r = train(tmp_path, MODEL, ds)
    assert r.returncode == 1, r.stderr
    sha = json.loads((ds / "loongforge_dataset.json").read_text())["tokenizer"]["sha256"]
    assert (f"data_error: {ds}/loongforge_dataset.json: tokenizer mismatch: task texts were tokenized with "
            f"hf_tokenizer_json '{tok}' (sha256 {sha[:16]}...) but the model {MODEL} was exported for word_hash "
            "'scripts/model/tokenizer.py'") in r.stderr
    assert ("; re-convert the dataset (scripts/convert_lerobot.py SRC DST without --tokenizer) or re-export the "
            f"model (scripts/model/export.py with --tokenizer {tok})") in r.stderr


def test_a_word_hash_dataset_is_refused_by_a_model_exported_for_a_tokenizer_json(hf, tmp_path):
    tok, _, model = hf
    r = train(tmp_path, model, DATA)
    assert r.returncode == 1, r.stderr
    assert (f"data_error: {DATA}/loongforge_dataset.json: tokenizer mismatch: task texts were tokenized with "
            f"word_hash 'scripts/model/tokenizer.py'") in r.stderr
    assert (f"re-convert the dataset (scripts/convert_lerobot.py SRC DST with --tokenizer {tok}) or re-export "
            "the model (scripts/model/export.py without --tokenizer)") in r.stderr


def test_model_and_dataset_made_with_the_same_tokenizer_json_train(hf, tmp_path):
    _, ds, model = hf
    r = train(tmp_path, model, ds)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in (tmp_path / "n16-tiny-demo/metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2, 3]
    assert all(x["loss"] > 0 for x in records)


def test_a_model_exported_before_the_tokenizer_record_counts_as_the_word_hash(hf, tmp_path):
    import torch
    tok, ds, _ = hf
    files = {"loongforge/" + n: "" for n in ("config.json", "params.json", "flops.json", "counts.json",
                                             "batch_spec.json")}
    module = torch.jit.load(str(MODEL), _extra_files=files)
    spec = json.loads(files["loongforge/batch_spec.json"])
    del spec["tokenizer"]  # as scripts/model/export.py wrote it before the record existed
    files["loongforge/batch_spec.json"] = json.dumps(spec)
    old = tmp_path / "old.pt"
    torch.jit.save(module, str(old), _extra_files=files)
    r = train(tmp_path, old, ds)
    assert r.returncode == 1, r.stderr
    assert (f"data_error: {ds}/loongforge_dataset.json: task texts were tokenized with hf_tokenizer_json '{tok}'"
            in r.stderr)
    assert (f"but the model {old} records no tokenizer (it was exported for the word hash); re-export the model "
            f"with `scripts/model/export.py ... --tokenizer {tok}`") in r.stderr


def test_a_raw_dataset_is_refused_by_a_model_that_reads_formalized_texts(hf, tmp_path):
    """Upstream N1.7 lowercases and strips the task text before tokenizing (--formalize-language);
    a dataset tokenized from the raw text has other ids and is refused, naming the flag."""
    tok, ds, _ = hf
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    model = tmp_path / "formalized.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out",
                    str(model), "--tokenizer", str(tok), "--formalize-language"], check=True, env=env,
                   capture_output=True)
    r = train(tmp_path, model, ds)
    assert r.returncode == 1, r.stderr
    assert (f"data_error: {ds}/loongforge_dataset.json: text form mismatch: task texts were tokenized raw but the "
            f"model {model} reads gr00t_formalized texts") in r.stderr
    assert f"(scripts/convert_lerobot.py SRC DST --tokenizer {tok} --formalize-language)" in r.stderr
