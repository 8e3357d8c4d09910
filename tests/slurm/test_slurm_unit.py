"""The `slurm` target without a cluster: its options, Slurm's time forms, the commands it builds,
what it reads from scontrol, the checks made before allocating, --dry-run, and the one step's channels
through a stand-in srun that runs each node's task here."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from pathlib import Path

import pytest

from podrun.capacity.slurm import ended_by_slurm, parse_records
from podrun.errors import SpecError
from podrun.spec.loading import load_spec
from podrun.target_kinds.slurm import slurm_time_s
from podrun.targets.base import target_for
from podrun.targets.slurm import SlurmCluster
from podrun.transport.slurm import Completed, srun_command
from podrun.transport.slurm_step import Steps

from helpers import podrun

# as `scontrol show partition --oneliner` prints them (Slurm 22.05, the lab's partitions), shortened
PARTITIONS = (
    "PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime=01:00:00 Nodes=slurm-node[1-3] State=UP TotalNodes=3\n"
    "PartitionName=short Default=NO MaxNodes=UNLIMITED MaxTime=00:02:00 Nodes=slurm-node1 State=UP TotalNodes=1\n"
    "PartitionName=big Default=NO MaxNodes=2 MaxTime=UNLIMITED Nodes=slurm-node[1-3] State=UP TotalNodes=3\n")


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("5:30", 330), ("4:00:00", 14400), ("1-0", 86400), ("1-2:30", 95400), ("2-00:00:10", 172810),
    ("UNLIMITED", None), ("INFINITE", None)])
def test_slurm_time_forms(text, seconds):
    assert slurm_time_s(text) == seconds


def slurm_spec(job_file, options: str):
    return job_file(f"target: {{slurm: {{{options}}}}}\nrun: echo hi\n")


@pytest.mark.parametrize(("options", "line"), [
    ("nodes: 0", "target.slurm.nodes: expected a number of nodes from 1, such as 2, got 0"),
    ("time: '4 hours'", "target.slurm.time: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, such as "
                        "4:00:00, got '4 hours'"),
    ("partition: 'gpu; rm -rf ~'", "target.slurm.partition: expected a Slurm name without blanks or shell syntax"),
    ("sbatch_args: [exclusive]", "target.slurm.sbatch_args.0: expected an sbatch option starting with -"),
    ("login: 'a b'", "target.slurm.login: expected host, user@host, host:port or user@host:port"),
    ("nodes: 2, gpus: 8", "target.slurm.gpus: unknown field; expected one of: login, nodes, spares, partition, time, "
                          "account, gpus_per_node, constraint, qos, exclusive, cpus_per_node, sbatch_args"),
    ("nodes: 2, exclusive: true, cpus_per_node: 4",
     "target.slurm.cpus_per_node: 4 CPUs of each node, but exclusive: true asks for the whole node: keep one"),
    ("nodes: 2, cpus_per_node: 4, sbatch_args: [-c8]",
     "target.slurm.sbatch_args: -c8 and cpus_per_node both say how much of each node the job gets: keep one"),
])
def test_bad_options_are_one_line_naming_the_field(home, job_file, options, line):
    result = podrun("validate", slurm_spec(job_file, options))
    assert result.returncode == 2
    (said,) = result.stderr.splitlines()
    assert line in said, said


def test_validate_names_the_cluster(home, job_file):
    result = podrun("validate", slurm_spec(job_file, "login: me@login1, nodes: 4, partition: gpu"))
    assert result.returncode == 0, result.stderr
    assert "on 4 Slurm nodes of partition gpu via me@login1" in result.stderr


def cluster(job_file, options: str) -> SlurmCluster:
    target = target_for(load_spec(str(slurm_spec(job_file, options))))
    assert isinstance(target, SlurmCluster)
    return target


def test_every_option_maps_to_salloc(home, job_file):
    target = cluster(job_file, "nodes: 2, partition: gpu, time: '4:00:00', account: proj, gpus_per_node: 8, "
                               "constraint: a100&ib, qos: high, sbatch_args: [--exclusive, --mem=0]")
    argv = target.capacity.salloc_argv()
    assert argv[:2] == ["salloc", "--no-shell"]
    for option in ("--nodes=2", "--ntasks-per-node=1", "--partition=gpu", "--time=4:00:00", "--account=proj",
                   "--gpus-per-node=8", "--constraint=a100&ib", "--qos=high", "--exclusive", "--mem=0",
                   "--job-name=podrun-job"):
        assert option in argv
    assert argv[-2:] == ["--exclusive", "--mem=0"]
    assert argv.count("--exclusive") == 1  # sbatch_args said how much of each node: podrun adds nothing


@pytest.mark.parametrize(("options", "share"), [
    ("nodes: 2", ["--exclusive"]),  # the default: the whole of each node
    ("nodes: 2, exclusive: true", ["--exclusive"]),
    ("nodes: 2, exclusive: false", []),  # one CPU of each node on a select/cons_tres cluster
    ("nodes: 2, cpus_per_node: 6", ["--cpus-per-task=6"]),
    ("nodes: 2, sbatch_args: [--exclusive=user]", ["--exclusive=user"]),
    ("nodes: 2, sbatch_args: [-c4, --mem=0]", ["-c4", "--mem=0"]),
    ("nodes: 2, sbatch_args: [--oversubscribe]", ["--oversubscribe"]),
])
def test_a_job_asks_for_the_whole_of_each_node_unless_the_spec_says_otherwise(home, job_file, options, share):
    argv = cluster(job_file, options).capacity.salloc_argv()
    assert argv[argv.index("--ntasks-per-node=1") + 1:] == share


def test_torchruns_ranks_do_not_see_the_srun_steps_task_variables(home, job_file):
    spec = job_file("target: {slurm: {login: me@login1, nodes: 2}}\nrun: train.py\ntorchrun: {nproc_per_node: 4}\n"
                    "env: {SLURM_NTASKS: '8'}\n", files={"train.py": ""})
    result = podrun("exec", "--dry-run", spec)
    assert result.returncode == 0, result.stderr
    (line,) = {line.split("torchrun")[0] for line in result.stdout.splitlines() if "torchrun --nnodes=2" in line}
    assert line.startswith("env -u SLURM_NPROCS -u SLURM_PROCID -u SLURM_LOCALID "), line
    assert line.endswith(" -u SLURM_SRUN_COMM_PORT ")
    assert "-u SLURM_NTASKS " not in line  # the job's env sets it: the job's word stands
    plain = podrun("exec", "--dry-run", job_file("target: {slurm: {login: me@login1, nodes: 2}}\nrun: echo hi\n"))
    assert "env -u" not in plain.stdout  # without torchrun the step's one task per node is the job's truth


def test_the_worker_step_is_the_agent_alone_on_its_node():
    line = srun_command("42", "gpu-7", "exec python3 -c 'x'")
    assert line.startswith("srun --jobid=42 --nodelist=gpu-7 --nodes=1 --ntasks=1 --overlap --whole ")
    assert line.endswith("/bin/sh -c 'exec python3 -c '\"'\"'x'\"'\"''")


@pytest.mark.parametrize(("options", "field", "message"), [
    ("partition: gpu", "target.slurm.partition", "no partition 'gpu' on the cluster; it has debug, short, big"),
    ("partition: short, time: '10:00'", "target.slurm.time", "10:00 is over partition short's limit, MaxTime=00:02:00"),
    ("nodes: 4", "target.slurm.nodes", "4 nodes, but partition debug has 3; no partition has that many"),
    ("nodes: 2, partition: short", "target.slurm.nodes",
     "2 nodes, but partition short has 1; partition debug, big has enough"),
    ("nodes: 3, partition: big", "target.slurm.nodes", "3 nodes, but partition big gives a job at most 2 (MaxNodes)"),
])
def test_what_no_partition_can_give_is_refused_before_allocating(home, job_file, options, field, message):
    target = cluster(job_file, options)
    with pytest.raises(SpecError) as raised:
        target.capacity.check_options(parse_records(PARTITIONS))
    assert str(raised.value).endswith(f"{field}: {message}")
    assert raised.value.exit_code == 2


@pytest.mark.parametrize("options", ["nodes: 3", "partition: big, time: '7-0', nodes: 2", "time: '1:00:00'"])
def test_what_a_partition_gives_passes(home, job_file, options):
    cluster(job_file, options).capacity.check_options(parse_records(PARTITIONS))


def test_dry_run_prints_the_slurm_commands_and_each_workers_script(home, job_file):
    spec = job_file("target: {slurm: {login: me@login1, nodes: 2, partition: gpu, time: '1:00:00'}}\n"
                    "run: echo hi\n")
    result = podrun("exec", "--dry-run", spec)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "# target: 2 Slurm nodes, allocated for the job; Slurm's commands run via me@login1:" in out
    assert ("allocate: salloc --no-shell --job-name=podrun-job --nodes=2 --ntasks-per-node=1 --partition=gpu "
            "--time=1:00:00 --exclusive\n") in out
    assert ("start:    srun '--jobid=<job id>' '--nodelist=<node 0>,<node 1>' --nodes=2 --ntasks=2 --overlap --whole "
            "--cpu-bind=none --mpi=none --quiet --kill-on-bad-exit=0 --wait=0 python3 -I -S -c <connector> <agent>\n") in out
    assert "release:  scancel <job id>" in out
    assert "# worker 0: node 0 of the allocation" in out and "# worker 1: node 1 of the allocation" in out
    assert out.count("echo hi") == 2
    assert not (home / "jobs").exists()  # touched nothing


def test_exec_slurm_names_an_adhoc_cluster(home):
    result = podrun("exec", "--slurm", "me@login1", "--nodes", "3", "--partition", "gpu", "--time", "30",
                    "--gpus-per-node", "8", "--dry-run", "--", "hostname")
    assert result.returncode == 0, result.stderr
    assert ("allocate: salloc --no-shell --job-name=podrun-exec --nodes=3 --ntasks-per-node=1 --partition=gpu --time=30 "
            "--gpus-per-node=8 --exclusive\n") in result.stdout
    here = podrun("exec", "--slurm", ".", "--dry-run", "--", "hostname")
    assert "Slurm's commands run on this machine (the login node)" in here.stdout, here.stderr


@pytest.mark.parametrize(("flags", "line"), [
    (["--slurm", ".", "--time", "4h"], "--time: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, "
                                       "such as 4:00:00, got '4h'"),
    (["--slurm", "a b"], "--slurm: expected host, user@host, host:port or user@host:port, got 'a b'"),
    (["--hosts", "a", "--nodes", "2"], "--nodes: goes with --slurm"),
])
def test_bad_adhoc_flags_are_named(home, flags, line):
    result = podrun("exec", *flags, "--dry-run", "--", "hostname")
    assert result.returncode == 2
    assert result.stderr == f"podrun: error: {line}\n"


@pytest.mark.parametrize(("shown", "said"), [
    ("JobId=7 JobName=podrun-x JobState=TIMEOUT Reason=TimeLimit TimeLimit=00:01:00",
     "reached its time limit (00:01:00): Slurm ended its steps"),
    ("JobId=7 JobState=COMPLETING Reason=TimeLimit TimeLimit=00:01:00",
     "reached its time limit (00:01:00): Slurm ended its steps"),
    ("JobId=7 JobState=NODE_FAIL Reason=NodeDown", "ended NODE_FAIL (NodeDown) before podrun released it"),
    ("JobId=7 JobState=RUNNING Reason=None TimeLimit=00:10:00", None),
    ("", None),
])
def test_an_allocation_slurm_ended_is_named(shown, said):
    assert ended_by_slurm(parse_records(shown)) == said


# srun as far as the one step needs it: each node of --nodelist runs the task, SLURMD_NODENAME set, srun's
# stdin given to every task (--input=all)
SRUN_STAND_IN = """#!/bin/sh
for option; do case $option in --nodelist=*) nodes=${option#--nodelist=}; shift;; --*) shift;; *) break;; esac; done
input=$(mktemp); cat > "$input"
for node in $(echo "$nodes" | tr , ' '); do SLURMD_NODENAME=$node "$@" < "$input" & done
wait; rm "$input"
"""


def run_one_step(command: str, inputs: dict[str, str]) -> list[tuple[bytes, bytes, int]]:
    """Each node's stdout, stderr and exit code, `command` started on every node through Steps (the login
    node: here), each given its own line of input."""
    async def on_login(command: str):
        return await asyncio.create_subprocess_exec("/bin/sh", "-c", command, stdin=-1, stdout=-1, stderr=-1)

    async def one(steps: Steps, node: str, line: str):
        channel = await steps.join("7", node, command, len(inputs), lambda: on_login("echo a step of its own"))
        channel.stdin.write(line.encode() + b"\n")
        channel.stdin.write_eof()
        return await channel.stdout.read(), await channel.stderr.read(), await channel.wait()

    async def every():
        steps = Steps(on_login, sys.executable)
        return await asyncio.gather(*(one(steps, node, line) for node, line in inputs.items()))

    return asyncio.run(every())


@pytest.fixture
def srun_stand_in(tmp_path, monkeypatch):
    (tmp_path / "srun").write_text(SRUN_STAND_IN)
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)  # the login node's root: worker-side scripts keep their cache (.podrun) there


# a command of its own, and the agent's form (`exec PYTHON -I -S -c CODE`), which the connector runs itself
SHELL_NODE = "read code; echo out on $SLURMD_NODENAME; echo err >&2; exit $code"
PYTHON_NODE = ("import os, sys; code = int(sys.stdin.readline()); print('out on', os.environ['SLURMD_NODENAME']); "
               "print('err', file=sys.stderr); sys.exit(code)")


@pytest.mark.parametrize("command", [SHELL_NODE, f"exec {shlex.quote(sys.executable)} -I -S -c {shlex.quote(PYTHON_NODE)}"])
def test_one_step_keeps_each_nodes_streams_and_exit_code(srun_stand_in, monkeypatch, command):
    monkeypatch.setenv("PODRUN_SLURM_LOGIN_ADDRESS", "127.0.0.1")  # the tests' network namespace has loopback only
    ran = run_one_step(command, {"n1": "0", "n2": "3", "n3": "0"})
    assert ran == [(b"out on n1\n", b"err\n", 0), (b"out on n2\n", b"err\n", 3), (b"out on n3\n", b"err\n", 0)]


def test_nodes_that_reach_no_address_of_the_login_node_run_a_step_each(srun_stand_in, monkeypatch):
    monkeypatch.setenv("PODRUN_SLURM_LOGIN_ADDRESS", "nowhere.invalid")
    assert run_one_step("echo one step", {"n1": "", "n2": ""}) == [(b"a step of its own\n", b"", 0)] * 2


# a node whose hello and first frames reach the fanout as one read (as under load): its task, in place of
# the connector, says them in one write
HURRIED_NODE = f"""#!{sys.executable}
import os, socket, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from podrun.remote import tree_frames
hosts, _, port = os.environ["PODRUN_STEP_AT"].rpartition(":")
with socket.create_connection((hosts.split(",")[0], int(port))) as connection:
    hello = "%s %s\\n" % (os.environ["PODRUN_STEP_TOKEN"], os.environ["SLURMD_NODENAME"])
    connection.sendall(hello.encode() + tree_frames.frame(tree_frames.STDERR, 0, b"said at once\\n")
                       + tree_frames.frame(tree_frames.EXIT, 0, b"4"))
    connection.recv(1)
