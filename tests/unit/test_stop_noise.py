"""torchrun's traceback of a stop podrun sent is left off the terminal (podrun/stop_noise.py); any other
traceback, and anything before the stop, shows whole."""

from __future__ import annotations

import io

from podrun.stop_noise import LEFT_OUT
from podrun.terminal import Terminal
from podrun.worker_output import WorkerOutput

TORCHRUN_ON_SIGTERM = b"""\
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 26180 got signal: 15
"""
OWN_ERROR = b"""\
Traceback (most recent call last):
  File "train.py", line 3, in <module>
    save()
OSError: [Errno 28] No space left on device
"""


def shown(data: bytes, stopping: bool, log: io.BytesIO | None = None) -> str:
    screen = io.BytesIO()
    output = WorkerOutput(0, Terminal(screen, prefixed=False), log)
    output.feed(b"saving\n")
    if stopping:
        output.stopping()
    output.feed(data)
    output.close()
    return screen.getvalue().decode()


def test_torchruns_traceback_of_a_stop_is_one_line_and_the_log_keeps_it():
    log = io.BytesIO()
    assert shown(TORCHRUN_ON_SIGTERM, stopping=True, log=log) == f"saving\n{LEFT_OUT.decode()}\n"
    assert log.getvalue() == b"saving\n" + TORCHRUN_ON_SIGTERM


def test_any_other_traceback_during_a_stop_shows_whole():
    assert shown(OWN_ERROR, stopping=True) == "saving\n" + OWN_ERROR.decode()


def test_without_a_stop_torchruns_traceback_shows_whole():
    assert shown(TORCHRUN_ON_SIGTERM, stopping=False) == "saving\n" + TORCHRUN_ON_SIGTERM.decode()


def test_a_traceback_the_stream_ends_in_shows_as_it_stands():
    cut = b"".join(TORCHRUN_ON_SIGTERM.splitlines(keepends=True)[:3])
    assert shown(cut, stopping=True) == "saving\n" + cut.decode()
