"""`target: slurm` against a real Slurm cluster (tests/slurm_lab.py: slurmctld on a login node, slurmd
on 3 compute nodes, one shared home): an allocation per job, one srun step per node with podrun's
agent as its task, and nothing left in squeue or on any node after the job, a failure, Ctrl-C or stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from podrun.capacity.slurm import parse_records
from podrun.spec.model import SshOptions
from podrun.transport.ssh import host_transport

from helpers import (
    REPO,
    Background,
    job_id_in,
    listed_as_json,
    live_processes,
    podrun,
    processes_of_job,
    run_in_terminal,
    wait_until,
)

pytestmark = pytest.mark.lab

RANK_LINE = re.compile(r"^\[w(\d) r\d+\] rank (\d) world_size (\d) local_rank (\d) worker (\d) host (\S+) checksum (\S+)$")


def slurm_jobs(cluster) -> list[tuple[int, str, str]]:
    """(job id, name, state) of every job `squeue` shows (`squeue --json` also lists ended ones for a while)."""
    shown = cluster.slurm("squeue --noheader --format='%i|%j|%T'")
    assert shown.returncode == 0, shown.stderr
    return [(int(job_id), name, state) for job_id, name, state in
            (line.split("|") for line in shown.stdout.splitlines() if line.strip())]


def left_on_nodes(marker: str) -> list[str]:
    """The processes whose command line holds `marker`, on any node: the lab's nodes share this machine's
    pid namespace, so `ps` here shows every node's."""
    return [f"{pid} {command}" for pid, command, _ in live_processes() if marker in command]


