"""Options before or after the positionals, as gcloud and ssh users write them; `--` ends the options."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from podrun.cli import COMMANDS, parse

from helpers import REPO, podrun

# command: (its positionals, its options: each a flag with its value, if any)
LINES = {
    "create": (["v4-8"], [["--name", "pod"], ["--spot"], ["--zone", "z"], ["--no-wait"]]),
    "list": ([], [["--zone", "z"], ["--project", "p"]]),
    "describe": (["pod"], [["--zone", "z"], ["--project", "p"]]),
    "delete": (["pod"], [["--yes"], ["--zone", "z"]]),
    "exec": (["job.yaml"], [["--detach"], ["--env", "A=1"], ["--worker", "0,1"], ["--restarts", "2"], ["--raw"]]),
    "ssh": (["job.yaml"], [["--worker", "1"], ["--user", "me"]]),
    "cp": (["job.yaml", ":logs", "./logs"], [["-r"], ["--worker", "0"]]),
    "validate": (["job.yaml"], []),
    "schema": ([], []),
    "logs": (["job-1"], [["--worker", "1"], ["-f"], ["--tail", "5"], ["--attempt", "0"], ["--raw"]]),
    "jobs": (["job"], [["--state", "failed"], ["-n", "3"], ["--json"]]),
    "stop": (["job-1"], []),
    "stacks": (["job-1"], [["--worker", "0,2"], ["--all"], ["--raw"]]),
    "report": (["job-1"], []),
    "disk": (["job.yaml"], [["--free"]]),
    "supervisor": (["start"], []),
}


def every_placement(positionals: list[str], options: list[list[str]]):
    """Each option at each place among the positionals (before the first, between, after the last)."""
    for slots in itertools.product(range(len(positionals) + 1), repeat=len(options)):
        line: list[str] = []
        for place in range(len(positionals) + 1):
            line += [word for option, slot in zip(options, slots) if slot == place for word in option]
            line += positionals[place:place + 1]
        yield line


def test_the_table_names_every_command():
    assert set(LINES) == set(COMMANDS)


@pytest.mark.parametrize("command", LINES)
def test_a_command_reads_its_options_in_every_position_alike(command):
    positionals, options = LINES[command]
    options_first = vars(parse([command, *[word for option in options for word in option], *positionals]))
    lines = list(every_placement(positionals, options))
    assert len(lines) == (len(positionals) + 1) ** len(options)
    for line in lines:
        assert vars(parse([command, *line])) == options_first, line


def test_double_dash_ends_the_options_and_exec_keeps_it_for_its_command():
    copy = parse(["cp", "--local", "2", "-r", "--", "-notes.txt", "--worker", ":"])
    assert (copy.paths, copy.recurse, copy.worker) == (["-notes.txt", "--worker", ":"], True, None)
    run = parse(["exec", "--local", "2", "--detach", "--", "python3", "-c", "print(1)", "--worker", "3"])
    assert (run.command, run.detach, run.worker) == (["python3", "-c", "print(1)", "--worker", "3"], True, None)


def test_the_readme_copies_work_with_options_after_the_spec(home, job_file, tmp_path):
    spec = job_file("target: {local: {workers: 2}}\nrun: 'true'\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "step.txt").write_text("step 7\n")
    (tmp_path / "-notes.txt").write_text("notes\n")
    up = podrun("cp", spec, "-r", tmp_path / "logs", ":")
    assert up.returncode == 0, up.stderr
    # a file whose name starts with `-`, given after `--` from its own directory
    dashed = subprocess.run([sys.executable, "-m", "podrun", "cp", spec, "--", "-notes.txt", ":notes.txt"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                            timeout=120)
    assert dashed.returncode == 0, dashed.stderr
    down = podrun("cp", spec, "-r", ":logs", tmp_path / "back")
    assert down.returncode == 0, down.stderr
    assert [(tmp_path / "back" / f"w{index}" / "logs" / "step.txt").read_text() for index in (0, 1)] == ["step 7\n"] * 2
    one = podrun("cp", spec, "--worker", "1", ":notes.txt", tmp_path / "notes-w1.txt")
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "notes-w1.txt").read_text() == "notes\n"


def test_a_bad_option_after_the_positionals_is_still_argparse_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["logs", "job-1", "--tial", "3"])
    assert exit_.value.code == 2
    assert "podrun logs: error: unrecognized arguments: --tial 3" in capsys.readouterr().err
