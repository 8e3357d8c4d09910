"""Identical lines of several workers shown once with their range (`[w0-7] Epoch 3`), on local workers:
what `exec` and `logs` print, what every worker's log keeps, and the order each worker's lines keep."""

from __future__ import annotations

import re
import signal
import time

import pytest

from helpers import Background, job_id_in, podrun, run_in_terminal

LABEL = re.compile(r"^\[((?:w[\d,-]+)?)(?: ?(r[\d,-]+))?\] (.*)$")
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def indexes(ranges: str) -> list[int]:
    """`w0-2,5` (or `r...`) as [0, 1, 2, 5]."""
    found = []
    for part in ranges[1:].split(","):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return found


def per_worker(stdout: str) -> dict[int, list[str]]:
    """Each worker's lines as the collapsed output shows them, in the order it shows them."""
    lines: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        match = LABEL.match(line)
        assert match, f"a line without a worker's label: {line!r}"
        for worker in indexes(match[1]):
            lines.setdefault(worker, []).append(match[3])
    return lines


def local_job(job_file, workers: int, *commands: str):
    """A spec whose `workers` local workers each run the shell commands."""
    return job_file(f"target: {{local: {{workers: {workers}}}}}\nrun: |\n" + "".join(f"  {line}\n" for line in commands))


def logged(home, job_id: str, worker: int) -> bytes:
    return (home / "jobs" / job_id / f"w{worker}.log").read_bytes()


def test_a_line_common_to_all_workers_shows_once_while_every_log_keeps_it(home, job_file):
    spec = local_job(job_file, 8, 'echo "Epoch 3 loss 1.23"', 'echo "worker $PODRUN_WORKER"',
                     "printf '10%%\\r50%%\\r100%%\\n'")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("[w0-7] Epoch 3 loss 1.23") == 1
    assert lines.count("[w0-7] 100%") == 1  # a bar redrawn with \r: one line, its final text
    assert sorted(line for line in lines if "worker" in line) == [f"[w{index}] worker {index}" for index in range(8)]
    assert len(lines) == 10
    job_id = job_id_in(result.stderr)
    for worker in range(8):
        assert logged(home, job_id, worker) == f"Epoch 3 loss 1.23\nworker {worker}\n10%\r50%\r100%\n".encode()
    assert re.search(r"^podrun: job \S+ succeeded", result.stderr, re.MULTILINE)


def test_no_collapse_shows_every_workers_line(home, job_file):
    spec = job_file("target: {local: {workers: 3}}\nrun: echo Epoch 3\n")
    result = podrun("exec", "--no-collapse", spec)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[w0] Epoch 3", "[w1] Epoch 3", "[w2] Epoch 3"]


def test_each_worker_keeps_its_order_when_one_prints_more(home, job_file):
    """Worker 2 prints a warning more than the others: its later lines still join theirs, and its B
    never shows before its A."""
    spec = job_file("""
        target: {local: {workers: 4}}
        run: |
          echo A
          if [ "$PODRUN_WORKER" = 2 ]; then echo warning; fi
          echo B
          if [ "$PODRUN_WORKER" = 3 ]; then echo C; fi
    """)
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[w0-3] A", "[w2] warning", "[w0-3] B", "[w3] C"]


def test_worker_5_printing_a_then_b_while_the_others_print_only_a(home, job_file):
    """B waits for A's window: worker 5's B never shows before its A, which all eight share."""
    spec = local_job(job_file, 8, "echo A", 'if [ "$PODRUN_WORKER" = 5 ]; then echo B; fi')
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[w0-7] A", "[w5] B"]


def test_the_pipe_gets_a_collapsed_line_within_about_a_second_while_the_job_runs(home):
    job = Background("exec", "--local", "4", "--", "echo ready; sleep 60")
    started = time.monotonic()
    try:
        assert job.wait_for(r"^\[w0-3\] ready$", timeout=30)
        assert job.process.poll() is None  # nothing followed it: the window's end sent it
        assert time.monotonic() - started < 20
    finally:
        job.process.send_signal(signal.SIGINT)
        job.finish()
    assert job.lines.count("[w0-3] ready") == 1


def test_a_lone_workers_line_goes_out_when_its_window_ends(home):
    """64 workers, then one alone prints: in a pipe its line waits for the window (collapse.WINDOW_S), no longer."""
    job = Background("exec", "--local", "64", "--",
                     'echo started; if [ "$PODRUN_WORKER" = 5 ]; then sleep 2; echo "only me"; fi; sleep 60')
    try:
        job.wait_for(r"^\[w0-63\] started$")
        shown_at = time.monotonic()
        assert job.wait_for(r"^\[w5\] +only me$", timeout=30)
        assert time.monotonic() - shown_at < 5
        assert job.process.poll() is None
    finally:
        job.process.send_signal(signal.SIGINT)
        job.finish()


