"""Ctrl-C (and `podrun stop`'s SIGTERM) around work whose cleanup must reach Google: the first
interrupt raises KeyboardInterrupt, the ones right after it are held until the cleanup's DELETE is
out, so a user who presses Ctrl-C twice cannot leave a request queued or a TPU billing.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

_held: list[int] = []
_watched: set[int] = set()  # the signals the outermost interruptible_once block handles
_raised: list[int] = []  # the signal that interrupted the outermost block, once one did


def _hold(signum: int, frame) -> None:
    _held.append(signum)


def _raise_once(signum: int, frame) -> None:
    for watched in _watched | {signum}:
        signal.signal(watched, _hold)
    _raised[:] = [signum]
    raise KeyboardInterrupt


def taken() -> int | None:
    """The signal that interrupted the interruptible_once block this runs in, if one did."""
    return _raised[0] if _raised else None


@contextmanager
def interruptible_once(signals: tuple[int, ...] = (signal.SIGINT,)) -> Iterator[None]:
    """The first of `signals` interrupts the block; later ones are held while the interrupt's cleanup
    runs, to the end of the outermost such block (nested blocks keep holding once one was taken)."""
    previous = {signum: signal.getsignal(signum) for signum in signals}
    outermost = not _watched
    _watched.update(signals)
    for signum, handler in previous.items():
        if handler is not _hold:
            signal.signal(signum, _raise_once)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            taken = signal.getsignal(signum) is _hold
            signal.signal(signum, _hold if taken and handler is _raise_once else handler)
        if outermost:
            _watched.clear()
            _raised.clear()
            _held.clear()  # the KeyboardInterrupt they stand for is already on its way


def rearm(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """Inside interruptible_once, after an event loop took `signals` and gave them back at their
    defaults: the first one interrupts again."""
    for signum in signals:
        if signum in _watched:
            signal.signal(signum, _raise_once)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C held off while a request that must reach Google is sent; one held is raised after it."""
    previous = signal.signal(signal.SIGINT, _hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is _hold else previous)
        if _held:
            _held.clear()
            raise KeyboardInterrupt
