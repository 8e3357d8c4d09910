"""Hostile output (issue 37, part 6, "Terminal escapes"): what a worker prints reaches the user's terminal
through `exec`, `logs`, `stacks` and a supervisor's relay, and none of it may act on the terminal there:
no window title, no clipboard write (OSC 52), no cleared screen, no cursor moved. Colours (SGR) stay on a
terminal; everything else shows as `less` shows it (`^[`, `<U+009B>`), so the user sees that something
was there; a pipe gets plain text. `--raw` passes the bytes through; the logs keep them as written."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podrun import escapes

from helpers import REPO, examples, job_id_in, podrun, processes_of_job, run_in_terminal, wait_until

# what a hostile (or careless) program prints, a line for each trick, and what each line shows as
HOSTILE = [
    (b"clip \x1b]52;c;cm0gLXJmIH4K\x07 end", "clip ^[]52;c;cm0gLXJmIH4K^G end"),  # OSC 52: writes the clipboard
    (b"title \x1b]0;pwned\x1b\\ end", "title ^[]0;pwned^[\\ end"),  # OSC 0: the window's title
    (b"clear \x1b[2J\x1b[H end", "clear ^[[2J^[[H end"),  # clears the screen, cursor home
    (b"move \x1b[5;10H\x1b[3A end", "move ^[[5;10H^[[3A end"),  # cursor moves: writes over lines shown
    (b"csi8 \xc2\x9b2J end", "csi8 <U+009B>2J end"),  # CSI as a C1 control, in UTF-8
    (b"osc8 \xc2\x9d0;pwned\xc2\x9c end", "osc8 <U+009D>0;pwned<U+009C> end"),  # OSC and ST, C1
    (b"latin1 \x9b2J end", "latin1 <9B>2J end"),  # CSI as one byte, which a terminal not in UTF-8 acts on
    (b"bell\x07 back\x08\x08 lone\x1b end\x7f", "bell^G back^H^H lone^[ end^?"),
    (b"keep\ttabs", "keep\ttabs"),
]
COLOURED = b"\x1b[1;31mred\x1b[0m plain"
PRINTED = b"".join(line + b"\n" for line, _ in HOSTILE) + COLOURED + b"\n"
SCRIPT = f"import sys\nsys.stdout.buffer.write({PRINTED!r})\n"
FAILING = SCRIPT + "sys.exit(3)\n"
SGR = re.compile(rb"\x1b\[[0-9;:]*m")
ERASE_LINE = b"\r\x1b[K"  # podrun's own, on a terminal: its progress line (shipping code) made room for the next
# what a terminal acts on: C0 controls but tab, newline and carriage return (a pty's onlcr makes \n \r\n), DEL, C1
# (and, on a terminal not in UTF-8, the bytes 0x80-0x9f)
ACTED_ON = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f\udc80-\udc9f]")


def safe(shown: bytes, colour: bool) -> str:
    """What the user's terminal received, checked: valid UTF-8, no control it would act on but colours
    (and those only with `colour`: a terminal's) and podrun's own erase of its progress line; its text,
    colours left out."""
    plain = SGR.sub(b"", shown.replace(ERASE_LINE, b"\r") if colour else shown)
    assert colour or plain == shown, shown
    text = plain.decode(errors="surrogateescape")  # a byte that is not UTF-8 shows as \udcXX
    assert not ACTED_ON.search(text), ascii(ACTED_ON.findall(text))
    return text


def assert_shows_every_trick(text: str, prefix: str) -> None:
    lines = text.splitlines()
    for _, visible in HOSTILE:
        assert prefix + visible in lines, (visible, lines)
    assert prefix + "red plain" in lines


def raw_lines(prefix: bytes) -> list[bytes]:
    return [prefix + line for line, _ in HOSTILE] + [prefix + COLOURED]


def job_of(*args) -> str:
    """The id of the job `podrun ARGS` started (its output is not text: bytes that are not UTF-8)."""
    return job_id_in(podrun(*args, text=False).stderr.decode())


def one_worker(job_file, script: str = SCRIPT):
    return job_file("run: python3 hostile.py\ntarget: {local: {workers: 1}}\n", {"hostile.py": script})


def test_exec_at_a_terminal_keeps_colours_and_shows_every_other_escape_harmlessly(home, job_file):
    code, written = run_in_terminal(["exec", one_worker(job_file, FAILING)], rows=40, columns=200)
    assert code == 3, written
    text = safe(written, colour=True)
    assert_shows_every_trick(text.replace("\r\n", "\n"), "[w0] ")
    assert b"\x1b[1;31mred\x1b[0m plain" in written
    # the failure report quotes the worker's last lines: harmless too
    assert "  clip ^[]52;c;cm0gLXJmIH4K^G end" in text


def test_exec_to_a_pipe_is_plain_text_and_the_log_keeps_every_byte(home, job_file):
    result = podrun("exec", one_worker(job_file, FAILING), text=False)
    assert result.returncode == 3, result.stderr
    assert_shows_every_trick(safe(result.stdout, colour=False), "[w0] ")
    assert "  title ^[]0;pwned^[\\ end" in safe(result.stderr, colour=False)
    job_id = job_id_in(result.stderr.decode())
    assert (home / "jobs" / job_id / "w0.log").read_bytes().splitlines() == raw_lines(b"")


def test_exec_raw_passes_the_workers_bytes_through(home, job_file):
    result = podrun("exec", "--raw", one_worker(job_file), text=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == raw_lines(b"[w0] ")


def test_logs_show_a_job_harmlessly_and_logs_raw_as_written(home, job_file):
    job_id = job_of("exec", one_worker(job_file))
    piped = podrun("logs", job_id, text=False)
    assert piped.returncode == 0, piped.stderr
    assert_shows_every_trick(safe(piped.stdout, colour=False), "[w0] ")
    code, written = run_in_terminal(["logs", job_id], rows=40, columns=200)
    assert code == 0, written
    assert_shows_every_trick(safe(written, colour=True).replace("\r\n", "\n"), "[w0] ")
    assert b"\x1b[1;31mred\x1b[0m plain" in written
    raw = podrun("logs", job_id, "--raw", "--worker", "0", text=False)
    assert raw.stdout.splitlines() == raw_lines(b"")


def test_logs_follow_of_a_detached_job_shows_it_harmlessly(home, job_file, tmp_path):
    release = tmp_path / "release"
    script = (f"import os, time\nprint('waiting', flush=True)\n"
              f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n") + SCRIPT
    job_id = job_of("exec", "--detach", one_worker(job_file, script))
    following = subprocess.Popen([sys.executable, "-m", "podrun", "logs", "-f", job_id], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert following.stdout.readline() == b"[w0] waiting\n"
    finally:
        release.touch()
    shown, _ = following.communicate(timeout=60)
    assert following.returncode == 0
    assert_shows_every_trick(safe(shown, colour=False), "[w0] ")


# a Python process of the job whose command line and thread name carry escapes: py-spy shows both, and
# the kernel's view shows the command line
STUCK = ("import threading, time\n"
         "threading.current_thread().name = 'main\\x1b]0;pwned\\x07'\n"
         "print('up', flush=True)\n"
         "time.sleep(600)\n")


@pytest.mark.slow
def test_stacks_show_escapes_in_command_lines_and_thread_names_harmlessly(home, job_file):
    spec = job_file("run: python3 stuck.py \"$(printf 'x\\033]52;c;eA==\\007')\"\ntarget: {local: {workers: 1}}\n",
                    {"stuck.py": STUCK})
    job_id = job_of("exec", "--detach", spec)
    try:
        wait_until(lambda: b"up" in podrun("logs", job_id, text=False).stdout, "the job's first line")
        shown = podrun("stacks", job_id, "--all", text=False)
        assert shown.returncode == 0, shown.stderr
        text = safe(shown.stdout, colour=False)
        assert "stuck.py x^[]52;c;eA==^G ===" in text, text
        if "py-spy dump --pid" in text:
            assert '"main^[]0;pwned^G"' in text, text
        raw = podrun("stacks", job_id, "--all", "--raw", text=False)
        assert b"stuck.py x\x1b]52;c;eA==\x07 ===" in raw.stdout, raw.stdout
        # the saved stacks keep what the worker gave
        assert "x\x1b]52;c;eA==\x07" in (home / "jobs" / job_id / "stacks" / "1" / "w0.txt").read_text()
    finally:
        podrun("stop", job_id)
    assert not processes_of_job(job_id)


@pytest.mark.slow
def test_a_supervised_jobs_output_reaches_the_laptop_harmlessly_unless_raw(home, lab, hosts_spec, supervisor):
    spec = hosts_spec("run: python3 hostile.py\n" + supervisor.spec, hosts=(0,), files={"hostile.py": SCRIPT})
    relayed = podrun("exec", spec, text=False)
    assert relayed.returncode == 0, relayed.stderr
    assert_shows_every_trick(safe(relayed.stdout, colour=False), "[w0] ")
    job_id = job_id_in(relayed.stderr.decode())
    assert supervisor.job_dir(job_id).joinpath("w0.log").read_bytes().splitlines() == raw_lines(b"")
    logs = podrun("logs", job_id, text=False)
    assert_shows_every_trick(safe(logs.stdout, colour=False), "[w0] ")
    raw_logs = podrun("logs", job_id, "--raw", text=False)
    assert raw_logs.stdout.splitlines() == raw_lines(b"[w0] ")
    raw_run = podrun("exec", spec, "--raw", text=False)
    assert raw_run.returncode == 0 and raw_run.stdout.splitlines() == raw_lines(b"[w0] "), raw_run.stderr
    # a supervisor's podrun that prints escapes itself (another version, a host not to be trusted): the
    # laptop shows them harmlessly
    real = supervisor.podrun.read_text()
    supervisor.podrun.write_text("#!/bin/sh\nprintf 'out \\033]52;c;eA==\\007\\n'; printf 'err \\033[2J\\n' >&2\n")
    try:
        hostile = podrun("logs", job_id, text=False)
    finally:
        supervisor.podrun.write_text(real)
    assert safe(hostile.stdout, colour=False) == "out ^[]52;c;eA==^G\n"
    assert "err ^[[2J" in safe(hostile.stderr, colour=False)


def test_report_shows_a_failure_whose_last_exception_line_carries_escapes_harmlessly(home, job_file):
    spec = job_file("run: python3 failing.py\ntarget: {local: {workers: 1}}\n",
                    {"failing.py": "raise ValueError('bad \\x1b]0;pwned\\x07 value')\n"})
    job_id = job_of("exec", spec)
    shown = podrun("report", job_id, text=False)
    assert shown.returncode == 0, shown.stderr
    assert "ValueError: bad ^[]0;pwned^G value" in safe(shown.stdout, colour=False), shown.stdout


def test_an_error_that_quotes_a_hosts_words_is_harmless_too(capsys):
    from podrun.cli import handled
    from podrun.errors import PodrunError

    def failing() -> int:
        raise PodrunError("supervisor host: \x1b]0;pwned\x07 refused")

    assert handled(failing) == 1
    assert capsys.readouterr().err == "podrun: error: supervisor host: ^[]0;pwned^G refused\n"


# --- the module every path goes through (podrun/escapes.py)

@pytest.mark.parametrize("colour", [False, True])
def test_each_trick_shows_as_less_shows_it_and_colour_only_where_wanted(colour):
    for line, visible in HOSTILE:
        assert escapes.shown(line, colour) == visible.encode()
    assert escapes.shown(COLOURED, colour) == (COLOURED if colour else b"red plain")
    assert escapes.shown_text(COLOURED.decode(), colour) == (COLOURED if colour else b"red plain").decode()
    assert escapes.shown(b"a\r\nb\rc", colour) == b"a\r\nb^Mc"  # a lone \r would write over the line
    assert escapes.shown(b"reset \x1bc", colour) == b"reset ^[c"
    text = "caf\u00e9 \u4e2d \u00b5s \U0001f600"  # UTF-8 text passes as it is, C1's lead byte \xc2 included
    assert escapes.shown(text.encode(), colour) == text.encode()


# what a piece of a stream is made of: sequences, their parts, characters and bytes that are not UTF-8
TOKENS = [b"\x1b", b"[", b"31", b";", b"m", b"]0;t", b"\x07", b"\xc2", b"\x9b", b"\xe4\xb8\xad", b"\xe4", b"\r", b"\n",
          b"a", b"\x7f", b"\t"]


@settings(max_examples=examples(300))
@given(st.lists(st.sampled_from(TOKENS), max_size=24), st.lists(st.integers(0, 60), max_size=4), st.booleans())
def test_a_stream_in_any_pieces_shows_as_the_whole_and_nothing_a_terminal_acts_on(tokens, cuts, colour):
    whole = b"".join(tokens)
    stream = escapes.Stream(colour)
    edges = [0, *sorted(min(cut, len(whole)) for cut in cuts), len(whole)]
    shown = b"".join(stream.feed(whole[start:end]) for start, end in zip(edges, edges[1:])) + stream.end()
    assert shown == escapes.shown(whole, colour)
    plain = SGR.sub(b"", shown)
    assert colour or plain == shown
    assert not ACTED_ON.search(plain.decode(errors="surrogateescape"))
    assert b"\r" not in plain.replace(b"\r\n", b"")  # a lone one would write over the line: ^M
