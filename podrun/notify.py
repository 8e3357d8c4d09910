"""A job's notifications (the spec's `notify`; docs/notifications.md): one JSON POST per event, sent by
whatever runs the job's lifecycle (launch/lifecycle.py): the attached launcher, a detached job's
supervisor here, a supervisor host's launcher. A detached job that nothing watches is told of by its
worker 0's agent (remote/agent.py); what it got is read with the job's end (launch/detached.py, took()).

Events: an attempt's end (failure, preemption, stall, success: the record's state), restart, and a
straggler named while it runs, each told once. An attempt that restarts tells its end, then the
restart. Messages and their delivery are remote/notice.py's. Each message goes out in a thread of its
own, after the one before it (so they arrive in order), never holding the job; its outcome joins
record.events, saved with the record's next save. A delivery that failed is said in one line. An
ending job waits for the deliveries still under way for DRAIN_S at most, then notes those as not
delivered.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping

from podrun import jobstore, progress
from podrun.errors import SpecError
from podrun.output import masked, say
from podrun.remote import notice

ENDED_AS = {jobstore.FAILED: "failure", jobstore.PREEMPTED: "preemption", jobstore.STALLED: "stall",
            jobstore.SUCCEEDED: "success"}
DRAIN_S = notice.BOUND_S + 2.0  # what an ending job waits, at most, for its last notifications


class Notifier:
    """The notifications of one job: `notify` is the spec's (None: none are sent), its url_env read from this
    process's environment. No message holds a secret the launcher hid (output.hide): each reads ***."""

    def __init__(self, notify):
        self.url = notify.url_in(os.environ) if notify else None
        self.on = set(notify.on) if notify else set()
        self.told: set[tuple[int, str]] = set()  # (attempt, event) sent already
        self.last: threading.Thread | None = None  # the latest delivery, which waits for the one before
        self.under_way: list[dict] = []  # entries whose delivery has not ended
        self.unsaid: list[str] = []  # failed deliveries that a live terminal region kept from being said
        self.lock = threading.Lock()
        self.closed = False

    def restarting(self, record: jobstore.JobRecord, swaps: list[str] | None = None) -> None:
        """The record has just begun its next attempt: tell how the last one ended, then the restart (with the
        hosts it left out and the spares in their place: `swaps`)."""
        ended = record.attempts[-1]
        cause = ENDED_AS.get(ended["state"], ended["state"])
        entry = progress.entry_of(record, ended["attempt"])
        self._send(record, cause, ended["attempt"], ended["state"], ended["summary"], entry["last"] if entry else None,
                   ended.get("cause"))
        self._send(record, "restart", record.attempt, record.state,
                   f"after {cause}: {ended['summary']}" + "".join(f"; {swap}" for swap in swaps or ()),
                   progress.best_before(record, record.attempt))

    def straggling(self, record: jobstore.JobRecord, found: dict) -> None:
        """A straggler was named while the attempt runs (launch/stragglers.py): told once per attempt."""
        self._send(record, "straggler", record.attempt, record.state, found["said"], progress.step_of(record))

    def ended(self, record: jobstore.JobRecord, error: BaseException | None = None) -> None:
        """The job has ended (or failed with `error` between attempts): tell how."""
        state, why = record.state, record.summary
        if state == jobstore.RUNNING and error is not None and not isinstance(error, KeyboardInterrupt):
            state, why = jobstore.FAILED, str(error)
        if state in ENDED_AS:
            self._send(record, ENDED_AS[state], record.attempt, state,
                       why or (notice.ALL_DONE if state == jobstore.SUCCEEDED else None), progress.step_of(record),
                       record.cause)

    def for_workers(self, record: jobstore.JobRecord) -> dict | None:
        """What worker 0's agent of a detached job that nothing here watches needs to tell its end."""
        if not self.url:
            return None
        return {"url": self.url, "on": sorted(self.on), "name": record.name, "attempt": record.attempt}

    def close(self, record: jobstore.JobRecord) -> None:
        """Wait for the deliveries under way, DRAIN_S at most; note those still going as not delivered, say
        the failed ones not said yet, and save the record."""
        if self.last is None:
            return
        self.last.join(DRAIN_S)
        with self.lock:
            self.closed = True
            for entry in self.under_way:
                entry.update(delivered=False, error=f"given up {DRAIN_S:g}s after the job ended, still under way")
                record.events.append(entry)
                self.unsaid.append(_failed_line(entry))
            self.under_way.clear()
        for line in self.unsaid:
            say(line)
        self.unsaid.clear()
        record.save()

    def _send(self, record: jobstore.JobRecord, event: str, attempt: int, state: str, reason: str | None,
              step: int | None, cause: dict | None = None) -> None:
        if not self.url or event not in self.on or (attempt, event) in self.told:
            return
        self.told.add((attempt, event))
        for line in self.unsaid:  # lines the thread could not say while a live region was drawn
            say(line)
        self.unsaid.clear()
        body = notice.message(record.id, record.name, state, event, attempt, step, reason and masked(reason),
                              cause and {**cause, "said": jobstore.cause_brief(cause)})
        entry = notice.entry(body, {"delivered": None, "tries": 0}, self.url, "launcher")
        self.under_way.append(entry)
        self.last = threading.Thread(target=self._deliver, args=(record, body, entry, self.last), daemon=True)
        self.last.start()

    def _deliver(self, record: jobstore.JobRecord, body: dict, entry: dict, before: threading.Thread | None) -> None:
        if before:
            before.join()
        outcome = notice.deliver(self.url, body, tried=lambda tries, error: self._tried(entry, tries))
        with self.lock:
            if self.closed:
                return
            entry.update(outcome, at=round(time.time(), 3))
            self.under_way.remove(entry)
            record.events.append(entry)
            if outcome["delivered"]:
                return
            terminal = sys.modules.get("podrun.terminal")
            if terminal and terminal.Terminal.showing:  # its drawing is the main thread's: said there, later
                self.unsaid.append(_failed_line(entry))
                return
        say(_failed_line(entry))

    def _tried(self, entry: dict, tries: int) -> None:
        with self.lock:
            entry["tries"] = tries  # so that one given up at the job's end says how many tries had ended


