"""The job's life with its capacity (launch/holding.py): spares put in a lost host's rank."""

from __future__ import annotations

from podrun import exits, jobstore
from podrun.launch.holding import Holding
from podrun.spec.problems import validate_fields
from podrun.targets.hosts import SshHosts


def test_each_lost_host_is_left_out_for_a_spare_in_its_rank_until_none_is_left(capsys):
    spec = validate_fields({"name": "j", "run": "true",
                            "target": {"hosts": ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "spares": ["10.0.0.9"]}})
    target = SshHosts(spec)
    holding = Holding(spec, target, "never")
    record = jobstore.JobRecord("j", "j", "hosts:3", "job.yaml", [jobstore.WorkerRecord(i, "x") for i in range(3)])
    record.attempts = [{"attempt": 0, "summary": "worker 1 lost its connection"}]
    record.workers[1].exit_code = exits.LOST
    record.workers[2].exit_code = 143  # stopped by podrun when worker 1 was lost: not lost itself
    assert holding.replace_lost(record) == ["10.0.0.2 left out, spare 10.0.0.9 in its place"]
    assert [worker.address for worker in target.workers(dry_run=False)] == ["10.0.0.1", "10.0.0.9", "10.0.0.3"]
    assert [(e["phase"], e["worker"], e["left"], e["spare"]) for e in record.phases] == [
        ("swap", 1, "10.0.0.2", "10.0.0.9")]

    record.attempts.append({"attempt": 1, "summary": "worker 0 lost its connection"})
    record.workers[1].exit_code, record.workers[0].exit_code = 0, exits.LOST
    capsys.readouterr()
    assert holding.replace_lost(record) == []
    assert capsys.readouterr().err == ("podrun: worker 0's host 10.0.0.1 was lost in attempt 1 and no spare is left: "
                                       "the next attempt runs on it again\n")
    assert [worker.address for worker in target.workers(dry_run=False)] == ["10.0.0.1", "10.0.0.9", "10.0.0.3"]


def test_hosts_without_spares_stay_as_they_are():
    spec = validate_fields({"name": "j", "run": "true", "target": {"hosts": ["10.0.0.1", "10.0.0.2"]}})
    holding = Holding(spec, SshHosts(spec), "never")
    record = jobstore.JobRecord("j", "j", "hosts:2", "job.yaml", [jobstore.WorkerRecord(i, "x") for i in range(2)])
    record.attempts = [{"attempt": 0, "summary": "worker 1 lost its connection"}]
    record.workers[1].exit_code = exits.LOST
    assert holding.replace_lost(record) == [] and record.phases == []


def test_a_spec_dumped_for_a_handover_validates_again_whatever_its_kind():
    spec = validate_fields({"name": "j", "run": "true", "target": {"local": {"workers": 2}}})
    dumped = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["target"]["spares"] == []  # a sibling's default: as good as absent
    assert validate_fields(dumped).target.kind == "local"
