"""The event loop a job's attempts run on, one after another. What an attempt leaves open, its workers'
SSH connections (Transport.reusable), the next attempt on the same workers starts on: a restart in
place neither connects nor ships again (the code's digest is checked over the open connection)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from podrun.transport.base import Transport

Result = TypeVar("Result")


class AttemptLoop:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.kept: list[Transport] = []  # the reusable transports an attempt ran on, open or not

    def run(self, attempt: Coroutine[Any, Any, Result], transports: Iterable[Transport]) -> Result:
        """`attempt` to its end, as asyncio.run would (what it left running is cancelled), keeping the
        connections of `transports` that outlive an attempt."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        self.kept += [transport for transport in transports if transport.reusable and transport not in self.kept]
        before = asyncio.all_tasks(self.loop)
        try:
            return self.loop.run_until_complete(attempt)
        finally:
            self._cancel_left_since(before)

    def close(self, transports: Iterable[Transport] | None = None) -> None:
        """Close the kept connections of `transports` (all, without): their workers are left out or the job is
        done with them. Without, the loop is closed too."""
        closing = [transport for transport in self.kept if transports is None or transport in transports]
        self.kept = [transport for transport in self.kept if transport not in closing]
        if self.loop is None:
            return
        if closing:
            self.loop.run_until_complete(_all_of(transport.close() for transport in closing))
        if transports is None:
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
            self.loop = None

    def _cancel_left_since(self, before: set[asyncio.Task]) -> None:
        assert self.loop is not None
        left = [task for task in asyncio.all_tasks(self.loop) if task not in before and not task.done()]
        for task in left:
            task.cancel()
        if left:
            self.loop.run_until_complete(_all_of(left))


async def _all_of(awaitables: Iterable[Any]) -> None:
    """Every one of `awaitables` awaited on the running loop, whatever each raised."""
    await asyncio.gather(*awaitables, return_exceptions=True)
