"""A detached job with nothing of podrun's watching it here (it needs no supervisor, or its supervisor
is gone): its workers keep its output and its end, reached through each one's endpoint
(launch/detached.py)."""

from __future__ import annotations

import os

from podrun import jobstore
from podrun.handles.base import JobHandle
from podrun.output import say

TYPE_CHECKING = False  # mypy reads the import below; Python skips it (collections.abc would slow `podrun logs`)
if TYPE_CHECKING:
    from collections.abc import Sequence

    from podrun.worker_output import WorkerOutput


class OnWorkers(JobHandle):
    def catch_up(self, indexes: Sequence[int]) -> None:
        if self.record.state == jobstore.RUNNING:
            from podrun.launch import detached

            detached.fetch(self.record, list(indexes), outputs=None, follow=False)

    def follow_there(self, indexes: Sequence[int], outputs: dict[int, WorkerOutput]) -> bool:
        if self.record.state != jobstore.RUNNING:  # the catch-up may have seen it end
            return False
        from podrun.launch import detached

        detached.fetch(self.record, list(indexes), outputs, follow=True)
        return True

    def notes(self, state: str) -> list[str]:
        if not (state == jobstore.RUNNING and self.record.supervisor_lost()):
            return []
        # a supervisor host's job (launch/kept.py) waits for `podrun supervisor start` there; any other, for nothing
        adoptable = os.path.exists(os.path.join(self.record.dir, jobstore.RESUME_FILE))
        return ["supervisor away"] if adoptable else ["supervisor lost"]

    def reread(self) -> None:
        if self.record.state == jobstore.RUNNING:  # the workers that ended meanwhile: their run's end
            self.refresh_all([self])

    def stop(self) -> int:
        from podrun.launch import detached

        self.must_run()
        lost_supervisor = self.record.supervisor_lost()
        detached.stop(self.record)
        code = self.said_stopped()
        if lost_supervisor and self.record.cleanup:
            say(f"its supervisor is gone, so what it was to delete is still there: `{self.record.cleanup}` deletes it")
        return code

    @staticmethod
    def refresh_all(handles: list) -> None:
        from podrun.launch import detached  # asks their workers: a detached job that ended shows it now

        detached.refresh([handle.record for handle in handles])
