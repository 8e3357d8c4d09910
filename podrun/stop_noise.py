"""What torchrun prints when podrun stops it, kept from the terminal: on SIGTERM its elastic agent raises
SignalException and Python prints the traceback, about 30 lines from every worker, for a stop the user
asked for (`Ctrl-C`). Once a stop was sent, a worker's traceback that ends in that exception is left out
of the terminal and one line says where it is; any other traceback shows whole. The log keeps every byte."""

from __future__ import annotations

import re

TRACEBACK = b"Traceback (most recent call last):"
STOPPED_TORCHRUN = re.compile(rb"torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: "
                              rb"Process \d+ got signal: \d+")
LEFT_OUT = b"(torchrun's traceback of the stop left out here; `podrun logs` has it)"
MAX_HELD_LINES = 500  # a traceback longer than this shows as it stands


class StopNoise:
    def __init__(self) -> None:
        self.stopping = False
        self.held: list[bytes] | None = None  # a traceback's lines so far, once one began during the stop

    def take(self, line: bytes) -> list[bytes]:
        """The lines to show now for `line` (a worker's own, without its newline): none while a traceback is held."""
        if self.held is None:
            if self.stopping and line.rstrip() == TRACEBACK:
                self.held = [line]
                return []
            return [line]
        if line.startswith((b" ", b"\t")) and len(self.held) < MAX_HELD_LINES:
            self.held.append(line)
            return []
        held, self.held = self.held, None
        return [LEFT_OUT] if STOPPED_TORCHRUN.match(line) else [*held, line]

    def rest(self) -> list[bytes]:
        """What is held when the stream ends: shown as it stands."""
        held, self.held = self.held or [], None
        return held
