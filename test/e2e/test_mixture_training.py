"""A mixture file as data.path (docs/training-semantics.md s1): loongforge-train and the reference trainer
train n16-tiny (every parameter trainable, fp32, CPU) on the suite's mixture -- the bundled dataset at
64x64 in embodiment slot 0 and a one-armed copy of two of its episodes (13-wide state and actions, an
80x60 camera, longer task texts) in slot 3 -- and their per-step losses agree as test_parity.py's do
(relative 1e-4); the run's steps mix both embodiments (metrics.jsonl data/embodiments), its start line
counts both datasets, and data.embodiment_id beside a mixture file is refused.

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_MIXTURE (mixture.json),
LOONGFORGE_TEST_MODELS (scratch folder).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_parity import REPO, TOLERANCE, TRAIN, cpp_args, export, run_both  # noqa: E402

MIXTURE = os.environ.get("LOONGFORGE_TEST_MIXTURE", str(REPO / "build/test-data/mixture/mixture.json"))
STEPS = 30


def test_both_trainers_agree_step_by_step_on_a_mixture_of_two_embodiments(tmp_path):
    model = export("full", ["tune_visual=true", "tune_llm=true"])
    a, b = run_both(tmp_path, model, STEPS, [f"data.path={MIXTURE}"])
    assert len(a) == len(b) == STEPS
    rel = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
    print(json.dumps({"steps": STEPS, "max_rel_diff": rel, "bitwise_equal_steps": sum(x == y for x, y in zip(a, b))}))
    assert rel <= TOLERANCE
    records = [json.loads(line) for line in (tmp_path / "cpp/metrics.jsonl").read_text().splitlines() if line]
    mixed = sum(1 for r in records if r["embodiments"] == 2)
    assert mixed > STEPS // 2, f"only {mixed} of {STEPS} steps held both embodiments"


def test_the_start_line_counts_the_mixtures_datasets_and_data_embodiment_id_is_refused_beside_it(tmp_path):
    model = export("full", ["tune_visual=true", "tune_llm=true"])
    run = subprocess.run([TRAIN] + cpp_args(tmp_path, model, 1, [f"data.path={MIXTURE}"]), capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert f"2 datasets ({MIXTURE}), 7 episodes / 2978 samples" in run.stdout + run.stderr
    refused = subprocess.run([TRAIN] + cpp_args(tmp_path, model, 1, [f"data.path={MIXTURE}", "data.embodiment_id=2",
                                                                     "run.name=refused"]),
                             capture_output=True, text=True)
    assert refused.returncode != 0
    assert "a mixture file, which names each dataset's embodiment_id: remove data.embodiment_id" in refused.stderr
