"""A Slurm job carried past its time limit (restarts.on: [time_limit]) on the Slurm lab's real cluster: Slurm
signals every process of the step stop_grace ahead of the limit (salloc --signal), the ranks save, and podrun
asks for a new allocation and runs the next attempt there, which resumes; restarts.max is not used up."""

from __future__ import annotations

import json
import re

import pytest

from helpers import job_id_in, podrun, wait_until

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# On the lab's slurmctld the warning comes at its scheduler's pass, every 30 s, in the 30 s before
# TimeLimit - sig_time: with a 1-minute limit (Slurm's shortest) and stop_grace 5s, 25 to 55 s into an
# allocation. Work of more than twice the most an allocation gives needs at least three of them.
STEPS = 115
WORK = '''\
import json, os, signal, time

path = os.path.expanduser("~/time-limit-w%s.json" % os.environ["PODRUN_WORKER"])
state = json.load(open(path)) if os.path.exists(path) else {"step": 0, "runs": []}
state["runs"].append({"slurm_job": os.environ["SLURM_JOB_ID"], "attempt": int(os.environ["PODRUN_ATTEMPT"]),
                      "from": state["step"]})
signals = []
signal.signal(signal.SIGTERM, lambda *_: signals.append(time.time()))
while state["step"] < int(os.environ["STEPS"]) and not signals:
    time.sleep(1)
    state["step"] += 1
    print("step", state["step"], flush=True)
state["runs"][-1]["sigterms"] = len(signals)
with open(path + ".tmp", "w") as saved:
    json.dump(state, saved)
os.replace(path + ".tmp", path)
print("saved at step %d after %d SIGTERM" % (state["step"], len(signals)), flush=True)
'''


def checkpoints(cluster) -> list[dict]:
    return [json.loads((cluster.home / f"time-limit-w{worker}.json").read_text()) for worker in (0, 1)]


@pytest.fixture
def fresh_checkpoints(cluster):
    for worker in (0, 1):
        (cluster.home / f"time-limit-w{worker}.json").unlink(missing_ok=True)


def test_a_job_that_outlasts_two_time_limits_finishes_on_three_allocations(home, cluster, slurm_spec,
                                                                             fresh_checkpoints):
    """The Done-when of issue 50: each allocation ends at its time limit, the job resumes on the next one from
    where it saved, exit 0, nothing left in the queue. The rank (python under the run's shell) gets Slurm's one
    SIGTERM itself, no second from podrun's agent; restarts.max 0 is not used up by continuations."""
    spec = slurm_spec(f"run: STEPS={STEPS} python3 work.py\nstop_grace: 5s\nrestarts: {{max: 0, on: [time_limit]}}\n",
                      options=", time: '1'", files={"work.py": WORK})
    result = podrun("exec", spec, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    continued = re.findall(r"^podrun: attempt (\d+): continuing on a new allocation \(Slurm job (\d+) was \d+s from "
                           r"its time limit \(00:01:00\): the job was signalled to save and stop; a continuation",
                           result.stderr, re.M)
    assert len(continued) >= 2, result.stderr[-3000:]
    assert [int(attempt) for attempt, _ in continued] == list(range(1, len(continued) + 1))
    for state in checkpoints(cluster):
        runs = state["runs"]
        assert state["step"] == STEPS and len(runs) == len(continued) + 1, state
        assert [run["attempt"] for run in runs] == list(range(len(runs)))
        assert len({run["slurm_job"] for run in runs}) == len(runs), runs  # a new allocation each time
        assert runs[0]["from"] == 0 and all(later["from"] > earlier["from"] for earlier, later in zip(runs, runs[1:]))
        assert [run["sigterms"] for run in runs] == [1] * len(continued) + [0], runs  # Slurm's alone, each time
    job_id = job_id_in(result.stderr)
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert (record["state"], record["exit_code"], record["attempt"]) == ("succeeded", 0, len(continued)), record
    assert all((attempt["state"], attempt["exit_code"]) == ("failed", 125) for attempt in record["attempts"])
    report = json.loads(podrun("report", "--json", job_id).stdout)
    assert report["parts_s"]["queue"] > 0, report["parts_s"]  # the waits for the new allocations
    assert cluster.queued() == {}


def test_a_detached_job_goes_on_past_its_time_limit_with_the_laptop_closed(home, cluster, slurm_spec, fresh_checkpoints):
    """Detached, the agents have left the srun step, where Slurm's warning cannot reach them: the supervisor
    stops the job stop_grace ahead of the limit itself, each rank gets one SIGTERM from its agent, and the
    job goes on on a new allocation."""
    spec = slurm_spec("run: STEPS=65 python3 work.py\nstop_grace: 5s\nrestarts: {max: 0, on: [time_limit]}\n",
                      options=", time: '1'", files={"work.py": WORK})
    result = podrun("exec", spec, "--detach")
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)

    def ended() -> dict | None:
        record = json.loads(podrun("jobs", "--json").stdout)[0]
        return record if record["state"] != "running" else None

    wait_until(ended, "the detached job to end", timeout=300)
    record = ended()
    assert record is not None
    log = (home / "jobs" / job_id / "supervisor.log").read_text()
    assert (record["state"], record["exit_code"]) == ("succeeded", 0), log
    assert record["attempt"] >= 1 and all(attempt["exit_code"] == 125 for attempt in record["attempts"]), record
    assert "(stop_grace) before its Slurm allocation (job" in log, log
    for state in checkpoints(cluster):
        runs = state["runs"]
        assert state["step"] == 65 and len(runs) == record["attempt"] + 1, state
        assert len({run["slurm_job"] for run in runs}) == len(runs), runs
        assert [run["sigterms"] for run in runs] == [1] * record["attempt"] + [0], runs
    wait_until(lambda: cluster.queued() == {}, "squeue to show nothing of the job", timeout=60)
