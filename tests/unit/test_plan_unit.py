"""plan() and render() (README: What every worker gets), from specs read by the real parser, on
fake workers and targets: pure functions, so no process and no network."""

from __future__ import annotations

import shlex
import textwrap

import pytest

from podrun.errors import SpecError
from podrun.plan import CHECKS, SECRET_SHOWN_AS, job_plan, plan, render
from podrun.spec.loading import load_spec
from podrun.targets.base import Target, Worker
from podrun.transport.base import Transport

JOB_ID = "job-20250101-000000-abcd"
CODE_DIR = "podrun/job/0123456789abcdef"
IPS = ["10.1.0.7", "10.1.0.3", "10.1.0.9"]  # not sorted: worker order is the targets' order


class PlanOnlyTransport(Transport):
    """What plan() and render() read of a transport; starting anything is a bug in a pure function."""

    python = "python3"

    def __init__(self, index: int):
        self.root = f"/home/user{index}"

    async def start(self, command: str):
        raise AssertionError("plan() started a command")

    def endpoint(self) -> dict:
        return {}

    def interactive(self, command: str | None, terminal: bool):
        raise AssertionError("plan() opened a shell")

    def starting_environment(self) -> str:
        return "the login shell's"


class GpuNodes(Target):
    kind, worker_noun, default_device = "hosts", "SSH host", "CUDA"

    def workers(self, dry_run):
        raise AssertionError("plan() gets its workers")


class TpuPod(GpuNodes):
    kind, worker_noun, default_device = "tpu", "TPU worker", "TPU"
    container_flags = ("--privileged",)


def workers(count: int = 3) -> list[Worker]:
    return [Worker(index, f"node-{index}", IPS[index], PlanOnlyTransport(index)) for index in range(count)]


@pytest.fixture
def spec(tmp_path):
    def load(text: str):
        path = tmp_path / "job.yaml"
        path.write_text(textwrap.dedent(text))
        return load_spec(path)
    return load


def plans_for(spec, target=GpuNodes, count=3, extra_env=None, launcher_env=None, attempt=0):
    return plan(spec, target(spec), workers(count), JOB_ID, CODE_DIR, extra_env or {}, launcher_env or {}, attempt)


def test_every_worker_gets_its_index_the_worker_count_and_everyones_ips_in_worker_order(spec):
    plans = plans_for(spec("run: python3 train.py\n"))
    assert [p.worker.index for p in plans] == [0, 1, 2]
    for index, worker_plan in enumerate(plans):
        assert (worker_plan.cwd, worker_plan.code_dir) == ("podrun/job/run", CODE_DIR)  # runs there, checks CODE_DIR out
        assert worker_plan.env == {
            "PJRT_DEVICE": "CUDA", "PODRUN_JOB_ID": JOB_ID, "PODRUN_ATTEMPT": "0", "PODRUN_WORKER": str(index),
            "PODRUN_NUM_WORKERS": "3", "PODRUN_WORKER_IPS": "10.1.0.7,10.1.0.3,10.1.0.9", "MASTER_ADDR": "10.1.0.7",
            "MASTER_PORT": "29500", "JAX_COORDINATOR_ADDRESS": "10.1.0.7:8476"}
        assert worker_plan.job_dir == f".podrun/jobs/{JOB_ID}"


def test_a_restart_gets_its_attempt_number_and_a_job_directory_of_its_own(spec):
    plans = plans_for(spec("run: python3 train.py\n"), attempt=2)
    assert {p.env["PODRUN_ATTEMPT"] for p in plans} == {"2"}
    assert {p.job_dir for p in plans} == {f".podrun/jobs/{JOB_ID}.attempt-2"}


def test_without_torchrun_every_worker_runs_the_command_as_written(spec):
    plans = plans_for(spec("run: python3 train.py --lr 0.1 'a b'\n"))
    assert {p.run for p in plans} == {"python3 train.py --lr 0.1 'a b'"}


def test_a_single_worker_is_its_own_master(spec):
    (only,) = plans_for(spec("run: python3 train.py\n"), count=1)
    assert (only.env["MASTER_ADDR"], only.env["PODRUN_WORKER_IPS"], only.env["PODRUN_NUM_WORKERS"]) == (
        "10.1.0.7", "10.1.0.7", "1")


@pytest.mark.parametrize("torchrun, nproc, port", [("{}", 1, 29500), ("{nproc_per_node: 4, port: 29411}", 4, 29411),
                                                   ("{nproc_per_node: gpu}", "gpu", 29500)])
