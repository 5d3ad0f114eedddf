"""docs/operations.md's configuration reference is the schema's: it equals what
scripts/gen_config_reference.py renders from `loongforge-train --print-config`
now (a key added, removed or re-documented without regenerating fails here),
and the check does fail on a stale copy.

Environment (set by ctest): LOONGFORGE_TRAIN.
"""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "scripts/gen_config_reference.py"
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))


def gen(*args):
    return subprocess.run([sys.executable, str(GEN), "--train", TRAIN, *args], capture_output=True, text=True)


def test_the_operations_guide_lists_every_config_key_of_the_schema():
    r = gen("--check")
    assert r.returncode == 0, r.stdout + r.stderr
    keys = [l.split()[0].split(":")[0] for l in subprocess.run([TRAIN, "--print-config"], capture_output=True,
                                                              text=True, check=True).stdout.splitlines()
            if l.startswith("  ") and not l.strip().startswith("#")]
    doc = (REPO / "docs/operations.md").read_text()
    assert len(keys) > 50 and all(f".{k}` |" in doc for k in keys)


def test_a_stale_reference_is_caught_and_regenerated(tmp_path):
    stale = tmp_path / "operations.md"
    stale.write_text((REPO / "docs/operations.md").read_text().replace("| `trainer.max_steps` | `1000` |",
                                                                      "| `trainer.max_steps` | `999` |"))
    r = gen("--check", "--doc", str(stale))
    assert r.returncode == 1 and "out of date with the schema" in r.stderr and "gen_config_reference.py" in r.stderr
    assert gen("--doc", str(stale)).returncode == 0
    assert stale.read_text() == (REPO / "docs/operations.md").read_text()
