"""A private Slurm for the tests, on this machine: munged, slurmctld and one
slurmd per node, started from a generated slurm.conf in a temporary folder,
each node with the machine's real CPU count and memory (`slurmd -C`), and
stopped again (only the processes started here).

Two topologies:

- `SlurmCluster(root)`: one node named after this host, everything on
  127.0.0.1 (free ports).
- `SlurmCluster(root, nodes=N)`: N nodes n1..nN, node i a network namespace
  lf-n<i> whose eth0 (10.78.0.<i>/24) is one end of a veth pair; the other
  end, lf-n<i>-br, is a port of the bridge lf-slurm0 (10.78.0.254/24) in the
  root namespace. `slurmd -N n<i>` runs inside its namespace (`nsenter
  --net`) under its own hostname n<i> (`unshare --uts`; the names resolve
  nowhere) and slurm.conf says `NodeName=n<i> NodeAddr=10.78.0.<i>` (one
  SlurmdPort for all: each node has its own ports). munged, slurmctld
  (`SlurmctldHost=<this host>(10.78.0.254)`) and the clients (sbatch,
  scontrol) stay in the root namespace; munge's socket is a file, reachable
  from every namespace. A job runs where its node's slurmd runs: the batch
  shell in lf-n1, each srun task in its node's namespace, talking to
  slurmctld and to the other slurmds over the bridge. (10.77.0.x and the
  lf<pid>a/b namespaces are test/comm/test_multi_host.py's.) Namespaces,
  veths and the bridge left by an earlier run, and the processes still in
  those namespaces, are removed before; all of it again on exit, also when
  start-up fails. Every daemon gets PR_SET_PDEATHSIG (SIGTERM), so it dies
  with the test process even when that is killed.

Needs root (slurmd runs jobs as their user; SlurmdUser=root) and the Debian
packages slurm-wlm and munge (plus iproute2, util-linux and hostname for
nodes=N), which ensure_packages() installs with apt-get when they are
missing. Choices for a container without systemd or cgroup delegation:
ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no accounting,
ReturnToService=2, CR_CPU (a task per logical CPU, also where a core has two
threads); AuthInfo cred_expire=10 because a requeued job waits cred_expire +
1 s before it may start again (slurm.conf(5)).

    with SlurmCluster(tmp) as slurm:                       # or nodes=2
        job = slurm.sbatch(["--ntasks=2", "script.sbatch"], env)
        slurm.wait(job, lambda j: j["JobState"] == "COMPLETED")
"""
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections import namedtuple
from pathlib import Path

PACKAGES = ["slurm-wlm", "munge"]
DAEMONS = ["munged", "slurmctld", "slurmd"]
CLIENTS = ["sbatch", "scontrol", "scancel", "sinfo", "squeue"]
NETNS_PACKAGES = ["iproute2", "util-linux", "hostname"]

SUBNET = "10.78.0"            # test/comm/test_multi_host.py has 10.77.0
CTLD_ADDR = f"{SUBNET}.254"   # slurmctld's address on the bridge
BRIDGE = "lf-slurm0"
NODE_NETNS = re.compile(r"lf-n\d+$")  # the namespaces (and, with -br, the veths) made here

# name: NodeName and hostname; addr: NodeAddr; netns: its namespace (None: the root one)
Node = namedtuple("Node", "name addr netns")


def which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def unavailable_reason():
    """None when Slurm can run here, else why not (after trying to install it)."""
    if os.geteuid() != 0:
        return "a private Slurm needs root (slurmd runs jobs with SlurmdUser=root); run the test as root"
    return _missing_after_install(DAEMONS + CLIENTS, PACKAGES)


