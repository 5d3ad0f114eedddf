"""Only the trainer's own user reaches its control socket, and the socket's
placement refuses to be unsafe:

  - a client running as another uid (the test creates the system user
    lfctl-other) is refused: its connect() fails with EACCES at the 0700
    socket directory, and the `loongforge` CLI exits 5 saying "permission
    denied";
  - root, who passes every file permission, is refused by SO_PEERCRED with a
    permission_denied reply (CLI exit 5) unless the trainer sets
    control.allow_root=true;
  - a pre-existing socket directory that is group/other accessible (0755),
    owned by another user, or a symlink makes the trainer exit at once with a
    message naming the directory and the fix;
  - a stale socket (nobody answers) is replaced; a live one (someone answers)
    is refused with "another trainer already serves";
  - the trainer creates its directory 0700 and its socket 0600, and removes the
    socket when it exits after `loongforge stop`.

Needs root (it creates a user and switches to it); skipped otherwise. The
binaries load libtorch from the venv under /root (mode 0700), so processes
that run *binaries* as lfctl-other get CAP_DAC_READ_SEARCH alone (setpriv
--ambient-caps): it lets them read and search directories, never write or
connect to a socket they do not own. The raw-protocol client of case (a) runs
as lfctl-other with no capability at all (a forked child that setuid()s).

Environment as in trainer_harness.py.
"""
import errno
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from trainer_harness import CLI, PROTOCOL, Client, Trainer, cli, status

OTHER = "lfctl-other"

if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
    pytest.skip("needs root, useradd and setpriv (creates a user and runs as it)", allow_module_level=True)


@pytest.fixture(scope="module")
def other():
    """The other user (created once, kept: creating it again is a no-op)."""
    try:
        return pwd.getpwnam(OTHER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER], check=True,
                       capture_output=True)
        return pwd.getpwnam(OTHER)


def as_user(pw, *cmd):
    """`cmd` as pw's uid/gid with CAP_DAC_READ_SEARCH only (see the docstring)."""
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--", *cmd]


def connect_as(pw, path):
    """connect() to `path` from a child that setuid()s to pw (no capabilities);
    returns 0 on success, else the errno."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no Python-level cleanup, report through the pipe
        code = 255
        try:
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                code = 0
            except OSError as e:
                code = e.errno
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    code = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return code[0]


@pytest.fixture
def shared_tmp():
    """A scratch directory that every user may traverse (pytest's own tmp root is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="lfctl-sec-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def trainer_as(pw, root, *sets):
    """loongforge-train running as pw, its run directory owned by pw."""
    root.mkdir(mode=0o755)
    os.chown(root, pw.pw_uid, pw.pw_gid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root)}
    return Trainer(root, *sets, env=env, prefix=as_user(pw))


def wait_for_answer(t, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert t.proc.poll() is None, f"trainer exited early:\n{t.output()}"
        try:
            return status(t.socket)
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.05)
    raise AssertionError(f"the trainer never answered on {t.socket}:\n{t.output()}")


def refused_start(t, timeout=30):
    """The trainer exits non-zero within `timeout` s; returns its output."""
    try:
        rc = t.proc.wait(timeout=timeout)
    finally:
        t.kill()
    out = t.output()
    assert rc != 0, f"the trainer started although it should refuse:\n{out}"
    return out