"""


def test_frames_that_come_with_a_nodes_hello_are_kept(srun_stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("PODRUN_SLURM_LOGIN_ADDRESS", "127.0.0.1")
    (tmp_path / "srun").write_text(SRUN_STAND_IN.replace('"$@"', str(tmp_path / "hurried")))
    (tmp_path / "hurried").write_text(HURRIED_NODE)
    (tmp_path / "hurried").chmod(0o755)
    assert run_one_step("true", {"n1": "", "n2": ""}) == [(b"", b"said at once\n", 4)] * 2


def test_a_nodes_connector_says_which_addresses_it_could_not_reach_and_never_imports_socket(tmp_path):
    """The connector as srun starts it on a node (its bootstrap, its source on stdin), with the fanout's one
    address refusing: one `podrun-unreached` line naming why, exit 0 (its node then runs a step of its own);
    and `_socket` only, not socket.py, which costs every node's start 4-7 ms of CPU (-X importtime)."""
    import subprocess

    from podrun.transport.base import script_command, script_source

    with __import__("socket").socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    python, *arguments = shlex.split(script_command(sys.executable, "slurm_connector"))[1:]
    ran = subprocess.run([python, "-X", "importtime", *arguments, "shell", "true"], input=script_source("slurm_connector"),
                         capture_output=True, cwd=tmp_path, timeout=60,
                         env={"PODRUN_STEP_AT": f"127.0.0.1:{port}", "PODRUN_STEP_TOKEN": "t", "SLURMD_NODENAME": "n1"})
    assert (ran.returncode, ran.stdout) == (0, b"podrun-unreached n1 127.0.0.1: Connection refused\n"), ran.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in ran.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "_socket" in imported and "socket" not in imported and "selectors" not in imported, sorted(imported)


