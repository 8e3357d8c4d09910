"""A stop's countdown, the one every stop shows (Ctrl-C in `exec`, `podrun stop` of any job): said once
as the stop begins (how long the job's processes get before SIGKILL), then drawn on the terminal's live
line, if it is one, as the grace period runs out, and taken away at the end."""

from __future__ import annotations

import sys
import time

from podrun.output import grace_announcement, grace_left, say
from podrun.terminal import Terminal


class Countdown:
    def __init__(self, grace_s: float, terminal: Terminal | None = None):
        say(grace_announcement(grace_s))
        self.grace_s = grace_s
        self.terminal = terminal or Terminal(sys.stderr.buffer, prefixed=False)
        self.ends_at = time.monotonic() + grace_s
        self.starts_over = False

    def again(self) -> None:
        """The grace period starts over at the next drawing: a detached job's first worker gets its own once
        the others have stopped (launch/detached.py)."""
        self.starts_over = True

    def draw(self) -> None:
        if self.starts_over:
            self.starts_over = False
            self.ends_at = time.monotonic() + self.grace_s
        self.terminal.show_status(grace_left(self.ends_at))

    def close(self) -> None:
        self.terminal.show_status(None)

    def __enter__(self) -> Countdown:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    async def run(self) -> None:
        """Drawn once a second until cancelled, which takes it away."""
        import asyncio  # here: a stop of an attached job (`podrun stop`) runs without asyncio

        with self:
            while True:
                self.draw()
                await asyncio.sleep(1)
