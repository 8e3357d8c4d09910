"""A job handed to a supervisor host (supervisor/handover.py): the record here points at the one kept
there, and every verb runs there (supervisor/remote.py)."""

from __future__ import annotations

from podrun import jobstore
from podrun.handles.base import JobHandle


class OnSupervisorHost(JobHandle):
    def __init__(self, record: jobstore.JobRecord):
        super().__init__(record)
        assert record.supervised_by is not None
        self.supervisor = record.supervised_by  # {host, endpoint: Transport.endpoint(), podrun: its command there}
        self.unreachable = False  # its supervisor could not be asked (refresh_all): the record is as last known

    def run_there(self, argv: list[str], raw: bool = False) -> int:
        from podrun.supervisor import remote

        return remote.forward(self.record, self.supervisor, argv, raw)

    def notes(self, state: str) -> list[str]:
        there = self.supervisor.get(jobstore.SUPERVISOR_NOTES, []) if state == jobstore.RUNNING else []  # its handle's there
        return [f"on {self.supervisor['host']}", *there, *(["supervisor unreachable"] * self.unreachable)]

    def reread(self) -> None:
        from podrun.supervisor import remote  # its phases are in the record its supervisor keeps

        remote.reread(self.record, self.supervisor)

    def stop(self) -> int:
        return self.run_there(["stop", self.record.id])

    @staticmethod
    def refresh_all(handles: list) -> None:
        from podrun.supervisor import remote  # asks their supervisors

        unreachable = remote.refresh([(handle.record, handle.supervisor) for handle in handles])
        for handle in handles:
            handle.unreachable = handle.record.id in unreachable
