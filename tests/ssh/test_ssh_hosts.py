"""`target: hosts` against real lab hosts: own addresses, own sshd, own home (tests/lab.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import (
    REPO,
    SAVES_ON_SIGTERM,
    job_id_in,
    podrun,
    processes_of_job,
    ps_on_every_host,
    stderr_lines_without_traceback,
    wait_until,
)

RANK_LINE = re.compile(r"^\[w(\d) r\d+\] rank (\d) world_size (\d) local_rank (\d) worker (\d) host \S+ checksum (\S+)$")


@pytest.mark.slow
def test_torchrun_ddp_across_three_hosts_from_the_example_config(home, lab, tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "ssh-hosts.yaml").read_text())
    # the example names the first three hosts of lab site 0; this test's lab may be another site's
    assert spec["target"]["hosts"] == ["10.99.0.10", "10.99.0.11", "10.99.0.12"]
    spec["target"]["hosts"] = [host.ip for host in lab.hosts[:3]]
    spec["ssh"]["identity_file"] = str(lab.client_key)
    spec["workdir"] = str(REPO / "examples" / "ddp")
    spec["env"]["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    (tmp_path / "ssh-hosts.yaml").write_text(yaml.safe_dump(spec))
    result = podrun("exec", tmp_path / "ssh-hosts.yaml", timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    # the lab's hostnames resolve to 127.0.0.1 and the spec names no interface: podrun does
    ips = [host.ip for host in lab.hosts[:3]]  # 10.99.0.10-12 in lab site 0
    assert (f"set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to eth0 on workers 0, 1, 2 ({', '.join(ips)}): "
            f"the interface of the route to MASTER_ADDR {ips[0]}") in result.stderr
    ranks = [RANK_LINE.match(line).groups() for line in result.stdout.splitlines() if RANK_LINE.match(line)]
    assert sorted(int(rank) for _, rank, *_ in ranks) == list(range(6)), result.stdout
    for prefix_worker, rank, world_size, _local_rank, env_worker, _ in ranks:
        assert world_size == "6" and prefix_worker == env_worker == str(int(rank) // 2)
    assert len({checksum for *_, checksum in ranks}) == 1
    assert processes_of_job(job_id_in(result.stderr)) == []


def test_each_host_gets_its_rank_the_rendezvous_address_and_its_own_code_copy(home, lab, hosts_spec):
    spec = hosts_spec("""
        run: |
          echo "worker $PODRUN_WORKER of $PODRUN_NUM_WORKERS master $MASTER_ADDR:$MASTER_PORT ips $PODRUN_WORKER_IPS"
          echo "sees $(ls ~ | grep -c '^mark-') marks, on $(hostname -I)"
          touch ~/mark-$PODRUN_WORKER
          cat data.txt
    """, hosts=(0, 1, 2, 3), files={"data.txt": "shipped\n"})
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    ips = ",".join(h.ip for h in lab.hosts)
    for index, host in enumerate(lab.hosts):
        assert f"[w{index}] worker {index} of 4 master {lab.hosts[0].ip}:29500 ips {ips}" in result.stdout
        assert f"[w{index}] sees 0 marks, on {host.ip} " in result.stdout  # no other host's file
        assert f"[w{index}] shipped" in result.stdout
        assert (host.home / f"mark-{index}").exists()
    assert "shipped code (1 file) to 4 workers" in result.stderr
    again = podrun("exec", spec, "--no-collapse")
    assert "code unchanged on every worker" in again.stderr
    assert again.stdout.count(" sees 1 marks") == 4


def test_host_keys_are_trusted_on_first_use_and_a_changed_key_is_refused(home, lab, hosts_spec):
    spec = hosts_spec("run: echo ok", hosts=(0,))
    assert podrun("exec", spec).returncode == 0
    known_hosts = home / "known_hosts"
    (line,) = known_hosts.read_text().splitlines()
    assert line.startswith(f"{lab.hosts[0].ip} ssh-ed25519 ")
    other_key = (lab.hosts[1].dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known_hosts.write_text(f"{lab.hosts[0].ip} {' '.join(other_key)}\n")
    refused = podrun("exec", spec)
    assert refused.returncode == 1
    assert stderr_lines_without_traceback(refused.stderr)[-1] == (
        f"podrun: error: {lab.hosts[0].ip}: host key changed since podrun first connected (recorded in "
        f"{known_hosts}); if the host was rebuilt, remove its line there")
    unchecked = spec.read_text().replace("ssh: {", "ssh: {check_host_keys: false, ")
    spec.write_text(unchecked)
    assert podrun("exec", spec).returncode == 0


@pytest.mark.parametrize("fault", ["wrong port", "refused key", "does not resolve"])  # sshd stopped: the fault matrix
def test_an_unusable_host_is_one_line_and_nothing_starts_anywhere(home, lab, hosts_spec, tmp_path, fault):
    spec = hosts_spec("run: echo started; sleep 300")
    text = spec.read_text()
    bad = lab.hosts[1].ip
    expected = {
        "wrong port": f"podrun: error: {bad}:2222: cannot connect: Connection refused",
        # the spec's one identity file is refused by every host: each is named, one line each
        "refused key": f"  {lab.hosts[2].ip}: key refused for user root (identity file: {tmp_path}/other_key)",
        "does not resolve": f"podrun: error: {spec}: target.hosts.1: no-such-host.invalid does not resolve",
    }[fault]
    if fault == "wrong port":
        text = text.replace(f", {bad},", f", {bad}:2222,")
    elif fault == "refused key":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other_key")], check=True)
        text = text.replace(str(lab.client_key), str(tmp_path / "other_key"))
    else:
        text = text.replace(f", {bad},", ", no-such-host.invalid,")
    spec.write_text(text)
    jobs_before = [sorted((host.home / ".podrun" / "jobs").glob("*")) for host in lab.hosts]
    started = time.monotonic()
    result = podrun("exec", spec)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    lines = stderr_lines_without_traceback(result.stderr)
    assert lines[-1].startswith(expected), lines
    assert elapsed < 10
    assert "started" not in result.stdout
    # no agent ran anywhere: it would have made a job directory on its host
    assert [sorted((host.home / ".podrun" / "jobs").glob("*")) for host in lab.hosts] == jobs_before


def test_an_agent_that_fails_before_reporting_is_named_and_nothing_starts_anywhere(home, lab, hosts_spec):
    spec = hosts_spec("run: echo started; sleep 300")
    private = lab.hosts[1].home / ".podrun"  # where the agent keeps its job files
    aside = private.with_name(".podrun-aside")
    moved = private.exists()
    if moved:
        private.rename(aside)
    private.write_text("not a directory")
    try:
        result = podrun("exec", spec, timeout=60)
    finally:
        private.unlink()
        if moved:
            aside.rename(private)
    assert result.returncode != 0
    assert "started" not in result.stdout
    lines = stderr_lines_without_traceback(result.stderr)
    assert f"worker 1 ({lab.hosts[1].ip}) failed to run: NotADirectoryError" in result.stderr, lines
    assert "failed: worker 1 failed to run: NotADirectoryError" in lines[-1], lines
    assert processes_of_job(job_id_in(result.stderr)) == []


def test_rendezvous_port_taken_on_worker_0_fails_before_run(home, lab, hosts_spec):
    holder = lab.popen(0, [sys.executable, "-c", "import signal, socket; s = socket.socket(); "
                           "s.bind(('', 29533)); s.listen(); print('held', flush=True); signal.pause()"])
    try:
        assert holder.stdout.readline().strip() == "held"
        spec = hosts_spec("run: echo started\ntorchrun: {nproc_per_node: 1, port: 29533}")
        started = time.monotonic()
        result = podrun("exec", spec)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1
    assert time.monotonic() - started < 10
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: rendezvous port 29533 is not free on worker 0 ({lab.hosts[0].ip}): Address already "
        "in use; another job's torchrun may hold it; pick another torchrun.port")
    assert "started" not in result.stdout


def test_a_worker_that_cannot_reach_worker_0_is_named_before_run(home, lab, hosts_spec):
    route = ["ip", "-n", lab.hosts[1].namespace, "route", "add", "unreachable", f"{lab.hosts[0].ip}/32"]
    subprocess.run(route, check=True)
    try:
        result = podrun("exec", hosts_spec("run: echo started\ntorchrun: {nproc_per_node: 1, port: 29534}"))
    finally:
        subprocess.run([*route[:4], "del", *route[5:]], check=True)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: worker 1 ({lab.hosts[1].ip}) cannot reach the rendezvous endpoint "
        f"{lab.hosts[0].ip}:29534 on worker 0: No route to host")
    assert "started" not in result.stdout


def test_docker_wraps_run_and_a_worker_without_docker_is_named(home, lab, hosts_spec):
    spec = hosts_spec("""
        run: python3 train.py
        docker: {image: "us-docker.pkg.dev/proj/repo/xla:r2.5", args: [--shm-size=16g]}
        env: {PATH: /usr/local/sbin, WANDB_API_KEY: hunter2}
    """, files={"train.py": ""})
    plan = podrun("exec", "--dry-run", spec)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith(f"# target: 3 SSH hosts: {', '.join(host.ip for host in lab.hosts[:3])}\n")
    for index in range(3):
        assert (f"docker run --rm --net=host --name=podrun-{job_id_hint(plan.stdout)}-w{index} "
                f'-v "$PWD:$PWD" -w "$PWD" -v "$PODRUN_JOB_DIR:$PODRUN_JOB_DIR" --init --env=TINI_KILL_PROCESS_GROUP=1 '
                f"--env=PJRT_DEVICE") in plan.stdout
    assert ("--env=WANDB_API_KEY --env=GLOO_SOCKET_IFNAME --env=NCCL_SOCKET_IFNAME --env=PODRUN_JOB_DIR "
            "--env=PODRUN_WORKER_IPS_FILE "
            "--shm-size=16g us-docker.pkg.dev/proj/repo/xla:r2.5 sh -c "
            + shlex.quote("trap 'exit 143' TERM\npython3 train.py")) in plan.stdout
    assert "hunter2" not in plan.stdout and "--privileged" not in plan.stdout  # that is for TPU only
    result = podrun("exec", spec)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: worker 0 ({lab.hosts[0].ip}): no docker command on the job's PATH; "
        "install Docker there or remove docker: from the spec")


def job_id_hint(dry_run_output: str) -> str:
    return re.search(r"^export PODRUN_JOB_ID=(\S+)$", dry_run_output, re.MULTILINE).group(1)


def test_writing_to_a_channel_whose_command_ended_is_a_lost_channel_not_an_exception(home, lab):
    """Reads already said ChannelLost when the connection broke; writes say it too (the launcher and
    the relay treat a ChannelLost as a worker's failure, anything else would escape as a crash)."""
    import asyncio

    from podrun.transport.base import ChannelLost
    from podrun.transport.ssh import SshTransport

    async def write_after_exit() -> BaseException | None:
        transport = SshTransport(lab.hosts[0].ip, None, "root", str(lab.client_key), check_host_keys=False)
        await transport.connect()
        try:
            channel = await transport.start("exit 3")
            assert await channel.wait() == 3
            try:
                for _ in range(64):  # the first writes may still be buffered locally
                    channel.stdin.write(b"x" * 65536)
                    await channel.stdin.drain()
            except BaseException as error:  # noqa: B036 - what is raised is the point of the test
                return error
            return None
        finally:
            await transport.close()

    error = asyncio.run(write_after_exit())
    assert isinstance(error, ChannelLost), repr(error)


def test_a_detached_job_on_hosts_that_saves_on_sigterm_and_exits_0_is_stopped_after_podrun_stop(home, lab, hosts_spec):
    launched = podrun("exec", "--detach", hosts_spec(SAVES_ON_SIGTERM))
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    wait_until(lambda: sorted(podrun("logs", job_id).stdout.splitlines()) == [f"[w{i}] up {i}" for i in range(3)],
               "every worker to be up", timeout=30)
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0 and f"job {job_id} is stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    followed = podrun("logs", "-f", job_id)
    assert followed.returncode == 143 and "[w2] saved 2" in followed.stdout, followed.stderr
    assert ps_on_every_host(lab, job_id) == []