def uid_of(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


# ---------------------------------------------------------------------------
# (a) another uid as the client


def test_a_client_of_another_uid_cannot_reach_a_root_trainer_and_the_cli_exits_5(other, shared_tmp):
    t = Trainer(shared_tmp / "run")
    try:
        wait_for_answer(t)
        sock_dir = Path(t.socket).parent
        assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700 and sock_dir.stat().st_uid == 0
        # Raw protocol, no capabilities: the 0700 directory stops it.
        assert connect_as(other, t.socket) == errno.EACCES
        # The CLI (may search directories, see the docstring): the 0600 socket stops it.
        r = subprocess.run(as_user(other, CLI, "status", "--socket", t.socket), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
        assert "permission denied" in r.stderr and t.socket in r.stderr, r.stderr
        # The owner is still served, and the trainer never saw the others.
        assert status(t.socket)["phase"] in ("starting", "loading", "training")
        assert t.proc.poll() is None
    finally:
        t.kill()


# ---------------------------------------------------------------------------
# (b) SO_PEERCRED: root connecting to another user's trainer


def test_root_is_refused_by_another_users_trainer_unless_allow_root_is_set(other, shared_tmp):
    t = trainer_as(other, shared_tmp / "run")
    try:
        t.wait_for_socket()
        assert uid_of(t.proc.pid) == other.pw_uid
        # Root passes the directory and the socket's mode; the server refuses it by its credentials.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(30)
        c.connect(t.socket)
        data = b""
        while chunk := c.recv(4096):
            data += chunk
        c.close()
        lines = [json.loads(x) for x in data.splitlines()]
        assert len(lines) == 1 and lines[0]["v"] == PROTOCOL and lines[0]["ok"] is False, lines
        err = lines[0]["error"]
        assert err["code"] == "permission_denied", err
        assert f"uid {other.pw_uid}" in err["message"] and "control.allow_root=true" in err["message"], err
        assert t.proc.poll() is None, "a refused client stopped the trainer"
        deadline = time.time() + 10
        while "refused a control client of uid 0" not in t.output() and time.time() < deadline:
            time.sleep(0.1)
        assert "refused a control client of uid 0" in t.output(), t.output()
    finally:
        t.kill()

    t2 = trainer_as(other, shared_tmp / "run2", "control.allow_root=true")
    try:
        s = wait_for_answer(t2)
        assert s["pid"] == t2.proc.pid and uid_of(t2.proc.pid) == other.pw_uid
        r = cli("status", "--socket", t2.socket, "--json", timeout=60)
        assert f'"pid": {t2.proc.pid}' in r.stdout, r.stdout
    finally:
        t2.kill()


def test_the_cli_run_as_root_against_another_users_trainer_exits_5_every_time(other, shared_tmp):
    t = trainer_as(other, shared_tmp / "run")
    try:
        t.wait_for_socket()
        for _ in range(10):  # the refusal races the CLI's first line: one try could pass by luck
            r = cli("status", "--socket", t.socket, check=False, timeout=60)
            assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
            assert "permission denied" in r.stderr and "allow_root" in r.stderr, r.stderr
        assert t.proc.poll() is None
    finally:
        t.kill()


# ---------------------------------------------------------------------------
# (c) an unsafe pre-existing socket directory


def test_a_preexisting_socket_directory_open_to_others_is_refused_with_the_chmod_fix(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o755)
    t0 = time.time()
    out = refused_start(Trainer(tmp_path / "run", sock=str(d / "x.sock")))
    assert time.time() - t0 < 30
    assert str(d) in out and "0755" in out and f"chmod 700 {d}" in out, out
    assert not (d / "x.sock").exists()


def test_a_socket_directory_of_another_owner_is_refused(other, tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, other.pw_uid, other.pw_gid)
    out = refused_start(Trainer(tmp_path / "run", sock=str(d / "x.sock")))
    assert str(d) in out and f"belongs to uid {other.pw_uid}" in out, out
    assert not (d / "x.sock").exists()


def test_a_symlink_in_place_of_the_socket_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    out = refused_start(Trainer(tmp_path / "run", sock=str(link / "x.sock")))
    assert str(link) in out and "not a directory" in out, out
    assert not (real / "x.sock").exists()


# ---------------------------------------------------------------------------
# (d) what already sits at the socket path


def private_dir(tmp_path):
    d = tmp_path / "ctl"
    d.mkdir(mode=0o700)
    return d


def test_a_stale_socket_at_the_path_is_replaced(tmp_path):
    path = private_dir(tmp_path) / "x.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays; nobody answers
    stale = path.stat()
    with pytest.raises(ConnectionRefusedError):
        Client(str(path))
    t = Trainer(tmp_path / "run", sock=str(path))
    try:
        s = wait_for_answer(t)
        assert s["pid"] == t.proc.pid and s["socket"] == str(path)
        now = path.stat()
        assert stat.S_ISSOCK(now.st_mode) and now.st_ctime_ns > stale.st_ctime_ns  # a new file, not the stale one
    finally:
        t.kill()


def test_a_live_server_at_the_path_is_refused_and_left_alone(tmp_path):
    path = private_dir(tmp_path) / "x.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen(4)
    try:
        out = refused_start(Trainer(tmp_path / "run", sock=str(path)))
        assert f"another trainer already serves {path}" in out, out
        # Its socket is untouched and still answers.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))
        probe.close()
    finally:
        live.close()


def test_a_file_that_is_not_a_socket_at_the_path_is_refused(tmp_path):
    path = private_dir(tmp_path) / "x.sock"
    path.write_text("mine\n")
    out = refused_start(Trainer(tmp_path / "run", sock=str(path)))
    assert str(path) in out and "is not a socket" in out, out
    assert path.read_text() == "mine\n"


# ---------------------------------------------------------------------------
# (e) what the trainer creates, and removes


def test_the_trainer_creates_a_0700_directory_and_a_0600_socket_and_removes_it_after_stop(tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    t = Trainer(tmp_path / "run", sock="", env=env)  # the default placement: $XDG_RUNTIME_DIR/loongforge/<pid>.sock
    try:
        t.socket = str(xdg / "loongforge" / f"{t.proc.pid}.sock")
        s = wait_for_answer(t)
        assert s["socket"] == t.socket
        d, f = (xdg / "loongforge").lstat(), Path(t.socket).lstat()
        assert stat.S_ISDIR(d.st_mode) and stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.getuid()
        assert stat.S_ISSOCK(f.st_mode) and stat.S_IMODE(f.st_mode) == 0o600 and f.st_uid == os.getuid()
        r = cli("stop", "--socket", t.socket, timeout=120)
        assert r.returncode == 0 and "stopped at step" in r.stdout, r.stdout
        assert t.proc.wait(timeout=60) == 0, t.output()
        assert not os.path.exists(t.socket), "the socket outlived its trainer"
    finally:
        t.kill()