def netns_unavailable_reason():
    """None when this machine can make network namespaces and UTS namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run the test as root"
    reason = _missing_after_install(["ip", "nsenter", "unshare", "hostname"], NETNS_PACKAGES)
    if reason:
        return reason
    probe = "lf-n0probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return (f"`ip netns add {probe}` failed here: {r.stderr.strip()} (the kernel or the container refuses new "
                "network namespaces: needs CAP_SYS_ADMIN and a writable /run/netns)")
    _ip("netns", "del", probe, check=False)
    r = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`unshare --uts true` failed here: {r.stderr.strip()} (no UTS namespaces: no own hostname per node)"
    return None


def _missing_after_install(programs, packages):
    missing = [n for n in programs if not which(n)]
    if not missing:
        return None
    reason = ensure_packages(packages)
    if reason:
        return reason
    missing = [n for n in programs if not which(n)]
    return f"after installing {' '.join(packages)}, still not found: {' '.join(missing)}" if missing else None


def ensure_packages(packages=PACKAGES):
    """apt-get install the packages; None on success, else the reason."""
    if not shutil.which("apt-get"):
        return f"{' '.join(packages)} are not installed and there is no apt-get to install them"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:  # stale package lists: update once, then retry
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return f"`{' '.join(cmd)}` failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}"
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ip(*args, check=True):
    r = subprocess.run([which("ip"), *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


# -- the network of a multi-node cluster ---------------------------------------
class NodeNetwork:
    """The bridge, the veth pairs and the namespaces of nodes n1..n<count> (module docstring)."""

    def __init__(self, count):
        self.nodes = [Node(f"n{i}", f"{SUBNET}.{i}", f"lf-n{i}") for i in range(1, count + 1)]

    def create(self):
        self.remove()  # what a killed earlier run left behind
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{CTLD_ADDR}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for n in self.nodes:
            _ip("netns", "add", n.netns)
            _ip("link", "add", f"{n.netns}-br", "type", "veth", "peer", "name", "eth0", "netns", n.netns)
            _ip("link", "set", f"{n.netns}-br", "master", BRIDGE, "up")
            _ip("-n", n.netns, "addr", "add", f"{n.addr}/24", "dev", "eth0")
            _ip("-n", n.netns, "link", "set", "eth0", "up")
            _ip("-n", n.netns, "link", "set", "lo", "up")

    def remove(self):
        """Every lf-n<i> namespace (its processes killed first), lf-n<i>-br veth and the bridge."""
        for ns in _ip("netns", "list").stdout.split():
            if NODE_NETNS.match(ns):
                kill_processes_in(ns)
                _ip("netns", "del", ns)
        for link in re.findall(r"^\d+: ([^:@\s]+)", _ip("-o", "link", "show").stdout, re.M):
            if link == BRIDGE or (link.endswith("-br") and NODE_NETNS.match(link[:-3])):
                _ip("link", "del", link, check=False)  # a veth may vanish with its peer's namespace

    @staticmethod
    def run_in(node, cmd):
        """cmd inside the node's namespace, under its own hostname. nsenter, not `ip netns exec`: that one
        mounts a fresh /sys for the namespace, which hides /sys/fs/cgroup, and slurmd refuses to start
        without it ("Unable to initialize cgroup plugin")."""
        return [which("nsenter"), f"--net=/run/netns/{node.netns}", which("unshare"), "--uts", "sh", "-c",
                f'hostname {node.name} && exec "$@"', "sh", *cmd]


def kill_processes_in(netns, timeout=10):
    """SIGKILL to every process in the network namespace until none is left."""
    t0 = time.time()
    while True:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]
        if not pids:
            return
        if time.time() - t0 > timeout:
            raise RuntimeError(f"processes {pids} in network namespace {netns} survive SIGKILL for {timeout} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def netns_inode(netns):
    """The inode of a named network namespace: what /proc/<pid>/ns/net of its processes shows, net:[<inode>]."""
    return os.stat(f"/run/netns/{netns}").st_ino


# -- the cluster ---------------------------------------------------------------
class SlurmCluster:
    def __init__(self, root, nodes=None):
        self.root = Path(root)
        self.procs = {}
        self.network = NodeNetwork(nodes) if nodes else None

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self):
        try:
            self._start_munged()
            hardware = self._hardware()
            if self.network:
                self.network.create()
                self.nodes, ctld_addr = self.network.nodes, CTLD_ADDR
            else:
                self.nodes, ctld_addr = [Node(self.host, "127.0.0.1", None)], "127.0.0.1"
            self.node_name = self.nodes[0].name
            self._write_conf(ctld_addr, hardware)
            self.env = dict(os.environ, SLURM_CONF=str(self.conf))
            self._start("slurmctld", [which("slurmctld"), "-D", "-f", str(self.conf)])
            for n in self.nodes:
                self._start_slurmd(n)
            names = " ".join(n.name for n in self.nodes)
            self._wait_for(self._nodes_idle, lambda: f"node(s) {names} idle (sinfo: {self.node_states()})",
                           timeout=90)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self._alive("slurmctld"):
            for job in self.jobs():
                subprocess.run([which("scancel"), job], env=self.env, capture_output=True)
        for name in reversed(list(self.procs)):  # the slurmds, slurmctld, munged
            self._stop(name)
        if self.network:
            self.network.remove()  # also the job steps still running in the namespaces

    def _start_munged(self):
        r = self.root
        for d in ("munge", "ctld", "d", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)          # munged: its socket's folders must be reachable
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = r / "munge" / "munge.sock"
        self._start("munged", [which("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/seed"])
        self._wait_for(lambda: self.munge_socket.exists(), "munged's socket")

    def _hardware(self):
        """This machine's `slurmd -C` node line without its NodeName (CPUs=... RealMemory=...); sets self.host."""
        line = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
        name, _, hardware = line.partition(" ")
        self.host = name.split("=", 1)[1]  # slurmctld must run on the host SlurmctldHost names
        return hardware

    def _write_conf(self, ctld_addr, hardware):
        r = self.root
        nodes = "\n".join(f"NodeName={n.name} NodeAddr={n.addr} {hardware} State=UNKNOWN" for n in self.nodes)
        self.conf = r / "slurm.conf"
        self.conf.write_text(f"""# Generated by test/slurm/slurm_cluster.py
ClusterName=lftest
SlurmctldHost={self.host}({ctld_addr})
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/d/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
KillWait=30
MinJobAge=600
{nodes}
PartitionName=lf Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _start_slurmd(self, node):
        (self.root / "d" / node.name).mkdir(exist_ok=True)
        cmd = [which("slurmd"), "-D", "-N", node.name, "-f", str(self.conf)]
        self._start(f"slurmd-{node.name}", NodeNetwork.run_in(node, cmd) if node.netns else cmd)

    def _start(self, name, cmd):
        log = open(self.root / "log" / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                            env=getattr(self, "env", os.environ))

    def _alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def _stop(self, name):
        p = self.procs[name]
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _wait_for(self, ready, what, timeout=30):
        t0 = time.time()
        while not ready():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {_said(what)}:\n"
                                       f"{self.logs()}")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"no {_said(what)} after {timeout} s:\n{self.logs()}")
            time.sleep(0.3)

    def node_states(self):
        """{node name: state} from sinfo ({} when slurmctld does not answer)."""
        r = subprocess.run([which("sinfo"), "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True, text=True)
        return dict(l.split(None, 1) for l in r.stdout.splitlines() if l.strip()) if r.returncode == 0 else {}

    def _nodes_idle(self):
        states = self.node_states()
        return sorted(states) == sorted(n.name for n in self.nodes) and set(states.values()) == {"idle"}

    def logs(self):
        out = []
        for f in sorted((self.root / "log").iterdir()):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    # -- jobs -----------------------------------------------------------------
    def sbatch(self, args, env):
        r = subprocess.run([which("sbatch"), "--parsable", *args], env={**env, "SLURM_CONF": str(self.conf)},
                           capture_output=True, text=True)
        assert r.returncode == 0, f"sbatch {' '.join(args)} failed: {r.stderr}"
        return r.stdout.strip().split(";")[0]

    def jobs(self):
        r = subprocess.run([which("squeue"), "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
        return r.stdout.split() if r.returncode == 0 else []

    def job(self, job_id):
        """scontrol show job, as a dict (JobState, Restarts, ExitCode, ...)."""
        r = subprocess.run([which("scontrol"), "show", "job", "-o", job_id], env=self.env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        fields = {}
        for tok in r.stdout.split():
            k, _, v = tok.partition("=")
            fields.setdefault(k, v)
        return fields

    def scancel(self, *args):
        r = subprocess.run([which("scancel"), *args], env=self.env, capture_output=True, text=True)
        assert r.returncode == 0, f"scancel {' '.join(args)}: {r.stderr}"

    def wait(self, job_id, done, timeout, log=None):
        """Polls the job until done(fields) or it ends otherwise; returns the fields."""
        t0 = time.time()
        while True:
            j = self.job(job_id)
            if done(j):
                return j
            if j["JobState"] in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
                raise AssertionError(f"job {job_id} ended {j['JobState']} (exit {j.get('ExitCode')}):\n"
                                     f"{Path(log).read_text() if log and Path(log).exists() else ''}\n{self.logs()}")
            if time.time() - t0 > timeout:
                raise AssertionError(f"job {job_id} not done after {timeout} s (state {j['JobState']}):\n"
                                     f"{Path(log).read_text() if log and Path(log).exists() else ''}\n{self.logs()}")
            time.sleep(1)


def _said(what):
    return what() if callable(what) else what
