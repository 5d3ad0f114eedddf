"""Shared by the control-plane tests: start loongforge-train on n16-tiny with
a private socket path, talk the protocol (protocol.hpp), read process figures.

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_CLI,
LOONGFORGE_TEST_DATASET, LOONGFORGE_TEST_MODELS.
"""
import json
import os
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
CLI = os.environ.get("LOONGFORGE_CLI", str(REPO / "build/cli/loongforge"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
PROTOCOL = 1


def free_port():
    """A TCP port on 127.0.0.1 that is free now (a rendezvous port for a job the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Trainer:
    """A loongforge-train process on n16-tiny; `socket` is its control socket."""

    def __init__(self, tmp_path, *sets, steps=100000, env=None, user=None, sock=None, prefix=()):
        self.run_root = Path(tmp_path)
        self.run_root.mkdir(parents=True, exist_ok=True)
        # sock=None: a private path under tmp_path; sock="": the default placement.
        self.socket = str(self.run_root / "ctl" / "trainer.sock") if sock is None else sock
        cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
               "--set", f"data.path={DATA}", "--set", f"run.output_dir={self.run_root}",
               "--set", f"trainer.max_steps={steps}", "--set", "logging.progress=lines",
               "--set", "logging.interval_steps=1000", "--set", "run.threads=1",
               "--set", "checkpoint.interval_steps=1000000", "--set", f"control.socket={self.socket}"]
        for s in sets:
            cmd += ["--set", s]
        self.log = open(self.run_root / "trainer.log", "w")
        self.proc = subprocess.Popen([*prefix, *cmd], stdout=self.log, stderr=subprocess.STDOUT, env=env, user=user)
        self.run_dir = self.run_root / "n16-tiny-demo"

    def wait_for_socket(self, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if os.path.exists(self.socket):
                return
            assert self.proc.poll() is None, f"trainer exited early:\n{self.output()}"
            time.sleep(0.05)
        raise AssertionError(f"no control socket after {timeout} s:\n{self.output()}")

    def wait_for_step(self, step, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            s = status(self.socket)
            if s.get("step", 0) >= step:
                return s
            time.sleep(0.1)
        raise AssertionError(f"trainer did not reach step {step}:\n{self.output()}")

    def output(self):
        if not self.log.closed:
            self.log.flush()
        return (self.run_root / "trainer.log").read_text()

    def rss_kb(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def hwm_kb(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return 0

    def steps_done(self):
        metrics = self.run_dir / "metrics.jsonl"
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Client:
    """One connection speaking newline-delimited JSON."""

    def __init__(self, path, hello=True, timeout=30):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        if hello:
            r = self.request("hello", {"client": "test"}, id=0)
            assert r["ok"], r

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def read_line(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, verb, args=None, id=None):
        if id is None:
            id, self.next_id = self.next_id, self.next_id + 1
        self.send_raw((json.dumps({"v": PROTOCOL, "id": id, "verb": verb, "args": args or {}}) + "\n").encode())
        while True:
            r = self.read_line()
            if r.get("id") == id or not r.get("ok", True):
                return r

    def close(self):
        self.sock.close()


def status(path):
    c = Client(path)
    try:
        r = c.request("status")
        assert r["ok"], r
        return r["result"]
    finally:
        c.close()


def cli(*args, check=True, timeout=300, user=None):
    r = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, user=user)
    if check:
        assert r.returncode == 0, f"loongforge {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def model_with_other_code(out):
    """n16-tiny saved to `out` with another model-code record (code.json's sha256 zeroed), as if scripts/model/
    had changed since its export; returns `out`."""
    import torch
    names = ("config.json", "params.json", "flops.json", "counts.json", "batch_spec.json", "code.json")
    extra = {"loongforge/" + n: "" for n in names}
    module = torch.jit.load(str(MODEL), map_location="cpu", _extra_files=extra)
    code = json.loads(extra["loongforge/code.json"])
    code["sha256"] = "0" * 64
    extra["loongforge/code.json"] = json.dumps(code)
    torch.jit.save(module, str(out), _extra_files=extra)
    return out