def secret_values(spec, extra_env: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """The values of the spec's secrets (secret_env, env's keys that name one, notify.url_env), from env, --env
    or podrun's environment: no message holds them."""
    keys = {*spec.secret_env, *(key for key in {**spec.env, **extra_env} if spec.is_secret(key))}
    if spec.notify and spec.notify.url_env:
        keys.add(spec.notify.url_env)
    given = {**environ, **spec.env, **extra_env}
    return [given[key] for key in keys if given.get(key)]


def url_from_launcher(spec, launcher_env: Mapping[str, str]) -> dict[str, str]:
    """notify.url_env and its value in podrun's environment, which a supervisor host's launcher needs; not
    there, an error before anything starts. Never the job's: no worker's environment holds it."""
    url_env = spec.notify.url_env if spec.notify else None
    if not url_env:
        return {}
    if not launcher_env.get(url_env):
        raise SpecError(spec.path, "notify.url_env", f"{url_env} is not in podrun's environment; export the "
                                                     f"webhook's URL as {url_env} first")
    return {url_env: launcher_env[url_env]}


def took(record: jobstore.JobRecord, entry: dict) -> None:
    """What worker 0's agent recorded of the notification it sent (its notify.json), once in the record; a
    failed one said in one line."""
    if isinstance(entry, dict) and entry not in record.events:
        record.events.append(entry)
        if not entry.get("delivered"):
            say(_failed_line(entry))


def _failed_line(entry: dict) -> str:
    tries = entry.get("tries")
    return (f"notification of {entry.get('event')} (attempt {entry.get('attempt')}) to {entry.get('to')} not "
            f"delivered: {entry.get('error')} ({tries} {'try' if tries == 1 else 'tries'})")