def test_torchrun_gets_each_workers_node_rank_and_worker_0s_endpoint(spec, torchrun, nproc, port):
    plans = plans_for(spec(f"run: train.py --epochs 2\ntorchrun: {torchrun}\n"))
    for index, worker_plan in enumerate(plans):
        assert worker_plan.run == (f"torchrun --nnodes=3 --node_rank={index} --nproc_per_node={nproc}"
                                   f' --rdzv_endpoint=10.1.0.7:{port} "$PODRUN_JOB_DIR/rank_output.py"'
                                   f" train.py --epochs 2")
        assert (worker_plan.env["MASTER_ADDR"], worker_plan.env["MASTER_PORT"]) == ("10.1.0.7", str(port))
        assert worker_plan.term_leader_only  # torchrun alone gets SIGTERM: it passes it on to its ranks


@pytest.mark.parametrize("target, device, expected", [
    (GpuNodes, None, "CUDA"), (TpuPod, None, "TPU"), (TpuPod, "CPU", "CPU"), (GpuNodes, "ROCM", "ROCM")])
def test_device_comes_from_the_spec_else_from_the_target(spec, target, device, expected):
    text = "run: python3 train.py\n" + (f"device: {device}\n" if device else "")
    assert {p.env["PJRT_DEVICE"] for p in plans_for(spec(text), target)} == {expected}


def test_env_comes_from_the_spec_then_secrets_from_podruns_environment_then_env_flags(spec):
    job = spec("""\
        run: python3 train.py
        env: {WANDB_MODE: offline, LR: "0.1", HF_TOKEN: from-spec}
        secret_env: [WANDB_API_KEY, HF_TOKEN]
        """)
    launcher_env = {"WANDB_API_KEY": "k-123", "HF_TOKEN": "from-launcher", "HOME": "/root"}
    plans = plans_for(job, extra_env={"LR": "0.5"}, launcher_env=launcher_env)
    for worker_plan in plans:
        env = worker_plan.env
        assert (env["WANDB_MODE"], env["LR"], env["WANDB_API_KEY"]) == ("offline", "0.5", "k-123")
        assert env["HF_TOKEN"] == "from-spec"  # the spec's value wins over the launcher's
        assert "HOME" not in env  # only the named secrets come from podrun's environment


def test_a_secret_neither_in_env_nor_in_podruns_environment_is_a_spec_error(spec):
    job = spec("run: python3 train.py\nsecret_env: [WANDB_API_KEY]\n")
    with pytest.raises(SpecError, match=r"job.yaml: secret_env.0: WANDB_API_KEY is neither set in env nor"):
        plans_for(job)


def test_render_hides_secrets_and_quotes_every_value(spec):
    job = spec("""\
        run: python3 train.py
        env: {HF_TOKEN: hf-123, DB_PASSWORD: pw-456, NOTE: "it's $(rm -rf ~) fine"}
        secret_env: [WANDB_API_KEY]
        """)
    plans = plans_for(job, launcher_env={"WANDB_API_KEY": "k-789"})
    shown = render(plans)
    for value in ("hf-123", "pw-456", "k-789"):
        assert value not in shown
    exports = [shlex.split(line) for line in shown.splitlines() if line.startswith("export ")]
    assert ["export", f"HF_TOKEN={SECRET_SHOWN_AS}"] in exports
    assert ["export", f"WANDB_API_KEY={SECRET_SHOWN_AS}"] in exports
    assert ["export", "NOTE=it's $(rm -rf ~) fine"] in exports  # as written, never run by the shell
    assert plans[0].env["HF_TOKEN"] == "hf-123"  # hidden only when shown


def test_render_shows_each_worker_where_and_what_it_runs(spec):
    plans = plans_for(spec("setup: pip install -r requirements.txt\nrun: python3 train.py\n"), count=2)
    blocks = render(plans).split("\n\n")
    assert len(blocks) == 2
    lines = blocks[1].splitlines()
    assert lines[:3] == ["# worker 1: node-1 (internal IP 10.1.0.3)",
                         "# environment: the login shell's, then:", "cd /home/user1/podrun/job/run"]
    assert lines[-2:] == ["pip install -r requirements.txt  # setup", "python3 train.py"]


def test_setup_is_planned_when_the_spec_has_one_and_absent_otherwise(spec):
    with_setup = plans_for(spec("setup: pip install -r requirements.txt\nrun: python3 train.py\n"))
    assert {p.setup for p in with_setup} == {"pip install -r requirements.txt"}
    without = plans_for(spec("run: python3 train.py\n"))
    assert {p.setup for p in without} == {None}
    assert "# setup" not in render(without)