def test_torchrun_ddp_on_two_nodes_from_the_example_config(home, cluster, tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "slurm-ddp.yaml").read_text())
    assert spec["target"]["slurm"]["login"] == "root@10.97.0.10"  # the login node of lab site 0's cluster
    spec["target"]["slurm"]["login"] = cluster.login_address
    spec["ssh"]["identity_file"] = str(cluster.client_key)
    spec["workdir"] = str(REPO / "examples" / "ddp")
    spec["env"]["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    (tmp_path / "slurm-ddp.yaml").write_text(yaml.safe_dump(spec))
    result = podrun("exec", tmp_path / "slurm-ddp.yaml", "--no-collapse", timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    ranks = [RANK_LINE.match(line).groups() for line in result.stdout.splitlines() if RANK_LINE.match(line)]
    assert sorted(int(rank) for _, rank, *_ in ranks) == list(range(4)), result.stdout
    for prefix_worker, rank, world_size, _local_rank, env_worker, host, _ in ranks:
        assert world_size == "4" and prefix_worker == env_worker == str(int(rank) // 2)
        assert host == cluster.nodes[int(env_worker)].name  # worker i on the i-th node of the allocation
    assert len({checksum for *_, checksum in ranks}) == 1
    assert "shipped code (1 file) to 1 worker" in result.stderr  # once, to the shared home
    job_id = job_id_in(result.stderr)
    slurm_job = re.search(r"^podrun: Slurm job (\d+) released$", result.stderr, re.M)
    assert slurm_job, result.stderr
    assert slurm_jobs(cluster) == []
    assert processes_of_job(job_id) == []
    listed = podrun("jobs").stdout
    assert re.search(rf"^{job_id} +ddp-slurm +slurm:2 job {slurm_job.group(1)} +succeeded ", listed, re.M), listed


def test_every_worker_gets_its_node_and_worker_0_is_master_addr(home, cluster, slurm_spec):
    spec = slurm_spec("run: echo \"worker $PODRUN_WORKER of $PODRUN_NUM_WORKERS on $(hostname) master $MASTER_ADDR "
                      "ips $PODRUN_WORKER_IPS in $PWD\"", nodes=3)
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    ips = ",".join(node.ip for node in cluster.nodes)
    for index, node in enumerate(cluster.nodes):
        assert (f"[w{index}] worker {index} of 3 on {node.name} master {cluster.nodes[0].ip} ips {ips} "
                f"in /root/podrun/job/run") in result.stdout
    assert slurm_jobs(cluster) == []


def node_cpus(cluster) -> dict[str, int]:
    """Each compute node's CPUs, as its slurmd reported them to slurmctld (`scontrol show node`: CPUTot)."""
    shown = cluster.slurm("scontrol show node --oneliner")
    assert shown.returncode == 0, shown.stderr
    return {record["NodeName"]: int(record["CPUTot"]) for record in parse_records(shown.stdout)}


@pytest.mark.parametrize(("options", "cpus", "state"), [
    ("", None, "alloc"),  # the default: the whole of each node, no other job beside it
    (", exclusive: false", 1, "mix"),  # salloc --ntasks-per-node=1 alone: one CPU of each node, the rest for others
    (", cpus_per_node: 3", 3, "mix"),
])
def test_a_job_gets_the_whole_of_each_node_unless_its_spec_says_otherwise(home, cluster, slurm_spec, options, cpus,
                                                                         state):
    spec = slurm_spec("""
        run: |
          echo "cpus $SLURM_CPUS_ON_NODE on $(hostname)"
          [ "$PODRUN_WORKER" != 0 ] || sinfo --noheader --Node --format='%N is %t'
    """, options=options)
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    every = node_cpus(cluster)
    for index, node in enumerate(cluster.nodes[:2]):
        assert f"[w{index}] cpus {cpus or every[node.name]} on {node.name}\n" in result.stdout
        assert f"[w0] {node.name} is {state}\n" in result.stdout  # what another user's job finds there
    assert f"[w0] {cluster.nodes[2].name} is idle\n" in result.stdout


@pytest.fixture
def binding_cluster(slurm_lab, tmp_path_factory):
    """A cluster of 2 nodes whose Slurm binds each task to its CPUs (task/affinity, as most clusters do), each node
    with this machine's CPUs (2 at most: a short list to read), in place of the session's lab while the test runs."""
    cpus = min(2, len(os.sched_getaffinity(0)))
    if cpus < 2:
        pytest.skip("binding to part of a node needs 2 CPUs here")
    from slurm_lab import SlurmLab

    slurm_lab.stop()
    try:  # a short directory: slurmd's step sockets live under it (108 bytes at most)
        with SlurmLab(tmp_path_factory.mktemp("bind"), compute_nodes=2, cpus=cpus, task_plugin="task/affinity") as bound:
            yield bound
    finally:
        slurm_lab.start()


@pytest.mark.slow
def test_where_slurm_binds_tasks_every_rank_runs_on_all_of_its_nodes_cpus(home, binding_cluster, job_file):
    """Under task/affinity a task runs on the CPUs it asked for: one, unless the allocation is the whole node and
    the step's task is not bound to one of them. torchrun's ranks inherit the worker's CPUs."""
    cluster = binding_cluster
    every = node_cpus(cluster)
    script = "import os, socket; print('cpus', sorted(os.sched_getaffinity(0)), 'on', socket.gethostname())\n"
    for options, shared in (("", False), (", exclusive: false", True)):
        spec = job_file(f"target: {{slurm: {{login: {cluster.login_address}, nodes: 2{options}}}}}\n"
                        f"ssh: {{identity_file: {cluster.client_key}}}\n"
                        f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n"
                        "run: cpus.py\ntorchrun: {nproc_per_node: 2}\n", files={"cpus.py": script})
        result = podrun("exec", spec, "--no-collapse", timeout=180)
        assert result.returncode == 0, result.stderr
        seen = {(int(worker), int(rank)): (len(cpus.split(",")), host) for worker, rank, cpus, host
                in re.findall(r"^\[w(\d) r(\d)\] cpus \[([\d, ]+)\] on (\S+)$", result.stdout, re.M)}
        assert seen == {(index, rank): (1 if shared else every[node.name], node.name)
                        for index, node in enumerate(cluster.nodes) for rank in (2 * index, 2 * index + 1)}, result.stdout


def job_steps(cluster, slurm_job: int) -> list[tuple[str, str]]:
    """(step id, its node list) of each step of `slurm_job` that squeue shows."""
    shown = cluster.slurm(f"squeue --noheader --steps --jobs={slurm_job} --format='%i|%N'")
    assert shown.returncode == 0, shown.stderr
    return [tuple(line.split("|")) for line in shown.stdout.split()]  # type: ignore[misc]


def srun_processes(slurm_job: int) -> list[str]:
    """The srun commands of `slurm_job` running on the login node (which shares this machine's pid
    namespace), each once: srun forks a helper of its own with its command line."""
    return sorted({command for _, command, _ in live_processes()
                   if command.startswith("srun ") and f"--jobid={slurm_job} " in command})


def login_connections(cluster) -> int:
    """How many TCP connections from this machine (the launcher's) to the login node's sshd are open."""
    listed = subprocess.run(["ss", "-Htn", "state", "established"], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in listed.splitlines() if line.split()[-1:] == [f"{cluster.login.ip}:22"])


def waiting_fanouts(cluster) -> list[int]:
    """The Slurm fanouts (remote/slurm_fanout.py) running on this cluster's login node, started over SSH,
    that have not started an srun (not a child of theirs, live or ended): those waiting for a batch."""
    parents = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parents.add(int(stat.read_text().rsplit(")", 1)[1].split()[1]))
    return [pid for pid, command, environ in live_processes() if "slurm_fanout-" in command and pid not in parents
            and any(entry.startswith(b"SSH_CONNECTION=") and f" {cluster.login.ip} 22".encode() in entry
                    for entry in environ)]


def test_one_srun_step_starts_every_node_and_a_failing_node_stops_the_others(home, cluster, slurm_spec):
    # worker 2 fails once the test has seen the step; the others sleep until stopped
    spec = slurm_spec("""
        run: |
          echo up on $(hostname)
          if [ "$PODRUN_WORKER" = 2 ]; then
            while [ ! -e ~/one-step-go ]; do sleep 0.05; done; rm ~/one-step-go; exit 5
          fi
          python3 -c 'import time; time.sleep(300)' one-step-sleeper
        """, nodes=3)
    job = Background("exec", spec, "--no-collapse")
    for worker in range(3):
        job.wait_for(rf"^\[w{worker}\] up on slurm-node{worker + 1}$")
    ((slurm_job, _, _),) = slurm_jobs(cluster)
    # one step over every node, not one per node (its number: one more where the agent was not cached yet)
    ((step, step_nodes),) = job_steps(cluster, slurm_job)
    assert (step.split(".")[0], step_nodes) == (str(slurm_job), "slurm-node[1-3]")
    (srun,) = srun_processes(slurm_job)
    assert "--nodelist=slurm-node1,slurm-node2,slurm-node3 --nodes=3 --ntasks=3 " in srun
    # the login node's connections carry Slurm's commands and every worker's channel, none a worker's own:
    # at most salloc, the fanout and one command at once, on one connection per MaxSessions channels (the
    # lab's 2 make that two, sshd's default 10 one); and the fanout started while salloc waited is the
    # step's: none is left waiting for a batch beside it
    assert login_connections(cluster) <= -(-3 // cluster.login_sessions)
    assert waiting_fanouts(cluster) == []
    stacks = podrun("stacks", job_id_in(job.text), "--all")  # an attached job's stacks, through steps of their own
    assert stacks.returncode == 0, stacks.stderr
    assert len(re.findall(r"^=== pid \d+ \(parent \d+\): python3 -c .* one-step-sleeper ===$", stacks.stdout, re.M)) == 2
    (cluster.home / "one-step-go").touch()
    assert job.finish() == 5, job.text
    assert "worker 2 (slurm-node3) exited with code 5 in run" in job.text
    assert "every other worker was stopped" in job.text
    codes = [worker["exit_code"] for worker in listed_as_json(job_id_in(job.text))["workers"]]
    assert codes[2] == 5 and codes[:2] == [143, 143], codes  # each worker's own: the others' SIGTERM
    assert left_on_nodes("one-step-sleeper") == []
    assert slurm_jobs(cluster) == []


def test_a_new_connections_first_command_does_not_wait_for_a_delayed_ack(home, cluster):
    # sshd holds the first channel's confirmation until the packets it sent after the login are
    # acknowledged: ~45 ms at most connections when this end's TCP delays its ACK (ssh_library.py)
    async def first_command_s() -> float:
        login = host_transport(SshOptions(identity_file=str(cluster.client_key), check_host_keys=False), "root",
                               cluster.login.ip, None)
        await login.connect()
        try:
            started = time.monotonic()
            channel = await login.start("true")
            channel.stdin.write_eof()
            assert await channel.wait() == 0
            return time.monotonic() - started
        finally:
            await login.close()

    took = sorted(asyncio.run(first_command_s()) for _ in range(7))
    assert took[3] < 0.03, took  # the median: each that waited for the ACK took 0.04 s or more


def test_nodes_that_cannot_reach_the_login_node_run_a_step_each(home, cluster, slurm_spec, monkeypatch):
    # 127.0.0.1 on a compute node is the node itself: every connector is refused, and podrun falls back
    monkeypatch.setenv("PODRUN_SLURM_LOGIN_ADDRESS", "127.0.0.1")
    result = podrun("exec", slurm_spec("run: echo up on $(hostname) as $SLURM_STEP_NUM_NODES of a step"), "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert "[w0] up on slurm-node1 as 1 of a step" in result.stdout
    assert "[w1] up on slurm-node2 as 1 of a step" in result.stdout
    said = [line for line in result.stderr.splitlines() if "cannot connect back to the login node" in line]
    assert len(said) == 1, result.stderr  # once, not per node or per step
    assert re.match(r"podrun: slurm-node[12] cannot connect back to the login node \(127\.0\.0\.1: Connection refused\)",
                    said[0]), said
    assert said[0].endswith("PODRUN_SLURM_LOGIN_ADDRESS names an address the nodes reach")
    assert slurm_jobs(cluster) == []


def test_a_rank_that_fails_stops_the_other_node_and_podrun_exits_with_its_code(home, cluster, slurm_spec):
    spec = slurm_spec("""
        run: fail.py
        torchrun: {nproc_per_node: 2}
        device: CPU
        """, files={"fail.py": "import os, sys, time\n"
                               "print('rank', os.environ['RANK'], 'up', flush=True)\n"
                               "if os.environ['RANK'] == '3':\n"
                               "    time.sleep(1); sys.exit(7)\n"
                               "time.sleep(300)\n"})
    started = time.monotonic()
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 7, result.stderr
    assert time.monotonic() - started < 60  # not the other ranks' 300 s
    assert "worker 1 (slurm-node2) rank 3 exited with code 7 in run" in result.stderr
    assert "every other worker was stopped" in result.stderr
    assert slurm_jobs(cluster) == []
    assert processes_of_job(job_id_in(result.stderr)) == []
    assert left_on_nodes("fail.py") == []


def start_podrun(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "podrun", *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def read_until(stream, wanted: str, timeout: float = 60) -> str:
    """What `stream` says up to the first line holding `wanted`."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen += line
        if wanted in line:
            return seen
    raise AssertionError(f"no {wanted!r} in:\n{seen}")


def test_ctrl_c_stops_every_node_and_releases_the_allocation(home, cluster, slurm_spec):
    spec = slurm_spec("run: echo up on $(hostname); python3 -c 'import time; time.sleep(300)' slurm-ctrl-c")
    process = start_podrun("exec", spec, "--no-collapse")
    read_until(process.stdout, "[w1] up on")
    assert [state for _, _, state in slurm_jobs(cluster)] == ["RUNNING"]
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert re.search(r"^podrun: Slurm job \d+ released$", err, re.M), err
    assert slurm_jobs(cluster) == []
    assert left_on_nodes("slurm-ctrl-c") == []


def test_detached_job_runs_until_stop_which_releases_the_allocation(home, cluster, slurm_spec):
    spec = slurm_spec("run: echo up on $(hostname); python3 -c 'import time; time.sleep(300)' slurm-detached")
    result = podrun("exec", spec, "--detach")
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    ((slurm_job, name, state),) = slurm_jobs(cluster)
    assert (name, state) == ("podrun-job", "RUNNING")
    wait_until(lambda: len(left_on_nodes("slurm-detached")) == 2, "the job on both nodes")
    listed = podrun("jobs").stdout
    assert re.search(rf"^{job_id} +job +slurm:2 job {slurm_job} +running", listed, re.M), listed
    # podrun ssh and cp reach the nodes of the running job
    shell = podrun("ssh", spec, "--worker", "1", "--", "hostname")
    assert (shell.returncode, shell.stdout) == (0, "slurm-node2\n"), shell.stderr
    # at a terminal: srun --pty, through OpenSSH's own terminal on the login node
    code, written = run_in_terminal(["ssh", spec, "--worker", "0", "--", "tty; hostname"], rows=24, columns=80)
    assert code == 0, written
    assert re.search(rb"/dev/pts/\d+\r?\nslurm-node1\r?\n", written), written
    (home.parent / "note.txt").write_text("copied\n")
    copied = podrun("cp", spec, home.parent / "note.txt", ":note.txt")
    assert copied.returncode == 0, copied.stderr
    assert (cluster.home / "note.txt").read_text() == "copied\n"
    # podrun stacks: each node's Python processes of the job, through a step on it
    stacks = podrun("stacks", job_id, "--all")
    assert stacks.returncode == 0, stacks.stderr
    assert "── worker 0 (slurm-node1) ──" in stacks.stdout and "── worker 1 (slurm-node2) ──" in stacks.stdout
    headers = re.findall(r"^=== pid \d+ \(parent \d+\): python3 -c .* slurm-detached ===$", stacks.stdout, re.M)
    assert len(headers) == 2, stacks.stdout
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: slurm_jobs(cluster) == [], "squeue to show nothing of the job", timeout=60)
    assert left_on_nodes("slurm-detached") == []
    assert processes_of_job(job_id) == []


def test_a_detached_job_that_ends_by_itself_gives_its_allocation_back(home, cluster, slurm_spec):
    """Nobody stops it: the lifecycle's supervisor follows the job and cancels the allocation at its end."""
    spec = slurm_spec("run: sleep 2; echo done on $(hostname)")
    result = podrun("exec", spec, "--detach")
    assert result.returncode == 0, result.stderr
    assert re.search(r"a supervisor \(pid \d+\) watches it and gives back its Slurm allocation \(job \d+\) when it "
                     r"ends", result.stderr), result.stderr
    job_id = job_id_in(result.stderr)
    assert len(slurm_jobs(cluster)) == 1
    wait_until(lambda: slurm_jobs(cluster) == [], "squeue to show nothing of the job", timeout=60)
    wait_until(lambda: "succeeded" in podrun("jobs").stdout, "the job's record to say it succeeded", timeout=30)
    assert "done on slurm-node2" in podrun("logs", job_id, "--no-collapse").stdout
    assert processes_of_job(job_id) == []


def test_a_pending_allocation_says_why_and_ctrl_c_cancels_it(home, cluster, slurm_spec):
    held = cluster.slurm(f"sbatch --parsable --exclusive --nodelist={cluster.nodes[2].name} --output=/dev/null "
                         f"--job-name=holder --wrap='sleep 300'")
    assert held.returncode == 0, held.stderr
    wait_until(lambda: ("holder", "RUNNING") in [(name, state) for _, name, state in slurm_jobs(cluster)],
               "the holder to run")
    spec = slurm_spec("run: echo never", nodes=3, options=", sbatch_args: [--exclusive]")
    process = start_podrun("exec", spec)
    said = read_until(process.stderr, "pending")
    assert re.search(r"^podrun: Slurm job \d+ pending \(Resources\): waiting for 3 nodes \(Ctrl-C cancels it\)$",
                     said, re.M), said
    assert len(waiting_fanouts(cluster)) == 1  # started while salloc waits, for the first step's one srun
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "never" not in out
    assert [name for _, name, _ in slurm_jobs(cluster)] == ["holder"]
    wait_until(lambda: waiting_fanouts(cluster) == [], "the fanout to end with podrun's connection")


@pytest.mark.parametrize(("nodes", "options", "line"), [
    (2, ", partition: gpu", "target.slurm.partition: no partition 'gpu' on the cluster; it has debug, short"),
    (1, ", partition: short, time: '10:00'", "target.slurm.time: 10:00 is over partition short's limit, "
                                             "MaxTime=00:02:00"),
    (2, ", partition: short", "target.slurm.nodes: 2 nodes, but partition short has 1; partition debug has enough"),
    (2, ", sbatch_args: [--no-such-option]", "target.slurm: salloc refused the allocation: salloc: unrecognized "
                                             "option '--no-such-option'"),
])
def test_what_the_cluster_cannot_give_is_one_line_before_anything_runs(home, cluster, slurm_spec, nodes, options, line):
    spec = slurm_spec("run: echo never", nodes=nodes, options=options)
    result = podrun("exec", spec)
    assert result.returncode == 2, result.stderr
    (said,) = result.stderr.splitlines()
    assert said.startswith(f"podrun: error: {spec}: {line}"), said
    assert slurm_jobs(cluster) == []


def test_too_many_nodes_for_any_partition(home, cluster, slurm_spec):
    result = podrun("exec", slurm_spec("run: echo never", nodes=5))
    assert result.returncode == 2
    assert result.stderr.endswith("target.slurm.nodes: 5 nodes, but partition debug has 3; "
                                  "no partition has that many\n"), result.stderr


def test_without_login_the_slurm_commands_run_here(home, cluster, job_file, tmp_path):
    """On the login node itself (podrun run there, in its namespaces): no `login`, no SSH."""
    spec = job_file(f"target: {{slurm: {{nodes: 2}}}}\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n"
                    f"run: echo on $(hostname)\n")
    result = cluster.run(cluster.login, f"cd {REPO} && PODRUN_HOME={home} {sys.executable} -m podrun exec "
                                        f"--no-collapse {spec}", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[w0] on slurm-node1" in result.stdout and "[w1] on slurm-node2" in result.stdout
    assert slurm_jobs(cluster) == []


def test_nodes_that_do_not_share_the_home_are_one_line(home, cluster, slurm_spec):
    """The code ships once, to the first node; a node that does not see it there is named, and nothing runs."""
    node = cluster.nodes[1]
    (cluster.home / "podrun").mkdir(exist_ok=True)
    hidden = cluster.run(node, "mount -t tmpfs podrun-not-shared /root/podrun")  # node 2's own, empty, ~/podrun
    assert hidden.returncode == 0, hidden.stderr
    try:
        spec = slurm_spec("run: echo ran", files={"data.txt": f"{time.time_ns()}\n"})  # code no node has yet
        result = podrun("exec", spec)
    finally:
        assert cluster.run(node, "umount /root/podrun").returncode == 0
    assert result.returncode == 1, result.stderr
    assert re.search(r"^podrun: error: slurm-node2 do\(es\) not see the code shipped to slurm-node1 \(podrun/job/\w+ "
                     r"in ~\): its workers must share one home directory, where podrun ships the code once, and they "
                     r"do not$", result.stderr, re.M), result.stderr
    assert "ran" not in result.stdout
    assert slurm_jobs(cluster) == []


@pytest.mark.slow
def test_a_detached_job_past_its_time_limit_reads_as_the_attached_one_does(home, cluster, slurm_spec):
    """At the time limit Slurm ends the allocation's steps, those that follow the workers' logs among them:
    the supervisor, which holds the allocation, asks Slurm as an attached exec does, and the job is
    `failed` 125 with the reason (was: `failed` 255, its workers' logs not followed)."""
    spec = slurm_spec("run: echo up; python3 -c 'import time; time.sleep(300)' slurm-over-time-detached",
                      options=", time: '1'")
    result = podrun("exec", spec, "--detach")
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    followed = podrun("logs", "-f", job_id, timeout=180)
    assert followed.returncode == 125, followed.stderr
    assert re.search(rf"^podrun: job {job_id} failed: Slurm job \d+ reached its time limit \(00:01:00\): Slurm ended "
                     rf"its steps", followed.stderr, re.M), followed.stderr
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert (record["state"], record["exit_code"]) == ("failed", 125), record
    assert podrun("logs", "-f", job_id).returncode == 125
    wait_until(lambda: slurm_jobs(cluster) == [], "squeue to show nothing of the job", timeout=60)
    if left := left_on_nodes("slurm-over-time-detached"):
        for pid in (int(line.split()[0]) for line in left):
            with contextlib.suppress(ProcessLookupError):  # it may have ended since it was listed
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: processes_of_job(job_id) == [], "the job's processes to be gone")
        pytest.xfail("known gap: a detached agent left its srun step's process tree, so under proctrack/linuxproc "
                     "Slurm's time limit does not reach its program, and podrun can no longer reach the node")
    assert processes_of_job(job_id) == []


@pytest.mark.slow
def test_a_job_past_its_time_limit_is_said_to_be(home, cluster, slurm_spec):
    """Slurm ends the steps at the allocation's time limit (1 minute, its shortest): podrun says why."""
    spec = slurm_spec("run: echo up; python3 -c 'import time; time.sleep(300)' slurm-time-limit", options=", time: '1'")
    result = podrun("exec", spec, timeout=180)
    assert result.returncode == 125, result.stderr  # its own code (docs/exit-codes.md), not 143: podrun stopped nothing
    job_id = job_id_in(result.stderr)
    assert re.search(rf"^podrun: job {job_id} ran out of time: Slurm job \d+ reached its time limit", result.stderr,
                     re.M), result.stderr
    # one story, told once: no worker "killed by SIGTERM" with its last lines, the limit not said again
    assert result.stderr.count("reached its time limit") == 1, result.stderr
    # (podrun may still say it stops the other worker: one ended first, whose SIGTERM comes from Slurm)
    assert "killed by SIGTERM" not in result.stderr and "last lines" not in result.stderr, result.stderr
    assert "2 at the time limit" in podrun("jobs").stdout
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert (record["state"], record["exit_code"]) == ("failed", 125), record
    assert podrun("logs", "-f", job_id).returncode == 125
    assert slurm_jobs(cluster) == []
    assert left_on_nodes("slurm-time-limit") == []
