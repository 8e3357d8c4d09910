"""A detached job that restarts or deletes its capacity, while its supervisor (launch/lifecycle.py), a
process of its own on this machine, watches it: that process keeps the local logs and the record
current, and stops the job, cleaning up as after Ctrl-C, when sent SIGTERM."""

from __future__ import annotations

import os
import time

from podrun import jobstore
from podrun.countdown import Countdown
from podrun.handles.base import POLL_S, JobHandle
from podrun.output import say


class LocalSupervisor(JobHandle):
    def writing(self) -> bool:
        return self.record.current_state() == jobstore.RUNNING and self.record.supervised()

    def notes(self, state: str) -> list[str]:
        return ["supervised"] if state == jobstore.RUNNING else []

    def stop(self) -> int:
        import signal

        self.must_run()
        assert self.record.supervisor is not None
        pid = self.record.supervisor["pid"]
        os.kill(pid, signal.SIGTERM)
        say(f"asked job {self.record.id}'s supervisor (pid {pid}) to stop it; waiting for it to finish")
        with Countdown(self.record.stop_grace_s) as countdown:
            while self.record.supervised():
                countdown.draw()
                time.sleep(POLL_S)
        return self.said_stopped()
