"""Every `loongforge` verb against a running loongforge-train (n16-tiny, CPU):
status shows progress, strategy, engines and world; profile-step writes a
profile JSON with per-phase times and a Chrome trace that parses, and with
--kernels its CUDA activity counts (none on a CPU run);
checkpoint-now produces a checkpoint that validate-checkpoint accepts;
engine verbs answer that their engine is off, and debug-dmf with DMF on shows each
step's text widths; stop checkpoints
and the trainer exits 0; target selection and error messages are clear.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from trainer_harness import CLI, Client, Trainer, cli, status


@pytest.fixture
def trainer(tmp_path):
    t = Trainer(tmp_path)
    t.wait_for_socket()
    t.wait_for_step(3)
    yield t
    t.kill()


def test_status_shows_step_loss_throughput_eta_strategy_engines_and_world(trainer):
    r = cli("status", "--socket", trainer.socket)
    assert "step " in r.stdout and "ETA" in r.stdout and "loss" in r.stdout
    assert "samples/s" in r.stdout and "strategy" in r.stdout and "gcts:" in r.stdout
    s = json.loads(cli("status", "--socket", trainer.socket, "--json").stdout)
    assert s["phase"] == "training" and s["step"] >= 3 and s["max_steps"] == 100000
    assert s["world"] == 1 and s["rank"] == 0 and s["pid"] == trainer.proc.pid
    assert s["samples_per_s"] > 0 and s["eta_s"] > 0 and s["loss"] > 0
    assert s["strategy"].startswith("none")
    assert s["bf16_weights"] is None and "working copies" not in r.stdout  # a CPU run keeps fp32 weights
    assert set(s["engines"]) == {"gcts", "mla", "adfe", "dmf"}
    assert s["data"]["source"] == "sync" and s["data"]["frames_decoded"] > 0 and "queue_depth" not in s["data"]
    # data.video_decode auto is span here: each video file opened once, its keyframe spans decoded as needed
    assert s["data"]["video_decode"] == "span" and s["data"]["spans_decoded"] >= s["data"]["videos_decoded"] >= 1
    assert "sync source:" in r.stdout and "frame(s) decoded" in r.stdout
    assert s["control"]["connections"] >= 2 and s["control"]["requests"] >= 4  # the server's own counters


def test_status_finds_the_only_trainer_of_this_user_and_by_pid(trainer, tmp_path):
    # --pid looks in the default directory; our socket is elsewhere, so it says where to look.
    r = cli("status", "--pid", str(trainer.proc.pid), check=False)
    assert r.returncode == 4 and "serves no control socket" in r.stderr and "--socket" in r.stderr
    # A second trainer in the default place is found without any option.
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path / "xdg"))
    (tmp_path / "xdg").mkdir(mode=0o700)
    other = Trainer(tmp_path / "second", env=env, sock="")
    try:
        deadline = time.time() + 60
        sock = tmp_path / "xdg" / "loongforge" / f"{other.proc.pid}.sock"
        while not sock.exists():
            assert time.time() < deadline and other.proc.poll() is None, other.output()
            time.sleep(0.05)
        r = subprocess.run([CLI, "status", "--json"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["pid"] == other.proc.pid
        r = subprocess.run([CLI, "status", "--pid", str(other.proc.pid), "--json"], capture_output=True, text=True, env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["socket"] == str(sock)
    finally:
        other.kill()


def test_profile_step_writes_per_phase_times_and_a_chrome_trace(trainer, tmp_path):
    out = tmp_path / "profile.json"
    r = cli("profile-step", "--socket", trainer.socket, "--duration", "1", "--output", str(out))
    assert "forward" in r.stdout and "backward" in r.stdout
    p = json.loads(out.read_text())
    assert p["schema"] == "loongforge.profile/1" and p["steps"] >= 1 and p["duration_s"] >= 1.0
    for phase in ("data_wait", "h2d", "forward", "backward", "optimizer", "control", "checkpoint"):
        assert phase in p["phases"], phase
        assert p["phases"][phase]["mean_ms_per_step"] >= 0
    # The phases account for most of each step (the rest is bookkeeping).
    measured = sum(v["mean_ms_per_step"] for v in p["phases"].values())
    assert 0.8 * p["mean_step_ms"] <= measured <= 1.01 * p["mean_step_ms"]
    assert len(p["per_step"]) == p["steps"] and p["last_step"] - p["first_step"] + 1 == p["steps"]
    assert all(x["data"]["queue_depth"] == 0 and x["data"]["decoded_frames_per_s"] >= 0 for x in p["per_step"])
    assert "peak_host_mb" in p["memory"]
    trace = json.loads(Path(p["trace_file"]).read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in events} >= {"forward", "backward", "optimizer"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and "pid" in e and "tid" in e for e in events)
    # Events of one thread never overlap: a well-formed timeline.
    events.sort(key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1.0 for a, b in zip(events, events[1:]))


def test_checkpoint_now_writes_a_checkpoint_that_validates(trainer):
    r = json.loads(cli("checkpoint-now", "--socket", trainer.socket, "--json").stdout)
    ckpt = Path(r["path"])
    assert ckpt.name == f"epoch_0_step_{r['step']}" and r["bytes"] > 0
    v = cli("validate-checkpoint", str(ckpt))
    assert "valid" in v.stdout.lower()
    assert status(trainer.socket)["last_checkpoint"] == str(ckpt)


def test_engine_verbs_answer_that_their_engine_is_off(trainer):
    r = cli("debug-dmf", "--socket", trainer.socket, check=False)
    assert r.returncode == 3, r.stderr
    assert "off in this run (dmf.enable=false)" in r.stderr and "[engine_off]" in r.stderr
    # MLA is built, and off in this run (a CPU run).
    r = cli("mla-stats", "--socket", trainer.socket, check=False)
    assert r.returncode == 3, r.stderr
    assert "off in this run (mla.enable=false)" in r.stderr and "[engine_off]" in r.stderr
    # GCTS is built, and off in this run.
    r = cli("switch-strategy", "--strategy", "hybrid", "--socket", trainer.socket, check=False)
    assert r.returncode == 3, r.stderr
    assert "off in this run (gcts.enable=false)" in r.stderr and "[engine_off]" in r.stderr
    # Fault tolerance is off too: no rank can be taken back.
    r = cli("hot-rejoin", "--socket", trainer.socket, check=False)
    assert r.returncode == 3, r.stderr
    assert "off in this run (fault.enable=false)" in r.stderr and "[engine_off]" in r.stderr
    r = cli("monitor-comm", "--socket", trainer.socket, "--count", "1", check=False)
    assert r.returncode == 3 and "no gradient communication" in r.stderr
    r = cli("switch-strategy", "--socket", trainer.socket, "--strategy", "fastest", check=False)
    assert r.returncode == 2  # rejected by the CLI before it reaches the trainer


def test_stop_checkpoints_then_the_trainer_exits_zero_and_removes_its_socket(trainer):
    r = json.loads(cli("stop", "--socket", trainer.socket, "--json").stdout)
    assert trainer.proc.wait(timeout=60) == 0, trainer.output()
    ckpt = Path(r["checkpoint"])
    assert ckpt.name == f"epoch_0_step_{r['stopped_at_step']}"
    cli("validate-checkpoint", str(ckpt))
    summary = json.loads((trainer.run_dir / "summary.json").read_text())
    assert summary["steps"] == r["stopped_at_step"]
    assert not os.path.exists(trainer.socket)
    assert "stop requested (control socket)" in trainer.output()


def test_a_request_sent_while_the_model_loads_is_answered_at_the_first_boundary(tmp_path):
    t = Trainer(tmp_path)
    try:
        t.wait_for_socket()
        c = Client(t.socket)
        r = c.request("checkpoint-now")
        assert r["ok"], r
        assert Path(r["result"]["path"]).name.startswith("epoch_0_step_")
    finally:
        t.kill()


def test_profile_step_kernels_counts_cuda_work_and_a_cpu_run_has_none(trainer, tmp_path):
    out = tmp_path / "kernels.json"
    r = cli("profile-step", "--socket", trainer.socket, "--duration", "0.5", "--kernels", "--output", str(out))
    assert "CUDA activity per step: 0.0 kernels" in r.stdout, r.stdout
    cuda = json.loads(out.read_text())["cuda"]
    assert cuda["steps"] >= 1
    assert cuda["kernels_per_step"] == 0 and cuda["host_launches_per_step"] == 0 and cuda["totals"]["kernels"] == 0
    assert cuda["kernel_device_ms_per_step"] == 0 and cuda["kernel_kinds"] == [] and cuda["top_kernels"] == []
    plain = tmp_path / "plain.json"
    cli("profile-step", "--socket", trainer.socket, "--duration", "0.5", "--output", str(plain))
    assert "cuda" not in json.loads(plain.read_text())  # only on request


def test_the_protocol_answers_bad_lines_with_errors_and_keeps_the_connection(trainer):
    c = Client(trainer.socket)
    c.send_raw(b"not json\n")
    assert c.read_line()["error"]["code"] == "bad_request"
    c.send_raw(b'{"v":1,"id":7,"verb":"no-such-verb"}\n')
    r = c.read_line()
    assert r["id"] == 7 and r["error"]["code"] == "unknown_verb"
    c.send_raw(b'{"v":1,"id":8,"verb":"profile-step","args":{"duration_s":"long"}}\n')
    r = c.read_line()
    assert r["id"] == 8 and r["error"]["code"] == "bad_args"
    c.send_raw(b'{"v":1,"id":9,"verb":"profile-step","args":{"kernels":"yes"}}\n')
    r = c.read_line()
    assert r["id"] == 9 and r["error"]["code"] == "bad_args" and "kernels" in r["error"]["message"]
    assert c.request("status")["ok"]


def test_a_client_of_another_protocol_version_is_told_so(trainer):
    c = Client(trainer.socket, hello=False)
    c.send_raw(b'{"v":99,"id":0,"verb":"hello"}\n')
    r = c.read_line()
    assert r["error"]["code"] == "version_mismatch" and "speaks 1" in r["error"]["message"]
    with pytest.raises(ConnectionError):
        c.read_line()  # closed after the error


def test_sigterm_still_checkpoints_and_exits_zero(trainer):
    trainer.proc.send_signal(signal.SIGTERM)
    assert trainer.proc.wait(timeout=60) == 0
    assert list((trainer.run_dir / "checkpoints").iterdir())


def test_a_killed_trainers_socket_is_removed_when_the_next_trainer_starts(tmp_path):
    import socket as pysocket
    xdg = tmp_path / "xdg"
    (xdg / "loongforge").mkdir(parents=True, mode=0o700)
    xdg.chmod(0o700)
    (xdg / "loongforge").chmod(0o700)
    stale = xdg / "loongforge" / "999999.sock"
    s = pysocket.socket(pysocket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # bound, never listening, not unlinked: what a SIGKILL leaves
    t = Trainer(tmp_path / "run", env=dict(os.environ, XDG_RUNTIME_DIR=str(xdg)), sock="")
    try:
        mine = xdg / "loongforge" / f"{t.proc.pid}.sock"
        deadline = time.time() + 60
        while not mine.exists():
            assert time.time() < deadline and t.proc.poll() is None, t.output()
            time.sleep(0.05)
        assert not stale.exists()
    finally:
        t.kill()


def test_debug_dmf_shows_each_micro_batch_s_text_width_with_dmf_on(tmp_path):
    t = Trainer(tmp_path, "dmf.enable=true")
    try:
        t.wait_for_socket()
        t.wait_for_step(3)
        out = tmp_path / "dmf.json"
        cli("debug-dmf", "--socket", t.socket, "--steps", "2", "--output", str(out))
        d = json.loads(out.read_text())
        assert d["slot"] == 32 and d["buckets"] == [14]  # every bundled task text has 14 tokens
        assert len(d["steps"]) == 2 and d["steps"][1]["step"] == d["steps"][0]["step"] + 1
        for m in (m for s in d["steps"] for m in s["micro_batches"]):
            assert m["width"] == 14 and m["text_slot_tokens"] == m["samples"] * 14 == m["text_tokens"]
            assert m["new_shape"] is False  # the first step ran this width already
            assert m["embodiments"] == [0]  # configs/n16-tiny.yaml: data.embodiment_id 0
        s = status(t.socket)
        assert s["engines"]["dmf"]["enabled"] is True and s["engines"]["dmf"]["text_buckets"] == [14]
        r = cli("debug-dmf", "--socket", t.socket, "--steps", "0", check=False)
        assert r.returncode != 0 and "steps must be an integer in [1, 256]" in r.stderr
    finally:
        t.kill()
