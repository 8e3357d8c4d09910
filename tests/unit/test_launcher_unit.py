"""The launcher's state machine (launch/launcher.py) against fake workers whose agents speak the protocol
in-process (fake_transport.py): fail-fast, stops, interrupts and the job record, in milliseconds.
The same behaviour is checked for real, with processes on lab hosts, in test_exec_local.py and
test_fault_matrix.py."""

from __future__ import annotations

import asyncio
import io
import signal
from dataclasses import dataclass

import pytest
from fake_transport import Changes, FakeTransport, Script

from podrun import jobstore, paths
from podrun.errors import PodrunError
from podrun.launch import steps
from podrun.launch.launcher import Launch
from podrun.plan import job_plan
from podrun.shipping import scan
from podrun.spec.loading import load_spec
from podrun.targets.base import Target, Worker
from podrun.terminal import Terminal

GUARD_S = 5  # only a broken launcher gets near this: it would otherwise hang the test


class FakeTarget(Target):
    kind = "fake"
    worker_noun = "fake worker"
    default_device = "CPU"

    def __init__(self, spec, workers: list[Worker], refusal: str | None = None):
        super().__init__(spec)
        self._workers = workers
        self.refusal = refusal
        self.reports: list[tuple[Worker, dict]] = []

    def workers(self, dry_run: bool) -> list[Worker]:
        return self._workers

    def probe(self, kill_stale: bool) -> dict:
        return {"look_for": "/dev/fake*"}

    def check_probes(self, reports, kill_stale):
        self.reports = reports
        if self.refusal:
            raise PodrunError(self.refusal)


@dataclass
class Job:
    launch: Launch
    transports: list[FakeTransport]
    changes: Changes
    screen: io.BytesIO

    @property
    def id(self) -> str:
        return self.launch.record.id

    def agents(self, step: str) -> list:
        return [transport.agent(step) for transport in self.transports]

    def saved(self) -> jobstore.JobRecord:
        """The job as `podrun jobs` reads it from disk."""
        return jobstore.load(self.id)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PODRUN_HOME", str(tmp_path / "home"))


def make_job(tmp_path, scripts: list[Script], spec: str = "run: python3 train.py\n", detach: bool = False,
             refusal: str | None = None, screen: io.BytesIO | None = None) -> Job:
    """A job as commands/exec.py builds one, on fake workers; call inside the event loop."""
    (tmp_path / "job.yaml").write_text(spec)
    job_spec = load_spec(tmp_path / "job.yaml")
    changes = Changes()
    transports = [FakeTransport(index, script, changes) for index, script in enumerate(scripts)]
    workers = [Worker(index, f"fake/w{index}", f"10.9.0.{10 + index}", transport)
               for index, transport in enumerate(transports)]
    target = FakeTarget(job_spec, workers, refusal)
    tree = scan.Tree(tmp_path, [], "0" * 16)  # the fake probes say the code is there: nothing ships
    job_id = jobstore.new_job_id(job_spec.name)
    job = job_plan(job_spec, target, workers, job_id, paths.remote_code_dir(job_spec.name, tree.digest), {}, {})
    record = jobstore.JobRecord(id=job_id, name=job_spec.name, target=f"fake:{len(workers)}", spec_path=str(tmp_path),
                                workers=[jobstore.WorkerRecord(w.index, w.address) for w in workers])
    record.create()
    screen = screen or io.BytesIO()
    launch = Launch(target, job, tree, record, Terminal(stream=screen, prefixed=True), detach)
    return Job(launch, transports, changes, screen)


def run_job(tmp_path, scripts, **options) -> tuple[int, Job]:
    async def main():
        job = make_job(tmp_path, scripts, **options)
        return await asyncio.wait_for(job.launch.run(), GUARD_S), job
    return asyncio.run(main())


