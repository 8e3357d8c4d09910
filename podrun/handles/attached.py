"""An attached job: it lives in its launcher, a `podrun exec` on this machine, which writes its logs and
record, and stops it as on Ctrl-C when sent SIGTERM."""

from __future__ import annotations

import os
import time

from podrun import jobstore
from podrun.countdown import Countdown
from podrun.errors import PodrunError
from podrun.handles.base import POLL_S, JobHandle

LAUNCHER_STOP_MARGIN_S = 15  # the launcher needs the job's grace period, the KILL, and a little


class Attached(JobHandle):
    def stop(self) -> int:
        import signal  # here, not at the top: `podrun jobs` and `podrun logs` start faster without it

        self.must_run()
        record = self.record
        if "pid" not in record.launcher:  # its identity comes from /proc, which only Linux has
            raise PodrunError(f"job {record.id}: its launcher cannot be found on this system (stopping an attached "
                              f"job needs Linux's /proc); press Ctrl-C where it runs")
        os.kill(record.launcher["pid"], signal.SIGTERM)  # its launcher stops every worker, as on Ctrl-C
        wait_s = record.stop_grace_s + LAUNCHER_STOP_MARGIN_S
        deadline = time.monotonic() + wait_s
        with Countdown(record.stop_grace_s) as countdown:
            while self.reload().current_state() == jobstore.RUNNING:
                if time.monotonic() > deadline:
                    raise PodrunError(f"job {record.id}: its launcher (pid {record.launcher['pid']}) did not stop "
                                      f"it within {wait_s:g}s")
                countdown.draw()
                time.sleep(POLL_S)
        return self.said_stopped()
