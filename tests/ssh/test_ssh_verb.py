"""`podrun ssh`: a shell on one worker at the user's own terminal (a real PTY: its size, its
resizes, Ctrl-C reaching the remote program), or a command there; podrun's keys and host-key rules."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from helpers import REPO, lab_flags, podrun, wait_until


class Terminal:
    """podrun with stdin, stdout and stderr on a pseudo-terminal of its own, as in a user's shell."""

    def __init__(self, *args: str, rows: int = 30, columns: int = 100):
        self.reader, terminal = pty.openpty()
        self.resize(rows, columns)
        self.process = subprocess.Popen([sys.executable, "-m", "podrun", *args], cwd=REPO, stdin=terminal,
                                        stdout=terminal, stderr=terminal, start_new_session=True,
                                        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(terminal)
        self.shown = ""

    def resize(self, rows: int, columns: int) -> None:
        fcntl.ioctl(self.reader, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

    def type(self, text: str) -> None:
        os.write(self.reader, text.encode())

    def wait_for(self, pattern: str, timeout: float = 30) -> str:
        """What the terminal showed since the last wait, up to the first match of `pattern`."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.shown)):
            assert time.monotonic() < deadline, f"no {pattern!r} on the terminal within {timeout}s; got {self.shown!r}"
            if select.select([self.reader], [], [], 0.1)[0]:
                try:
                    self.shown += os.read(self.reader, 4096).decode(errors="replace")
                except OSError:  # EIO: everything on the terminal has exited
                    raise AssertionError(f"the terminal closed before {pattern!r}; got {self.shown!r}") from None
        seen, self.shown = self.shown[:match.end()], self.shown[match.end():]
        return seen

    def finish(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)


@pytest.mark.slow
def test_a_shell_on_a_host_is_a_real_terminal_that_follows_resizes_and_passes_ctrl_c(home, lab):
    shell = Terminal("ssh", *lab_flags(lab), "--worker", "1")
    # `""` splits each marker in what the terminal echoes of the typed line, so only the output matches
    shell.type("echo on-$(hostname -I | cut -d' ' -f1)-; stty size; tty; echo ma\"\"rk1\n")
    shown = shell.wait_for(r"mark1")
    assert f"on-{lab.hosts[1].ip}-" in shown and "30 100" in shown and "/dev/pts/" in shown
    shell.resize(40, 120)
    shell.type("stty size; echo ma\"\"rk2\n")
    assert "40 120" in shell.wait_for(r"mark2")
    shell.type("sleep 617\n")
    # until sleep is the terminal's foreground process ("+" in its state), a Ctrl-C goes to the shell
    wait_until(lambda: re.search(r"^\S*\+\S*\s+sleep 617$", subprocess.run(
        ["ps", "-o", "stat=,args=", "-C", "sleep"], capture_output=True, text=True).stdout, re.MULTILINE),
        "sleep in the foreground")
    shell.type("\x03")  # the terminal's Ctrl-C: goes to the remote sleep, not to podrun or ssh
    shell.type("echo sleep-ended-\"\"$?\n")
    assert "sleep-ended-130" in shell.wait_for(r"sleep-ended-\d+")  # SIGINT ended it; the shell goes on
    shell.type("exit 3\n")
    assert shell.finish() == 3


def test_a_shell_on_a_local_worker_starts_in_its_directory(home):
    shell = Terminal("ssh", "--local", "2", "--worker", "1")
    shell.type("echo in-$PWD-; tty; exit 5\n")
    assert f"in-{home / 'local' / 'w1'}-" in shell.wait_for(r"/dev/pts/\d+")
    assert shell.finish() == 5


@pytest.mark.slow
def test_a_command_after_the_dashes_runs_on_the_chosen_worker_with_its_exit_code(home, lab):
    result = podrun("ssh", *lab_flags(lab), "--worker", "2", "--", "hostname -I | cut -d' ' -f1; exit 7")
    assert result.returncode == 7, result.stderr
    assert result.stdout.split() == [lab.hosts[2].ip]
    on_a_terminal = Terminal("ssh", *lab_flags(lab), "--", "tty")
    assert re.search(r"/dev/pts/\d+", on_a_terminal.wait_for(r"/dev/pts/\d+"))
    assert on_a_terminal.finish() == 0


@pytest.mark.slow
def test_ssh_keeps_podruns_host_key_rules(home, lab, hosts_spec):
    first = podrun("ssh", *lab_flags(lab, (0,)), "--", "true")
    assert first.returncode == 0, first.stderr
    known_hosts = home / "known_hosts"
    (line,) = known_hosts.read_text().splitlines()  # trusted on first use, in podrun's own file
    assert line.startswith(f"{lab.hosts[0].ip} ssh-ed25519 ")
    assert podrun("exec", hosts_spec("run: echo ok", hosts=(0,))).returncode == 0  # exec agrees with the key ssh kept
    other_key = (lab.hosts[1].dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known_hosts.write_text(f"{lab.hosts[0].ip} {' '.join(other_key)}\n")
    refused = podrun("ssh", *lab_flags(lab, (0,)), "--", "echo reached")
    assert refused.returncode == 255
    assert "reached" not in refused.stdout and "HOST IDENTIFICATION HAS CHANGED" in refused.stderr


@pytest.mark.slow
def test_ssh_reaches_a_tpu_worker_with_the_key_podrun_put_in_its_metadata(home, tpu_api, lab):
    assert podrun("create", "v4-32", "--name", "shell").returncode == 0
    result = podrun("ssh", "--tpu", "shell", "--worker", "3", "--", "hostname -I | cut -d' ' -f1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [lab.hosts[3].ip]


@pytest.mark.parametrize("args, message", [
    (["--local", "2", "--worker", "2"], "--worker 2: this target has workers 0 to 1"),
    ([], "expected a job spec (JOB.yaml) or a target: --tpu, --hosts, --local or --slurm"),
    (["--local", "1", "--hosts", "h"], "--hosts and --local: expected one target"),
])
def test_bad_ssh_arguments_are_one_line(home, args, message):
    result = podrun("ssh", *args)
    assert (result.returncode, result.stderr) == (2, f"podrun: error: {message}\n")