def run_job_until(tmp_path, scripts, ready, then, **options) -> tuple[int, Job]:
    """Run the job; once ready(job) holds, call then(job); returns the launcher's exit code."""
    async def main():
        job = make_job(tmp_path, scripts, **options)
        running = asyncio.ensure_future(job.launch.run())
        waiting = asyncio.ensure_future(job.changes.until(lambda: ready(job)))
        await asyncio.wait([running, waiting], timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        assert waiting.done(), f"the launcher ended or hung first: {running}"
        then(job)
        return await asyncio.wait_for(running, GUARD_S), job
    return asyncio.run(main())


def interrupt(signum=signal.SIGINT):
    return lambda job: job.launch._on_signal(signum)


def everyone_runs(step: str):
    return lambda job: all(agent and agent.started() for agent in job.agents(step))


# --- success -----------------------------------------------------------------------------------


def test_all_workers_succeed_exit_0_and_the_record_says_succeeded(tmp_path):
    scripts = [Script(lines={"run": [f"hello from {index}"]}) for index in range(3)]
    code, job = run_job(tmp_path, scripts)
    assert code == 0
    saved = job.saved()
    assert (saved.state, saved.exit_code) == (jobstore.SUCCEEDED, 0)
    assert [worker.exit_code for worker in saved.workers] == [0, 0, 0]
    assert sorted(job.screen.getvalue().splitlines()) == [b"[w0] hello from 0", b"[w1] hello from 1",
                                                          b"[w2] hello from 2"]
    with open(job.launch.record.log_path(1), "rb") as log:  # every byte, unprefixed
        assert log.read() == b"hello from 1\n"
    assert all(transport.closed for transport in job.transports)


def test_each_agent_gets_its_workers_plan_and_the_first_step_probes_then_goes(tmp_path):
    scripts = [Script(), Script()]
    code, job = run_job(tmp_path, scripts, spec="setup: pip install -r req.txt\nrun: python3 train.py\n")
    assert code == 0
    for index, (setup, run) in enumerate(zip(job.agents("setup"), job.agents("run"))):
        worker_plan = job.launch.plans[index]
        assert setup.config["command"] == "pip install -r req.txt"
        assert run.config["command"] == "python3 train.py"
        assert run.config["env"] == worker_plan.env and run.config["env"]["PODRUN_WORKER"] == str(index)
        assert setup.config["probe"] == {"code_dir": worker_plan.code_dir, "look_for": "/dev/fake*",
                                         "route_to": worker_plan.env["MASTER_ADDR"]}  # the interface doctor's
        assert "probe" not in run.config  # only the first step reports and waits
        assert setup.heard[:1] == ["go"] and "go" not in run.heard
    assert [(worker.index, report["code"]) for worker, report in job.launch.target.reports] == [(0, 1), (1, 1)]


def test_agents_hear_heartbeats_while_a_step_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(steps, "HEARTBEAT_S", 0.01)
    scripts = [Script(held={"run"}), Script(held={"run"})]
    code, job = run_job_until(tmp_path, scripts, lambda job: all(
        agent and agent.heard.count("") >= 2 for agent in job.agents("run")), interrupt())
    assert code == 130


# --- fail fast -----------------------------------------------------------------------------------


def test_one_worker_failing_returns_its_code_and_stops_every_other_worker(tmp_path, capsys):
    scripts = [Script(held={"run"}), Script(codes={"run": 3}, lines={"run": ["RuntimeError: boom"]}),
               Script(held={"run"})]
    code, job = run_job(tmp_path, scripts)
    assert code == 3
    w0, w1, w2 = job.agents("run")
    assert "stop" in w0.heard and "stop" in w2.heard
    saved = job.saved()
    assert (saved.state, saved.exit_code) == (jobstore.FAILED, 3)
    assert saved.summary == "worker 1 exited with code 3 in run (RuntimeError: boom)"
    assert [(worker.exit_code, worker.signal) for worker in saved.workers] == [(143, "SIGTERM"), (3, None),
                                                                              (143, "SIGTERM")]
    err = capsys.readouterr().err
    assert "worker 1 (fake/w1) exited with code 3 in run" in err
    assert "last lines of worker 1:\n  RuntimeError: boom" in err


def test_the_first_failure_wins_over_workers_failing_while_they_stop(tmp_path):
    scripts = [Script(codes={"run": 3}), Script(held={"run"}, stopped_code=1)]
    code, job = run_job(tmp_path, scripts)
    assert code == 3
    assert job.saved().summary.startswith("worker 0 exited with code 3")


@pytest.mark.parametrize("lost_in", ["probe", "run"])
def test_a_worker_whose_connection_is_lost_fails_the_job_with_255_naming_it(tmp_path, lost_in):
    scripts = [Script(held={"run"}), Script(lost_in=lost_in), Script(held={"run"})]
    code, job = run_job(tmp_path, scripts)
    assert code == 255
    saved = job.saved()
    assert saved.state == jobstore.FAILED
    assert saved.summary.startswith("worker 1 lost its connection (connection reset by peer) in run")
    w0, _, w2 = job.agents("run")
    assert "stop" in w0.heard and "stop" in w2.heard
    if lost_in == "probe":  # nothing started anywhere
        assert not w0.started() and not w2.started()


def test_a_failing_setup_means_run_never_starts_on_any_worker(tmp_path):
    scripts = [Script(held={"setup"}), Script(codes={"setup": 1}), Script(held={"setup"})]
    code, job = run_job(tmp_path, scripts, spec="setup: ./prepare.sh\nrun: python3 train.py\n")
    assert code == 1
    assert job.agents("run") == [None, None, None]
    assert all("stop" in agent.heard for index, agent in enumerate(job.agents("setup")) if index != 1)
    saved = job.saved()
    assert (saved.state, saved.summary) == (jobstore.FAILED, "worker 1 exited with code 1 in setup")


def test_a_target_check_refusing_the_probes_stops_every_agent_before_anything_starts(tmp_path):
    async def main():
        job = make_job(tmp_path, [Script(), Script()], refusal="the TPU is in use on the workers")
        with pytest.raises(PodrunError, match="the TPU is in use"):
            await asyncio.wait_for(job.launch.run(), GUARD_S)
        return job
    job = asyncio.run(main())
    for agent in job.agents("run"):
        assert agent.heard == ["stop"] and not agent.started()
    saved = job.saved()
    assert (saved.state, saved.summary) == (jobstore.FAILED, "the TPU is in use on the workers")


@pytest.mark.parametrize("error, message", [
    (OSError("connection refused"), "worker 1 (fake/w1): OSError: connection refused"),
    (PodrunError("host key of fake/w1 changed"), "host key of fake/w1 changed"),
])
def test_a_failed_connect_is_one_line_naming_the_worker_and_nothing_starts(tmp_path, error, message):
    async def main():
        job = make_job(tmp_path, [Script(), Script(connect_error=error), Script()])
        with pytest.raises(PodrunError) as raised:
            await asyncio.wait_for(job.launch.run(), GUARD_S)
        return job, str(raised.value)
    job, raised = asyncio.run(main())
    assert raised == message
    assert all(not transport.agents for transport in job.transports)
    saved = job.saved()
    assert (saved.state, saved.exit_code, saved.summary) == (jobstore.FAILED, 1, message)


# --- interrupts -----------------------------------------------------------------------------------


def test_ctrl_c_while_connecting_starts_nothing_and_exits_130(tmp_path):
    scripts = [Script(), Script(connect_held=True)]
    code, job = run_job_until(tmp_path, scripts, lambda job: all(t.connecting for t in job.transports), interrupt())
    assert code == 130
    assert all(not transport.agents for transport in job.transports)
    saved = job.saved()
    assert (saved.state, saved.exit_code, saved.summary) == (jobstore.STOPPED, 130, "stopped by SIGINT")


def test_ctrl_c_while_waiting_for_probes_stops_every_agent_before_the_job_starts(tmp_path):
    scripts = [Script(), Script(probe_held=True), Script()]
    code, job = run_job_until(tmp_path, scripts, lambda job: all(job.agents("run")), interrupt())
    assert code == 130
    for agent in job.agents("run"):
        assert "stop" in agent.heard and "go" not in agent.heard and not agent.started()
    assert job.saved().state == jobstore.STOPPED


@pytest.mark.parametrize("step", ["setup", "run"])
@pytest.mark.parametrize("signum, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_during_a_step_stops_every_worker(tmp_path, step, signum, expected):
    scripts = [Script(held={step}) for _ in range(3)]
    code, job = run_job_until(tmp_path, scripts, everyone_runs(step), interrupt(signum),
                              spec="setup: ./prepare.sh\nrun: python3 train.py\n")
    assert code == expected
    assert all("stop" in agent.heard for agent in job.agents(step))
    if step == "setup":
        assert job.agents("run") == [None, None, None]
    saved = job.saved()
    assert (saved.state, saved.exit_code, saved.summary) == (jobstore.STOPPED, expected, f"stopped by {signum.name}")
    assert [(worker.exit_code, worker.signal) for worker in saved.workers] == [(143, "SIGTERM")] * 3


def test_stdout_closed_by_its_reader_stops_the_job_with_141(tmp_path):
    class ClosedPipe(io.BytesIO):
        def write(self, data):
            raise BrokenPipeError

    scripts = [Script(held={"run"}, lines={"run": ["step 1"]}), Script(held={"run"})]
    code, job = run_job(tmp_path, scripts, screen=ClosedPipe())
    assert code == 141
    assert all("stop" in agent.heard for agent in job.agents("run"))
    assert job.saved().summary == "stopped by SIGPIPE"


def test_a_second_ctrl_c_exits_at_once_and_records_the_job_stopped(tmp_path):
    async def main():
        job = make_job(tmp_path, [Script()])
        job.launch._on_signal(signal.SIGINT)
        with pytest.raises(SystemExit) as exited:
            job.launch._on_signal(signal.SIGINT)
        for log in job.launch.logs.values():  # run() would have closed them
            log.close()
        return job, exited.value.code
    job, code = asyncio.run(main())
    assert code == 130
    saved = job.saved()
    assert (saved.state, saved.exit_code, saved.summary) == (jobstore.STOPPED, 130, "interrupted twice")


# --- detach -----------------------------------------------------------------------------------


def test_detach_returns_0_once_run_started_and_marks_the_record_detached(tmp_path):
    code, job = run_job(tmp_path, [Script(), Script()], detach=True)
    assert code == 0
    assert [agent.config["detach"] for agent in job.agents("run")] == [True, True]
    saved = job.saved()
    assert saved.detached and saved.state == jobstore.RUNNING
    assert [worker.exit_code for worker in saved.workers] == [None, None]  # the run goes on


def test_detach_runs_setup_attached_first(tmp_path):
    code, job = run_job(tmp_path, [Script(), Script()], detach=True, spec="setup: ./prepare.sh\nrun: python3 train.py\n")
    assert code == 0
    assert [agent.config["detach"] for agent in job.agents("setup")] == [False, False]
    assert [agent.config["detach"] for agent in job.agents("run")] == [True, True]
    assert job.saved().detached


def test_a_detached_run_on_several_workers_is_watched_from_the_first_worker(tmp_path):
    """The agents of a detached run watch each other (hub.Hub): the first worker's agent says where
    it listens, and every agent is told that address with "go", after the setup step too."""
    code, job = run_job(tmp_path, [Script(), Script(), Script()], detach=True,
                        spec="setup: ./prepare.sh\nrun: python3 train.py\n")
    assert code == 0
    assert all("watch" not in agent.config for agent in job.agents("setup"))
    watches = [agent.config["watch"] for agent in job.agents("run")]
    assert [watch["worker"] for watch in watches] == [0, 1, 2]
    assert {watch["hub_worker"] for watch in watches} == {0} and {watch["workers"] for watch in watches} == {3}
    assert len({watch["token"] for watch in watches}) == 1 and len(watches[0]["token"]) == 32
    hub = "10.9.0.10:40000"  # worker 0 internal IP, and the port its fake agent reports
    assert [[line for line in agent.heard if line.startswith("go")] for agent in job.agents("run")] == [[f"go {hub}"]] * 3


def test_an_attached_or_single_worker_run_is_not_watched(tmp_path):
    (tmp_path / "attached").mkdir()
    (tmp_path / "single").mkdir()
    _, attached = run_job(tmp_path / "attached", [Script(), Script()])
    _, single = run_job(tmp_path / "single", [Script()], detach=True)
    assert all("watch" not in agent.config for agent in attached.agents("run") + single.agents("run"))
