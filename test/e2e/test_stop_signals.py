"""The requeue signal (src/trainer/stop_signal.hpp), without Slurm: SIGUSR1
sent to one rank of two makes both finish the same step, checkpoint and exit
75 (the stop travels over the command bus with requeue=true), and
`--resume latest` then finishes the run with exit 0; a SIGUSR1 that arrives
while the trainer is still starting is kept, not fatal (exit 75, no step
taken). test/slurm/test_slurm.py drives the same path through sbatch.

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET,
LOONGFORGE_TEST_MODELS.
"""
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comm"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "control"))
from test_multi_rank import applied_steps, launch, losses, wait_all  # noqa: E402

EXIT_REQUEUE = 75


def logs_of(out, n):
    return [(out / f"rank{r}.log").read_text() for r in range(n)]


def test_sigusr1_to_one_rank_checkpoints_every_rank_exits_75_and_resume_finishes(tmp_path):
    procs = launch(tmp_path, 2, "logging.interval_steps=1", name="usr1", steps=20)
    metrics = tmp_path / "usr1" / "metrics.jsonl"
    t0 = time.time()
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert time.time() - t0 < 120 and all(p.poll() is None for p in procs), logs_of(tmp_path, 2)
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGUSR1)
    codes = [p.wait(timeout=120) for p in procs]
    r0, r1 = logs_of(tmp_path, 2)
    assert codes == [EXIT_REQUEUE] * 2, (codes, r0, r1)
    step = applied_steps(r0, "stop")[0]
    assert applied_steps(r1, "stop") == [step] and 3 <= step < 20
    assert f"requeue requested (SIGUSR1): checkpointing at step {step}, then exit 75" in r0  # rank 0 got no signal
    assert f"stopped      by SIGUSR1 at step {step} of 20: exit 75" in r0
    assert (tmp_path / "usr1" / "checkpoints" / f"epoch_0_step_{step}").is_dir()
    logs = wait_all(launch(tmp_path, 2, "checkpoint.resume=latest", name="usr1", steps=20), tmp_path)
    assert f"epoch_0_step_{step} at step {step}" in logs
    assert len(losses(tmp_path / "usr1")) == 20


def test_sigusr1_while_starting_is_kept_until_the_first_boundary(tmp_path):
    procs = launch(tmp_path, 1, name="early", steps=40)
    # The control socket is up first in open(), before the model and the data
    # load (before that the process is still loading libtorch: no handler yet).
    t0 = time.time()
    while "control socket" not in logs_of(tmp_path, 1)[0]:
        assert time.time() - t0 < 60 and procs[0].poll() is None, logs_of(tmp_path, 1)
        time.sleep(0.01)
    procs[0].send_signal(signal.SIGUSR1)
    code = procs[0].wait(timeout=120)
    log = logs_of(tmp_path, 1)[0]
    assert code == EXIT_REQUEUE, log
    assert "requeue requested (SIGUSR1): checkpointing at step 0, then exit 75" in log
