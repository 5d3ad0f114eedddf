"""scripts/slurm/multi-node.sbatch on a real Slurm of two nodes (a private one
on this machine: slurm_cluster.py with nodes=2), one CPU task per node
through Gloo, n16-tiny.

Topology (all on this machine, one network namespace per node):

    root namespace  bridge lf-slurm0, 10.78.0.254/24; munged; slurmctld
                    (SlurmctldHost=<this host>(10.78.0.254)); the test,
                    sbatch, scontrol; the one-host reference run
    netns lf-n1     eth0 10.78.0.1/24 (veth, peer lf-n1-br on the bridge),
                    hostname n1, slurmd -N n1 (NodeName=n1 NodeAddr=10.78.0.1):
                    the batch shell (job.sh, srun) and task 0 = rank 0
    netns lf-n2     eth0 10.78.0.2/24 (peer lf-n2-br), hostname n2,
                    slurmd -N n2 (NodeAddr=10.78.0.2): task 1 = rank 1

The hostnames resolve nowhere; srun in lf-n1 reaches slurmctld and n2's
slurmd over the bridge, rank 1 reaches rank 0's store and Gloo there too.
Submitted as `sbatch --nodes=2 --ntasks-per-node=1 --gpus-per-node=0
--cpus-per-task=1 --time=10 ... multi-node.sbatch` (the command line
overrides the script's 4 x 8 GPU lines; its --exclusive stays and takes
both nodes whole), the job:

- COMPLETES on n[1-2] with its batch shell on n1; job.sh reports 2 task(s)
  on 2 node(s) and the rendezvous at n1's NodeAddr 10.78.0.1, and every
  rendezvous the log names is that one (never 127.0.0.1 or localhost); both
  ranks join through the Slurm environment and bind Gloo to their own
  node's address (the route to MASTER_ADDR: 10.78.0.1 and 10.78.0.2);
- rank r ran in namespace lf-n<r+1> under hostname n<r+1>, which is its
  SLURMD_NODENAME (LOONGFORGE_TRAIN is a wrapper that writes down where it
  runs, then execs the trainer);
- its losses, weights and optimizer state equal, bitwise, those of the same
  2 ranks started without Slurm on one host (test_multi_rank.launch:
  MASTER_ADDR=127.0.0.1, the same config and settings).

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET,
LOONGFORGE_TEST_MODELS. Skips only when this machine cannot run Slurm (not
root, packages not installable) or cannot make network/UTS namespaces;
CI=true makes that a failure.
"""
import re
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "comm"))
sys.path.insert(0, str(HERE.parent / "control"))
from slurm_cluster import SlurmCluster, netns_inode, netns_unavailable_reason, unavailable_reason  # noqa: E402
from test_multi_rank import final_checkpoint, launch, losses, max_rel_diff, wait_all  # noqa: E402
from test_slurm import STEPS, completed, job_env, trainer_args  # noqa: E402
from trainer_harness import REPO, TRAIN  # noqa: E402

NAME = "multi"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = unavailable_reason() or netns_unavailable_reason()
    if reason:
        pytest.skip(f"this machine cannot run a two-node Slurm in network namespaces: {reason}")
    t0 = time.time()
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2) as cluster:
        print(f"\nprivate 2-node Slurm up in {time.time() - t0:.1f} s: "
              + ", ".join(f"{n.name} at {n.addr} in netns {n.netns}" for n in cluster.nodes))
        yield cluster


def where_wrapper(out):
    """A LOONGFORGE_TRAIN that writes task<SLURM_PROCID>.where (hostname, node, netns), then execs the trainer."""
    wrapper = out / "train-where"
    wrapper.write_text(f"""#!/bin/sh
{{ echo "hostname=$(hostname)"; echo "node=$SLURMD_NODENAME"; echo "netns=$(readlink /proc/self/ns/net)"; }} \\
  > "{out}/task$SLURM_PROCID.where"
exec "{TRAIN}" "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


def where(out, task):
    return dict(l.split("=", 1) for l in (out / f"task{task}.where").read_text().splitlines())


@pytest.fixture(scope="module")
def job(slurm, tmp_path_factory):
    """multi-node.sbatch, 2 nodes x 1 CPU task, run to its end: (output folder, log text, scontrol fields)."""
    out = tmp_path_factory.mktemp("two-nodes")
    log = out / f"{NAME}.out"
    t0 = time.time()
    args = ["--job-name", NAME, "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1",
            "--time=10", f"--output={log}", f"--chdir={out}", str(REPO / "scripts/slurm/multi-node.sbatch"),
            *trainer_args(out, NAME)]
    j = slurm.wait(slurm.sbatch(args, job_env(where_wrapper(out))), completed, timeout=240, log=log)
    print(f"2-node job: {time.time() - t0:.1f} s")
    return out, log.read_text(), j


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The same 2 ranks without Slurm, on one host (127.0.0.1): its run folder."""
    out = tmp_path_factory.mktemp("one-host")
    t0 = time.time()
    wait_all(launch(out, 2, name=NAME, steps=STEPS), out)
    print(f"2 ranks on one host: {time.time() - t0:.1f} s")
    return out / NAME


def test_the_job_completes_with_two_tasks_on_two_nodes(job):
    _, text, j = job
    assert j["ExitCode"] == "0:0" and j["NodeList"] == "n[1-2]" and j["BatchHost"] == "n1", j
    assert "2 task(s) on 2 node(s) (n[1-2])" in text, text
    assert "training ended with exit status 0" in text, text


def test_the_rendezvous_is_node_1s_address_not_localhost(slurm, job):
    _, text, _ = job
    n1 = slurm.nodes[0]
    assert n1.name == "n1" and not n1.addr.startswith("127.")
    rendezvous = re.findall(r"rendezvous ([^\s,]+):\d+", text)
    assert len(rendezvous) == 3 and set(rendezvous) == {n1.addr}, rendezvous  # job.sh's line and both ranks'
    assert "127.0.0.1" not in text and "localhost" not in text, text
    for rank, node in enumerate(slurm.nodes):
        assert re.search(rf"rank {rank} of 2 joined \(Slurm environment[^\n]*Gloo on {re.escape(node.addr)} "
                         r"\(the route to MASTER_ADDR", text), text


def test_each_rank_ran_in_its_own_nodes_namespace_under_its_own_hostname(slurm, job):
    out, _, _ = job
    for task, node in enumerate(slurm.nodes):
        assert where(out, task) == {"hostname": node.name, "node": node.name,
                                    "netns": f"net:[{netns_inode(node.netns)}]"}, (task, node)
    assert where(out, 0)["netns"] != where(out, 1)["netns"]


def test_the_losses_and_parameters_equal_the_same_two_ranks_on_one_host_bitwise(job, one_host):
    run = job[0] / NAME
    a, b = losses(one_host), losses(run)
    print(f"2 nodes vs 1 host: {len(b)} steps, max relative loss difference {max_rel_diff(a, b):.2e}")
    assert len(a) == len(b) == STEPS and a == b  # bitwise: the same ranks, batches and reduction
    ca, wa, oa = final_checkpoint(one_host)
    cb, wb, ob = final_checkpoint(run)
    assert ca.name == cb.name and ca.name.endswith(f"_step_{STEPS}")
    assert list(wa) == list(wb) and all(wa[k].equal(wb[k]) for k in wa)
    assert list(oa) == list(ob) and all(oa[k].equal(ob[k]) for k in oa)
