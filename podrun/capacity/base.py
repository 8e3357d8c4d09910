"""What capacity is to the rest of podrun (the package's docstring): acquire it, learn that it was lost,
acquire it again, give it back. The defaults are capacity that is simply there: nothing to acquire,
nothing an API could say was lost, nothing to give back."""

from __future__ import annotations

from typing import Any


class Capacity:
    departs = False  # whether it can go away under a job (then lost() is asked)
    runs_out = False  # whether its time can run out under a job (then ran_out() is asked before a failure is said)
    for_this_job = False  # made for this job alone: given back whenever the job ends (else as delete_after says)
    held = ""  # what it holds, for messages ("its Slurm allocation (job 1234)")

    def __init__(self) -> None:
        self.just_created = False  # made by acquire(): its workers may refuse a key for a few seconds
        self.queued_until: float | None = None  # when acquire()'s queued request found capacity (epoch seconds)
        # when reacquire()'s request went into a queue where all of its wait was (a Slurm allocation's), or None
        self.queued_from: float | None = None
        self.stop_grace_s = 0.0  # the job's: how long ahead of its end a capacity that warns_steps warns
        self.runs_detached = False  # the job runs detached (exec --detach): its agents are no steps of the capacity's
        self.labels: dict[str, str] = {}  # what it creates carries them (cloud/labels.py); the launch sets them
        self.moves: list[dict] = []  # its moves to another zone while it was made ({at, from, to, why})
        # replace() left a part out with no spare left, and reacquire() makes capacity without it (a Slurm
        # allocation asked for again, --exclude)
        self.reallocates = False

    @property
    def warns_steps(self) -> bool:
        """Whether it signals every process of a job's step ahead of its end, the time to save (a Slurm
        allocation's warning before its time limit, restarts.on: [time_limit]): a SIGTERM an attached agent
        gets is that (ran_out)."""
        return False

    def labelling_api(self) -> Any:
        """The cloud API in which podrun labels what it creates, where exec warns of orphans; None elsewhere."""
        return None

    def begin(self) -> None:
        """Start asking what acquire() will need, while the rest of the launch loads (nothing is made)."""

    def acquire(self) -> None:
        """Make what the spec declares and does not exist yet, waiting until it is ready."""

    def lost(self, watch: bool = False) -> str | None:
        """Why the capacity went away (preempted, taken out of service), when it can tell: one line; else
        None. Asked, with backoff, when a worker's connection dropped, before that is reported
        (launch/judgment.py); with `watch`, the cheap read made every WATCH_INTERVAL while run goes on."""
        return None

    def ran_out(self, warned: bool = False) -> str | None:
        """Why the job's workers failed, if the time the capacity was given ran out (a Slurm job's time
        limit): one line; else None. Asked when a worker failed, before the failure is recorded; `warned`:
        when a worker's agent stopped on a SIGTERM where the capacity warns_steps (then also when the limit is
        near)."""
        return None

    def warning_due_s(self) -> float | None:
        """Where an attached job's capacity would warn its steps ahead of its end (warns_steps): how long until
        then, for a detached job's supervisor, whose agents are no steps of the capacity's, to warn the job
        itself; None: never."""
        return None

    def reacquire(self) -> None:
        """Give back what was lost and make it again from the spec (`restarts: {on: [preemption]}`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be made again")

    @property
    def spares_left(self) -> int:
        """How many lost parts replace() can still put a spare in the place of."""
        return 0

    def replace(self, worker: int) -> tuple[str, str | None] | None:
        """Leave out what worker `worker` ran on, lost in an attempt, and put a spare in its place for the next
        attempt: (what was left out, the spare now in its rank, or None where none is left: then `reallocates`
        says whether reacquire() makes capacity without it); None where this capacity has no spares to give (it
        stays as it is)."""
        return None

    def give_back(self) -> None:
        """Give back what the job ran on: when the job ends if it was made for this job alone
        (for_this_job), else as delete_after or `exec --down` say."""

    def give_back_lost(self) -> None:
        """After a loss that ended the job (a preemption): give back what is of no use now, or say how."""

    def give_back_command(self) -> str | None:
        """The command that does what give_back() does, for a user to run; None if there is nothing to give back."""
        return None

    def self_delete_config(self) -> dict | None:
        """What a worker needs to do what give_back() does with its own VM's credentials (remote/self_delete.py's
        config: the API's base URL and the resources' full names); None where nothing may be deleted so."""
        return None