@pytest.mark.parametrize("target, flags", [(GpuNodes, []), (TpuPod, ["--privileged"])])
def test_docker_wraps_run_with_the_targets_container_flags_and_env_names_only(spec, target, flags):
    job = spec("""\
        run: python3 train.py --data "/d 1"
        env: {HF_TOKEN: hf-123}
        docker: {image: "xla:r2.5", args: [--shm-size=16g]}
        """)
    plans = plans_for(job, target)
    for index, worker_plan in enumerate(plans):
        argv = shlex.split(worker_plan.run)
        assert argv[:5] == ["docker", "run", "--rm", "--net=host", f"--name=podrun-{JOB_ID}-w{index}"]
        assert argv[5:11] == ["-v", "$PWD:$PWD", "-w", "$PWD", "-v", "$PODRUN_JOB_DIR:$PODRUN_JOB_DIR"]
        env_flags = [f"--env={key}" for key in [*worker_plan.env, "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                                 "PODRUN_JOB_DIR", "PODRUN_WORKER_IPS_FILE"]]
        assert argv[11:] == ["--init", "--env=TINI_KILL_PROCESS_GROUP=1", *flags, *env_flags, "--shm-size=16g",
                             "xla:r2.5", "sh", "-c", 'trap \'exit 143\' TERM\npython3 train.py --data "/d 1"']
        assert "hf-123" not in worker_plan.run  # values reach the container from the agent's environment


def test_docker_with_torchrun_runs_torchrun_inside_the_container(spec):
    plans = plans_for(spec("run: train.py\ntorchrun: {nproc_per_node: 2}\ndocker: {image: img}\n"), TpuPod)
    assert shlex.split(plans[2].run)[-3:] == [
        "sh", "-c", "trap 'exit 143' TERM\ntorchrun --nnodes=3 --node_rank=2 --nproc_per_node=2"
                    ' --rdzv_endpoint=10.1.0.7:29500 "$PODRUN_JOB_DIR/rank_output.py" train.py']
    assert plans[2].setup is None
    assert plans[2].container == f"podrun-{JOB_ID}-w2"  # the agent stops it by name


def test_plan_is_a_pure_function_of_its_inputs(spec):
    job = spec("run: python3 train.py\nenv: {A: '1'}\nsecret_env: [API_KEY]\n")
    target, fleet, launcher_env = GpuNodes(job), workers(), {"API_KEY": "k"}
    first = plan(job, target, fleet, JOB_ID, CODE_DIR, {"B": "2"}, launcher_env)
    assert first == plan(job, target, fleet, JOB_ID, CODE_DIR, {"B": "2"}, launcher_env)
    assert job.env == {"A": "1"} and launcher_env == {"API_KEY": "k"}


@pytest.mark.parametrize("text, steps, checks", [
    ("run: python3 train.py\n", ("run",), {"run": ()}),
    ("run: train.py\ntorchrun: {port: 29600}\n", ("run",), {"run": ("torchrun", "rendezvous")}),
    # setup may install torch: torchrun is checked after it, the port before each step
    ("setup: pip install torch\nrun: train.py\ntorchrun: {}\n", ("setup", "run"),
     {"setup": ("rendezvous",), "run": ("torchrun", "rendezvous")}),
    # a container brings its own torchrun; docker itself is checked before the first step
    ("setup: make\nrun: train.py\ntorchrun: {}\ndocker: {image: img}\n", ("setup", "run"),
     {"setup": ("docker", "rendezvous"), "run": ("rendezvous",)}),
])
def test_the_job_plan_holds_the_steps_and_the_checks_before_each(spec, text, steps, checks):
    job = job_plan(spec(text), GpuNodes(spec(text)), workers(), JOB_ID, CODE_DIR, {}, {}, selected={0, 2})
    assert (job.steps, job.checks) == (steps, checks)
    assert [worker_plan.worker.index for worker_plan in job.workers] == [0, 2]
    shown = render(job.workers, "target: 3 SSH hosts", job).split("\n\n")[0].splitlines()
    assert shown[:2] == ["# target: 3 SSH hosts", f"# steps: {', '.join(steps)}, once the code is in ~/{CODE_DIR} "
                                                  f"on every worker (shipped where it is not)"]
    assert shown[2:] == [f"# checked before {step}: {CHECKS[check]}" + (f" (port {job.rendezvous_port})"
                                                                         if check == "rendezvous" else "")
                         for step in steps for check in checks[step]]
