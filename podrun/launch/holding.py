"""The job's life with its capacity (capacity/), kept in the job's record: what it creates labelled
with the job's id and owned by this launcher until its record runs (owners.py); made, with the wait in
a queue and the moves to other zones on the timeline (`queue`, `create`, `move`); its idle watch;
made again after a preemption or a Slurm time limit (`recreate`, then `queue` for a new allocation's
wait); given back when the job ends, as made for this job alone (a Slurm allocation) or as delete_after
says (a TPU), the record saying so until it is done. lifecycle.py runs the job's attempts on it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from podrun import exits, jobstore, owners, timeline
from podrun.cloud import labels
from podrun.errors import PodrunError
from podrun.launch import health
from podrun.output import say
from podrun.spec.model import DeleteAfter, JobSpec
from podrun.targets.base import Target, Worker


class Holding:
    def __init__(self, spec: JobSpec, target: Target, delete_after: DeleteAfter):
        self.spec, self.target, self.capacity = spec, target, target.capacity
        self.delete_after = delete_after
        self.reacquiring = False  # between a loss and the capacity made again: what was lost is of no use
        self.acquired: tuple[float, float] | None = None  # when acquire() began and ended, if it made something
        self.reallocated = False  # replace_lost() made capacity again without what it left out

    @contextlib.contextmanager
    def claimed(self, job_id: str) -> Iterator[None]:
        """What the capacity creates is labelled with the job's id and owned by this launcher until its record
        runs (owners.py); orphans of earlier jobs are warned of."""
        if (api := self.capacity.labelling_api()) is None:
            yield
            return
        self.capacity.labels = labels.owner_labels(job_id, self.delete_after != "never", self.spec.idle_delete_s)
        with owners.claim(job_id):  # first: a job adopted again (supervisor/adopt.py) owns its TPU already
            owners.warn_of_orphans(api)
            yield

    def acquire(self, stop_grace_s: float, detached: bool) -> list[Worker]:
        """The capacity acquired and its workers reached: for capacity just made, both are its `create`
        (a TPU's workers install the user's key as they come up)."""
        started = time.time()
        self.capacity.stop_grace_s, self.capacity.runs_detached = stop_grace_s, detached
        self.capacity.acquire()
        workers = self.target.workers(dry_run=False)
        self.acquired = (started, time.time()) if self.capacity.just_created else None
        return workers

    def record_acquired(self, record: jobstore.JobRecord, workers: list[Worker]) -> None:
        """What acquire() made, on the record's timeline: through a queue, the wait for capacity first (queue),
        then the rest (create); then its idle watch."""
        if self.acquired is None:
            return
        started, ended = self.acquired
        self.record_moves(record)
        if queued_until := self.capacity.queued_until:
            timeline.add(record, "queue", started, queued_until)
            started = queued_until
        timeline.add(record, "create", started, ended)
        self.watch_idle(workers)

    def record_moves(self, record: jobstore.JobRecord) -> None:
        """The capacity's moves to another zone while it was made (cloud/zone_moves.py): an instant each, `move`."""
        for move in self.capacity.moves:
            timeline.add(record, "move", move["at"], move["at"], why=move["why"], zone=move["to"], left=move["from"])
        self.capacity.moves.clear()

    def watch_idle(self, workers: list[Worker]) -> None:
        """The spec's idle_delete, on a TPU just made for the job: its worker 0 watches (launch/idle_watch.py); a
        watch that cannot start is said, and the job goes on (delete_after still applies)."""
        if self.spec.idle_delete_s is None:
            return
        from podrun.launch import idle_watch

        try:
            idle_watch.start(self.target, workers, self.spec.idle_delete_s)
        except PodrunError as error:
            say(f"{error}; the TPU stays until deleted: `{self.capacity.give_back_command()}`")

    def reacquire(self, record: jobstore.JobRecord, why: str | None, only_if_lost: bool = False) -> list[Worker]:
        """The capacity made again after a loss and its workers reached: `recreate` on the timeline (with a
        queued request, when it found capacity: the new TPU bills from then). `only_if_lost`: unless what was
        made again already serves (a supervisor adopting a job cut off while it was made)."""
        self.reacquiring = True  # from here on, an interrupt gives back what was lost
        recreating = timeline.begin(record, "recreate", why=why)
        self.capacity.queued_until = None
        if not only_if_lost or self.capacity.lost() is not None:
            self.capacity.reacquire()
        self.record_moves(record)
        if self.capacity.queued_until:
            recreating["capacity_at"] = round(self.capacity.queued_until, 3)
        self.reacquiring = False
        workers = self.target.workers(dry_run=False)
        if (queued_from := self.capacity.queued_from) is not None:  # its wait in a queue: a part of its own
            timeline.end(recreating, at=queued_from)
            timeline.add(record, "queue", queued_from, self.capacity.queued_until or time.time())
        else:
            timeline.end(recreating)
        return workers

    def replace_lost(self, record: jobstore.JobRecord) -> list[str]:
        """Before the next attempt: each worker lost in the one that ended (its connection dropped, or it could
        not be reached: exit LOST) left out, where the capacity has spares, and a spare put in its rank (or, with
        none left, capacity made again without it, where it reallocates); said in a line each and kept as an
        instant `swap` ({worker, left, spare, why}). What was swapped, for the
        restart's notification (`10.0.0.2 left out, spare 10.0.0.9 in its place`)."""
        ended, swaps, reallocated = record.attempts[-1], [], []
        how = "failed the preflight" if health.failed_it(ended["summary"]) else "lost"
        for worker in record.workers:
            if worker.exit_code != exits.LOST or (swap := self.capacity.replace(worker.index)) is None:
                continue
            left, spare = swap
            if spare is None and self.capacity.reallocates:
                say(f"worker {worker.index}: {left} left out for the rest of the job ({how} in attempt "
                    f"{ended['attempt']}); no spare is left: the next attempt runs on a new allocation without it")
                timeline.add(record, "swap", time.time(), time.time(), worker=worker.index, left=left, spare=None,
                             why=ended["summary"])
                swaps.append(f"{left} left out, a new allocation without it")
                reallocated.append(left)
                continue
            if spare is None:
                say(f"worker {worker.index}'s host {left} was {how} in attempt {ended['attempt']} and no spare is "
                    f"left: the next attempt runs on it again")
                continue
            say(f"worker {worker.index}: {left} left out for the rest of the job ({how} in attempt {ended['attempt']}); "
                f"spare {spare} takes its place")
            timeline.add(record, "swap", time.time(), time.time(), worker=worker.index, left=left, spare=spare,
                         why=ended["summary"])
            swaps.append(f"{left} left out, spare {spare} in its place")
        self.reallocated = self.capacity.reallocates
        if self.reallocated:
            self.reacquire(record, f"{', '.join(reallocated)} left out")
        return swaps

    @property
    def gives_back(self) -> bool:
        """Whether the job's end gives something back (what a detached job's supervisor is there for)."""
        return self.delete_after != "never" or self.capacity.for_this_job

    def cleanup_command(self) -> str | None:
        """What a user runs to give back what the job holds, where podrun could not."""
        return self.capacity.give_back_command() if self.gives_back else None

    def duties(self) -> list[str]:
        """What a detached job's supervisor does with the capacity, as its line says."""
        duties = []
        if self.delete_after != "never":
            duties.append(f"deletes the TPU when it ends ({'always' if self.delete_after == 'always' else 'on success'})")
        if self.capacity.for_this_job:
            duties.append(f"gives back {self.capacity.held} when it ends")
        return duties

    def self_delete_config(self) -> dict | None:
        """What worker 0 deletes of a supervisor host's job left without its supervisor: what delete_after would."""
        deletes = self.delete_after != "never" and self.spec.target.declared.deletes
        return self.capacity.self_delete_config() if deletes else None

    def give_back_after(self, record: jobstore.JobRecord | None, failure: BaseException | None = None) -> None:
        """give_back() as the job ended, or failed with `failure`: when giving back fails too, the failure is said
        first (a creation that timed out, not only the deletion that then did too)."""
        try:
            self.give_back(record)
        except PodrunError as error:
            if not isinstance(failure, PodrunError):
                raise
            what = f"giving back {self.capacity.held}" if self.capacity.for_this_job else "deleting the TPU (delete_after)"
            both = PodrunError(f"{failure}; then, {what}: {error}")
            both.exit_code = failure.exit_code
            raise both from None

    def give_back(self, record: jobstore.JobRecord | None) -> None:
        """Give back what was made for this job alone (a Slurm allocation), and delete the TPU when delete_after
        says so; a preempted one too when podrun can create it again (it is of no use, and holds its name and
        quota until deleted), else say how."""
        state = record.state if record else jobstore.FAILED  # no record: it failed before the job started
        if self.capacity.for_this_job or self.delete_after == "always" or (
                self.delete_after == "success" and state == jobstore.SUCCEEDED):
            self._giving_back(record)
        elif state == jobstore.PREEMPTED or self.reacquiring:
            self.capacity.give_back_lost()

    def _giving_back(self, record: jobstore.JobRecord | None) -> None:
        """capacity.give_back(), a TPU's record saying so until it is done (`succeeded; deleting its TPU`), or failed."""
        if record is None or not self.spec.target.declared.deletes:
            return self.capacity.give_back()
        record.note_giving_back("deleting its TPU")
        try:
            self.capacity.give_back()
        except BaseException as error:
            cut_off = "was cut off: `podrun list` shows what is left"
            record.note_giving_back(f"deleting its TPU {f'failed: {error}' if isinstance(error, PodrunError) else cut_off}")
            raise
        record.note_giving_back(None)