def test_ranks_under_torchrun_collapse(home, job_file):
    spec = job_file("""
        target: {local: {workers: 2}}
        run: ranks.py
        torchrun: {nproc_per_node: 2, port: 29623}
    """, files={"ranks.py": "import os\nprint('hello from every rank')\nprint('rank', os.environ['RANK'])\n"})
    result = podrun("exec", spec, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("[w0-1 r0-3] hello from every rank") == 1
    assert sorted(line for line in lines if " rank " in line) == [
        "[w0 r0] rank 0", "[w0 r1] rank 1", "[w1 r2] rank 2", "[w1 r3] rank 3"]
    job_id = job_id_in(result.stderr)
    for worker in range(2):
        log = logged(home, job_id, worker)
        assert log.count(b"hello from every rank") == 2


def test_logs_collapses_every_worker_and_shows_one_worker_unchanged(home, job_file):
    spec = local_job(job_file, 3, 'echo "Epoch 3"', 'echo "worker $PODRUN_WORKER"', "printf 'bar 1\\rbar 2\\n'",
                     "echo done")
    ran = podrun("exec", "--no-collapse", spec)
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    shown = podrun("logs", job_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["[w0-2] Epoch 3", "[w0] worker 0", "[w1] worker 1", "[w2] worker 2",
                                         "[w0-2] bar 2", "[w0-2] done"]
    assert podrun("logs", job_id, "--tail", "1").stdout == "[w0-2] done\n"
    apart = podrun("logs", job_id, "--no-collapse").stdout.splitlines()
    assert apart.count("[w1] Epoch 3") == 1 and len(apart) == 12
    one = podrun("logs", job_id, "--worker", "1", text=False)
    assert one.stdout == b"Epoch 3\nworker 1\nbar 2\ndone\n"


def test_logs_keeps_each_workers_order_whatever_they_printed(home, job_file):
    """Workers printing the same lines in different orders: every worker's lines show, each once and
    in its order (worker 1's A cannot join worker 0's A, which goes out before their B)."""
    spec = job_file("""
        target: {local: {workers: 3}}
        run: |
          case $PODRUN_WORKER in
            0) printf 'A\\nB\\nC\\n' ;;
            1) printf 'B\\nA\\nC\\n' ;;
            2) printf 'A\\nC\\n' ;;
          esac
    """)
    ran = podrun("exec", "--no-collapse", spec)
    job_id = job_id_in(ran.stderr)
    shown = podrun("logs", job_id)
    assert shown.returncode == 0, shown.stderr
    assert per_worker(shown.stdout) == {0: ["A", "B", "C"], 1: ["B", "A", "C"], 2: ["A", "C"]}
    assert shown.stdout.splitlines()[-1] == "[w0-2] C"
    assert len(shown.stdout.splitlines()) == 4


@pytest.mark.parametrize("orders", [
    {0: "AB", 1: "A", 2: "A", 3: "A"},  # the brief's case: worker 0 prints A then B, the others only A
    {0: "AB", 1: "BA"},
    {0: "ABC", 1: "CBA", 2: "BCA", 3: "ACB"},
    {0: "AXBC", 1: "ABYC", 2: "ZABC"},
])
def test_the_order_rule_keeps_every_workers_order(orders):
    """Lines fed in any interleaving come out once each, in each worker's order (collapse.py's rule)."""
    from podrun.collapse import Collapse  # here: the file's other tests run on a tree without it

    for rotation in range(len(orders)):
        workers = list(orders)[rotation:] + list(orders)[:rotation]
        collapse = Collapse(list(orders), clock=lambda: 0.0)
        for position in range(max(map(len, orders.values()))):
            for worker in workers:
                if position < len(orders[worker]):
                    collapse.add((worker, None), orders[worker][position].encode())
        shown: dict[int, str] = {}
        for group in collapse.due(everything=True):
            for worker, _ in group.sources:
                shown[worker] = shown.get(worker, "") + group.text.decode()
        assert shown == orders


def test_a_terminal_shows_the_collapsed_line(home):
    code, written = run_in_terminal(["exec", "--local", "4", "--", "echo Epoch 3; echo worker $PODRUN_WORKER"],
                                    rows=24, columns=100)
    assert code == 0
    screen = ESCAPES.sub("", written.decode(errors="replace")).replace("\r", "")
    assert "[w0-3] Epoch 3\n" in screen
    assert "[w2] worker 2\n" in screen


def test_a_line_whose_window_ended_since_the_last_look_is_due_at_once():
    """The timer that sends a pipe's lines is set from due_in(): a window that ended between due() and
    due_in() must not leave the line waiting for the next output (it waited for the job's end)."""
    from podrun.collapse import Collapse

    now = [0.0]
    collapse = Collapse([0, 1], clock=lambda: now[0])
    collapse.add((0, None), b"before 0")
    now[0] = 0.01
    collapse.add((1, None), b"before 1")
    now[0] = 1.0
    assert [group.text for group in collapse.due()] == [b"before 0"]
    now[0] = 1.02
    assert collapse.due_in() == 0.0
    assert [group.text for group in collapse.due()] == [b"before 1"]
    assert collapse.due_in() is None
