"""Several hosts on one machine: two ranks in separate network namespaces
(a veth pair, 10.77.0.1/24 and 10.77.0.2/24), each with its own hostname
(`unshare --uts`; the names resolve nowhere), rendezvous at
MASTER_ADDR=10.77.0.1 and train n16-tiny through Gloo; the result equals the
same 2-rank run on one host (127.0.0.1), bitwise. This proves nothing
assumes localhost or a shared hostname, and checks how Gloo picks its
address (Note [Gloo interface] in src/comm/world.cpp): rank 0 names its
interface with GLOO_SOCKET_IFNAME, rank 1 takes the route to MASTER_ADDR; an
interface that does not exist is refused with a message naming the variable.

Needs root and iproute2 (`ip netns`), util-linux (`unshare`); installs them
with apt-get when missing. Skips only when network namespaces cannot be
created here (the reason is the kernel's); CI=true makes that a failure.
Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET,
LOONGFORGE_TEST_MODELS.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "control"))
from test_multi_rank import final_checkpoint, free_port, launch, losses, max_rel_diff, wait_all  # noqa: E402
from trainer_harness import DATA, MODEL, REPO, TRAIN  # noqa: E402

STEPS = 12
SUBNET = "10.77.0"


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


def ensure_tools():
    if shutil.which("ip") and shutil.which("unshare"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "`ip` (iproute2) or `unshare` (util-linux) is missing and cannot be installed here"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "iproute2", "util-linux"]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {r.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def hosts():
    """Two network namespaces joined by a veth pair: [(netns, interface, address), ...]."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run the test as root")
    reason = ensure_tools()
    if reason:
        pytest.skip(reason)
    tag = f"lf{os.getpid() % 10000000}"
    ns = [f"{tag}a", f"{tag}b"]  # namespace and interface names (<= 15 characters)
    made = []
    try:
        for n in ns:
            r = sh("ip", "netns", "add", n, check=False)
            if r.returncode != 0:
                pytest.skip(f"`ip netns add {n}` failed here: {r.stderr.strip()} (the kernel or the container "
                            "refuses new network namespaces: needs CAP_SYS_ADMIN and a writable /run/netns)")
            made.append(n)
        sh("ip", "link", "add", ns[0], "type", "veth", "peer", "name", ns[1])
        out = []
        for i, n in enumerate(ns):
            addr = f"{SUBNET}.{i + 1}"
            sh("ip", "link", "set", n, "netns", n)
            sh("ip", "-n", n, "addr", "add", f"{addr}/24", "dev", n)
            sh("ip", "-n", n, "link", "set", n, "up")
            sh("ip", "-n", n, "link", "set", "lo", "up")
            out.append((n, n, addr))
        yield out
    finally:
        for n in made:
            sh("ip", "netns", "del", n, check=False)  # removes its end of the veth pair, and so the pair


def launch_hosts(out, hosts, extra_env, name="job", steps=STEPS):
    """One rank per namespace, hostname host-<rank>; rank 0 serves the store at 10.77.0.1."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for r, (ns, _, _) in enumerate(hosts):
        env = dict(os.environ, WORLD_SIZE=str(len(hosts)), RANK=str(r), LOCAL_RANK="0", MASTER_ADDR=hosts[0][2],
                   MASTER_PORT=str(port), **extra_env[r])
        cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
               f'hostname host-{r} && hostname > "{out}/hostname{r}" && exec "$@"', "sh",
               TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
               "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", f"run.name={name}",
               "--set", f"trainer.max_steps={steps}", "--set", "trainer.micro_batch_size=4",
               "--set", "run.threads=1", "--set", "run.deterministic=true", "--set", "logging.progress=lines",
               "--set", "checkpoint.interval_steps=1000000", "--set", f"control.socket={out}/ctl{r}/s.sock"]
        log = open(out / f"rank{r}.log", "a")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    return procs


def test_two_ranks_in_two_network_namespaces_equal_the_same_run_on_one_host(hosts, tmp_path):
    wait_all(launch(tmp_path / "one", 2, name="job", steps=STEPS), tmp_path / "one")
    logs = wait_all(launch_hosts(tmp_path / "two", hosts, [{"GLOO_SOCKET_IFNAME": hosts[0][1]}, {}]),
                    tmp_path / "two")
    assert [(tmp_path / "two" / f"hostname{r}").read_text().strip() for r in range(2)] == ["host-0", "host-1"]
    assert subprocess.run(["getent", "hosts", "host-1"], capture_output=True).returncode != 0  # resolves nowhere
    assert f"rendezvous {SUBNET}.1:" in logs
    assert f"Gloo on interface(s) {hosts[0][1]} (GLOO_SOCKET_IFNAME)" in logs, logs
    assert f"Gloo on {SUBNET}.2 (the route to MASTER_ADDR" in logs, logs
    a, b = losses(tmp_path / "one" / "job"), losses(tmp_path / "two" / "job")
    print(f"\n2 namespaces vs 1 host: {len(b)} steps, max relative loss difference {max_rel_diff(a, b):.2e}")
    assert len(a) == len(b) == STEPS and a == b  # bitwise: the same ranks, batches and reduction
    ca, wa, _ = final_checkpoint(tmp_path / "one" / "job")
    cb, wb, _ = final_checkpoint(tmp_path / "two" / "job")
    assert ca.name == cb.name and all(wa[k].equal(wb[k]) for k in wa)


def test_an_unknown_gloo_socket_ifname_is_refused_naming_the_variable(hosts, tmp_path):
    procs = launch_hosts(tmp_path, hosts, [{}, {"GLOO_SOCKET_IFNAME": "nosuch0"}], steps=2)
    try:
        assert procs[1].wait(timeout=120) == 1
    finally:
        procs[0].kill()  # it would wait for rank 1's Gloo address until the rendezvous timeout
        procs[0].wait()
    log = (tmp_path / "rank1.log").read_text()
    assert "GLOO_SOCKET_IFNAME='nosuch0': interface 'nosuch0' is unusable" in log, log
    assert "ip -brief address" in log