def test_time_limit_restarts_ask_slurm_to_warn_stop_grace_ahead(home, job_file):
    spec = job_file("target: {slurm: {nodes: 2, time: '1:00:00'}}\nrun: echo hi\nstop_grace: 90s\n"
                    "restarts: {on: [time_limit, failure]}\n")
    allocation = target_for(load_spec(str(spec))).capacity
    allocation.stop_grace_s = 90.0  # as the launch sets it (exec --grace may say otherwise)
    assert "--signal=TERM@90" in allocation.salloc_argv()
    assert allocation.warns_steps
    assert not any(arg.startswith("--signal") for arg in cluster(job_file, "nodes: 2").capacity.salloc_argv())


@pytest.mark.parametrize(("shown", "warned", "said"), [
    ("JobId=7 JobState=RUNNING Reason=None RunTime=00:00:29 TimeLimit=00:01:00", True,
     "Slurm job 7 was 31s from its time limit (00:01:00): the job was signalled to save and stop"),
    ("JobId=7 JobState=RUNNING Reason=None RunTime=00:00:29 TimeLimit=00:01:00", False, None),
    # a SIGTERM long before the limit is not its warning (a user's scancel --signal, say)
    ("JobId=7 JobState=RUNNING Reason=None RunTime=00:01:00 TimeLimit=01:00:00", True, None),
    ("JobId=7 JobState=CANCELLED Reason=None RunTime=00:00:59 TimeLimit=00:01:00", True, None),
    ("JobId=7 JobState=TIMEOUT Reason=TimeLimit RunTime=00:01:05 TimeLimit=00:01:00", False,
     "Slurm job 7 reached its time limit (00:01:00): Slurm ended its steps"),
])
def test_a_warned_stop_reads_as_the_time_limit_only_near_it(home, job_file, monkeypatch, shown, warned, said):
    allocation = cluster(job_file, "nodes: 1").capacity
    allocation.job_id, allocation.stop_grace_s = "7", 5.0
    monkeypatch.setattr(allocation, "_run", lambda command: Completed(0, shown, ""))
    assert allocation.ran_out(warned) == said


def test_spares_are_allocated_with_the_nodes_and_a_lost_node_is_excluded_after(home, job_file):
    allocation = cluster(job_file, "nodes: 2, spares: 1").capacity
    argv = allocation.salloc_argv()
    assert "--nodes=3" in argv and "--no-kill" in argv
    allocation.nodes, allocation.spare_nodes = [("n1", "10.0.0.1"), ("n2", "10.0.0.2")], [("n3", "10.0.0.3")]
    assert allocation.replace(1) == ("n2", "n3")
    assert allocation.nodes == [("n1", "10.0.0.1"), ("n3", "10.0.0.3")] and not allocation.reallocates
    assert allocation.replace(0) == ("n1", None) and allocation.reallocates  # no spare left: a new allocation
    assert "--exclude=n2,n1" in allocation.salloc_argv()
