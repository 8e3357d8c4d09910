"""What every verb asks of a job's handle (handles/__init__.py chooses it), answered as for a job whose
verbs run here and whose logs grow here; each residence answers its own part differently."""

from __future__ import annotations

from podrun import jobstore
from podrun.errors import PodrunError

POLL_S = 0.1  # a stop waiting for the job's end reads its record this often

TYPE_CHECKING = False  # mypy reads the import below; Python skips it (collections.abc would slow `podrun logs`)
if TYPE_CHECKING:
    from collections.abc import Sequence

    from podrun.worker_output import WorkerOutput


class JobHandle:
    def __init__(self, record: jobstore.JobRecord):
        self.record = record

    def reload(self) -> jobstore.JobRecord:
        """The record as the job store holds it now."""
        self.record = jobstore.load(self.record.id)
        return self.record

    def run_there(self, argv: list[str], raw: bool = False) -> int | None:
        """Run `podrun ARGV` where the job is kept, if that is elsewhere, showing what it prints (its stdout as
        it is, with `raw`); its exit code. None: the job's verbs run here."""
        return None

    def catch_up(self, indexes: Sequence[int]) -> None:
        """Bring the local logs of the workers `indexes` up to date from where the job runs."""

    def follow_there(self, indexes: Sequence[int], outputs: dict[int, WorkerOutput]) -> bool:
        """Show the workers' new output through `outputs` as it comes from where the job runs, until it ends,
        and record the end; False, having done nothing, where the output comes into the local logs."""
        return False

    def writing(self) -> bool:
        """Whether the local logs may still grow: the job runs, and what writes them is there to."""
        return self.record.current_state() == jobstore.RUNNING

    def notes(self, state: str) -> list[str]:
        """What `podrun jobs` says beside the job's state about where it lives."""
        return []

    def reread(self) -> None:
        """The record as where the job runs keeps it, now (`podrun report`)."""

    def stacks(self, indexes: list[int]) -> dict[int, str]:
        """The stacks of a running job's workers `indexes`, now, from the workers themselves."""
        from podrun.launch import detached

        return detached.fetch_stacks(self.record, indexes)

    def stop(self) -> int:
        """Stop the running job, saying how it goes; the exit code of `podrun stop`."""
        raise NotImplementedError

    def must_run(self) -> None:
        if (state := self.record.current_state()) != jobstore.RUNNING:
            raise PodrunError(f"job {self.record.id} is not running (it is {state})")

    def said_stopped(self) -> int:
        print(f"podrun: job {self.record.id} is {self.reload().current_state()}")
        return 0

    @staticmethod
    def refresh_all(handles: list) -> None:
        """Bring the records of these running jobs, all of this residence, up to date from where they run."""
