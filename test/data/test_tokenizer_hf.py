# What this file proves: with --tokenizer, scripts/convert_lerobot.py tokenizes
# the task texts with a Hugging Face tokenizer.json through the `tokenizers`
# library (here a small BPE tokenizer this test trains itself), stores exactly
# the ids that library returns (the first --max-text-tokens of them, warning
# when it cuts), and records the tokenizer's kind, file, SHA-256 and vocabulary
# size; scripts/model/export.py --tokenizer records the same identity in the
# model's batch_spec.json (the trainer compares the two: test/e2e/
# test_tokenizer_match.py). Without --tokenizer both sides keep the word hash of
# scripts/model/tokenizer.py. A file that is not a tokenizer.json, and a
# tokenizer larger than the model's vocabulary, are refused with what to do.
#
# Run: cd /work/main && PYTHONPATH=scripts python -m pytest test/data/test_tokenizer_hf.py -q

import contextlib
import hashlib
import io
import json
import os
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(os.environ.get("LOONGFORGE_PICKNPLACE",
                              REPO.parent / "shared" / "datasets" / "robot_sim.PickNPlace")).resolve()
if str(REPO / "scripts") not in sys.path:
    sys.path.insert(0, str(REPO / "scripts"))
import convert_lerobot  # noqa: E402

CORPUS = [*(f"pick the {x} from the counter and place it in the plate"
            for x in ("squash", "ketchup", "candle", "bar", "spray")), "valid",
          "put the cup on the table", "open the drawer and take out the spoon",
          "move the red block next to the blue bowl"]


def train_bpe(path, vocab_size=200):
    """A byte-pair-encoding tokenizer with <s> ... </s> around every text, trained on CORPUS."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=vocab_size,
                                                            special_tokens=["<pad>", "<s>", "</s>", "<unk>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.save(str(path))
    return Tokenizer.from_file(str(path))


def run_convert(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = convert_lerobot.main([*map(str, args), "--quiet", "--episodes", "0"])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    if not FIXTURE.is_dir():
        raise RuntimeError(f"the bundled dataset {FIXTURE} is missing (set LOONGFORGE_PICKNPLACE)")
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return path, train_bpe(path)


def test_task_ids_are_the_tokenizers_ids_and_its_identity_is_recorded(bpe, tmp_path):
    path, tok = bpe
    rc, _, err = run_convert(FIXTURE, tmp_path / "out", "--tokenizer", path, "--max-text-tokens", 32)
    assert rc == 0, err
    doc = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())
    assert doc["tokenizer"] == {"kind": "hf_tokenizer_json", "file": str(path.resolve()),
                                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                "vocab_size": tok.get_vocab_size(with_added_tokens=True), "max_len": 32}
    assert len(doc["tasks"]) == 6
    for t in doc["tasks"]:
        ids = tok.encode(t["text"]).ids
        assert t["token_ids"] == ids and t["token_count"] == len(ids)
        assert ids[0] == 1 and ids[-1] == 2 and 3 not in ids  # <s> ... </s>, no <unk>: the corpus covers them
    assert doc["tasks"][1]["token_ids"] == [1, tok.token_to_id("valid"), 2]


def test_a_text_longer_than_max_text_tokens_is_cut_with_a_warning(bpe, tmp_path):
    path, tok = bpe
    rc, _, err = run_convert(FIXTURE, tmp_path / "out", "--tokenizer", path, "--max-text-tokens", 4)
    assert rc == 0, err
    doc = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())
    text = doc["tasks"][0]["text"]
    assert doc["tasks"][0]["token_ids"] == tok.encode(text).ids[:4]
    assert (f"warning: task 0 ({text!r}) needs {len(tok.encode(text).ids)} tokens and was truncated to 4; "
            "raise --max-text-tokens") in err


def test_without_tokenizer_the_word_hash_is_recorded(tmp_path):
    rc, _, err = run_convert(FIXTURE, tmp_path / "out")
    assert rc == 0, err
    t = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())["tokenizer"]
    assert t["kind"] == "word_hash" and t["file"] == t["module"] == "scripts/model/tokenizer.py"
    assert t["sha256"] == hashlib.sha256((REPO / "scripts/model/tokenizer.py").read_bytes()).hexdigest()


def test_a_file_that_is_not_a_tokenizer_json_is_refused(tmp_path):
    bad = tmp_path / "tokenizer_config.json"
    bad.write_text('{"model_max_length": 512}')
    rc, _, err = run_convert(FIXTURE, tmp_path / "out", "--tokenizer", bad)
    assert rc == 1
    assert f"error: --tokenizer {bad}: {bad}: not a Hugging Face tokenizer.json" in err
    assert "fix: pass a Hugging Face tokenizer.json file" in err
    rc, _, err = run_convert(FIXTURE, tmp_path / "out", "--tokenizer", tmp_path / "absent.json")
    assert rc == 1 and f"error: --tokenizer {tmp_path / 'absent.json'}: is not a file" in err


def test_the_export_records_the_same_identity_and_refuses_a_vocabulary_too_large(bpe, tmp_path):
    from model import export
    from model.config import get_config
    path, tok = bpe
    cfg = get_config("n16-tiny")
    rec = export.tokenizer_record(cfg, str(path))
    rc, _, err = run_convert(FIXTURE, tmp_path / "out", "--tokenizer", path)
    assert rc == 0, err
    ds = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())["tokenizer"]
    assert (rec["kind"], rec["sha256"], rec["file"], rec["vocab_size"]) == \
        (ds["kind"], ds["sha256"], ds["file"], ds["vocab_size"])
    assert export.tokenizer_record(cfg)["sha256"] == \
        hashlib.sha256((REPO / "scripts/model/tokenizer.py").read_bytes()).hexdigest()
    big = tmp_path / "big.json"  # 9000 ids: more than n16-tiny's 8192
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(9000)}, unk_token="w0")).save(str(big))
    with pytest.raises(ValueError, match=f"--tokenizer {big}: its vocabulary has 9000 ids but the model's "
                                         "vocab_size is 8192; pass --set vocab_size=9000"):
        export.tokenizer_record(cfg, str(big))
