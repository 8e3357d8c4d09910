"""The launcher's last line of defence: an exception from a worker's transport that is not a
PodrunError is one line naming the worker, never a traceback. A transport that raises on purpose
stands in for a library's unexpected error (the only thing here that is not real)."""

from __future__ import annotations

from podrun import cli
from podrun.targets.base import Worker
from podrun.targets.local import LocalWorkers
from podrun.transport.local import LocalTransport

from helpers import crashed


class ExplodingTransport(LocalTransport):
    async def connect(self) -> None:
        raise RuntimeError("the SSH library broke in a way nobody planned for")


def test_an_unexpected_error_while_connecting_names_the_worker(home, job_file, monkeypatch, capsys):
    spec = job_file("run: echo ran\ntarget: {local: {workers: 3}}")
    workers_of = LocalWorkers.workers

    def with_worker_1_exploding(self, dry_run):
        workers = workers_of(self, dry_run)
        broken = workers[1]
        workers[1] = Worker(broken.index, broken.address, broken.internal_ip, ExplodingTransport(broken.transport.root))
        return workers

    monkeypatch.setattr(LocalWorkers, "workers", with_worker_1_exploding)
    code = cli.main(["exec", str(spec)])
    err = capsys.readouterr().err
    assert code == 1 and not crashed(err)
    assert err.splitlines()[-1] == ("podrun: error: worker 1 (local/w1): RuntimeError: "
                                    "the SSH library broke in a way nobody planned for")
