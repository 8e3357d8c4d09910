"""Validation catches what a user gets wrong, before anything starts: a script that is not in the workdir,
`python` under torchrun, keys given twice, every problem at once in podrun's words; enums in any case;
stop_grace."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from podrun.spec.loading import load_spec
from podrun.spec.messages import EXPECTED, NAME_RULES
from podrun.spec.model import JobSpec, parse_stop_grace
from podrun.spec.problems import _model_in

from helpers import PYDANTIC_WORDS, podrun, run_cli, stderr_lines_without_traceback

NEAR_MISSES = [  # (run, torchrun?, the script named in the message, what it suggests)
    ("trian.py", False, "trian.py", "train.py"),
    ("python3 trian.py --steps 5", False, "trian.py", "train.py"),
    ("python -u trian.py", False, "trian.py", "train.py"),
    ("/usr/bin/python3.11 -W ignore trian.py", False, "trian.py", "train.py"),
    ("OMP_NUM_THREADS=1 python3 trian.py", False, "trian.py", "train.py"),
    ("trian.py --steps 5", True, "trian.py", "train.py"),
    ("python3 tools/evall.py", False, "tools/evall.py", "tools/eval.py"),
    ("./run-al.sh", False, "./run-al.sh", "./run-all.sh"),
]


# exec makes validate's checks again: slow, so that the fast tier runs each once
@pytest.mark.parametrize("command", ["validate", pytest.param("exec", marks=pytest.mark.slow)])
@pytest.mark.parametrize("run, torchrun, script, nearest", NEAR_MISSES, ids=[case[0] for case in NEAR_MISSES])
def test_a_script_not_in_the_workdir_is_named_with_the_nearest_file(home, job_file, tmp_path, command, run,
                                                                    torchrun, script, nearest):
    spec = job_file(f"run: {run}\n" + ("torchrun: {nproc_per_node: 1}\n" if torchrun else ""),
                    files={"train.py": "", "tools/eval.py": "", "run-all.sh": ""})
    result = podrun(command, spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: run: {script} is not in the workdir ({tmp_path / 'code'}); did you mean {nearest}?"]
    assert not home.exists()  # nothing started


@pytest.mark.parametrize("run, setup", [
    ("python3 -m torch.distributed.run --help", None),  # a module: installed ones are not in the workdir
    ("python3 -c 'import train'", None),
    ("cd tools && python3 eval.py", None),  # shell syntax: not guessed at
    ("python3 absent.py | tee log", None),
    ("python3 $SCRIPT", None),
    ("/opt/tools/absent.py", None),  # absolute: on the worker, not in the workdir
    ("python3 'unbalanced.py", None),
    ("python3 fetched.py", "curl -o fetched.py https://example.com/fetched.py"),  # setup makes it
    ("python3 tools/eval.py --x 'a b'", None),
    ("nvidia-smi", None),
])
def test_commands_that_name_no_missing_file_are_valid(home, job_file, run, setup):
    spec = job_file(f"run: {run}\n" + (f"setup: {setup}\n" if setup else ""), files={"tools/eval.py": ""})
    result = podrun("validate", spec)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("run, fix", [
    ("python train.py --lr 0.1", "drop it: run: train.py --lr 0.1"),
    ("python3 -u train.py", "drop it: run: train.py"),
    ("/usr/bin/python3 train.py", "drop it: run: train.py"),
    ("python3 -m trainer", "drop it and name the script"),
])
def test_python_under_torchrun_says_torchrun_starts_python_itself(home, job_file, run, fix):
    spec = job_file(f"run: {run}\ntorchrun: {{nproc_per_node: 2}}\n", files={"train.py": ""})
    interpreter = run.split()[0]
    for command in ("validate", "exec"):
        result = podrun(command, spec)
        assert result.returncode == 2
        assert stderr_lines_without_traceback(result.stderr) == [
            f"podrun: error: {spec}: run: with torchrun, run is the script and its arguments: torchrun starts Python "
            f"itself, so it would run {interpreter!r} as the script; {fix}"]
    assert not home.exists()


def test_a_key_given_twice_at_any_level_names_both_lines(home, job_file):
    spec = job_file("""\
        run: python3 train.py
        env:
          WANDB_MODE: offline
          LR: 0.1
          WANDB_MODE: online
        target: {local: {workers: 2, workers: 3}}
        run: python3 eval.py
        """, files={"train.py": "", "eval.py": ""})
    result = podrun("exec", spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: env.WANDB_MODE: given twice, on line 3 and line 5; keep one",
        f"{spec}: target.local.workers: given twice, on line 6; keep one",
        f"{spec}: run: given twice, on line 1 and line 7; keep one"]
    assert not home.exists()


def test_a_merged_key_may_be_given_again(home, job_file):
    spec = job_file("""\
        run: echo
        env: {<<: {WANDB_MODE: offline, LR: "0.1"}, LR: "0.2"}
        """)
    result = podrun("exec", spec, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("export LR=0.2\n") == 2 and "export WANDB_MODE=offline\n" in result.stdout


def test_every_problem_is_listed_one_line_each(home, job_file):
    spec = job_file("""\
        name: my job
        target: {tpu: my-pod}
        run: echo
        device: gpu
        env: {MY-VAR: 1, OK: [a]}
        """)
    result = podrun("validate", spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: name: 'my job' is not a valid name: use letters, digits, '.', '_' and '-', "
        f"starting with a letter or digit",
        f"{spec}: target.tpu: expected a mapping such as {{name: my-pod, zone: us-central2-b}}, got 'my-pod'",
        f"{spec}: env.MY-VAR: 'MY-VAR' is not a variable name: use letters, digits and '_', not starting with a digit",
        f"{spec}: env.OK: expected a string or number, got a list",
        f"{spec}: device: expected TPU, CUDA, ROCM or CPU (in any case), got 'gpu'"]


def test_a_zone_the_table_does_not_list_for_the_type_is_one_warning_and_the_spec_loads(home, job_file):
    """The README's zones example: no type is in podrun's table for both zones, but Google adds zones, so
    podrun warns in one line and asks there all the same; zone_wait asks through the queue."""
    spec = job_file("run: echo\ntarget:\n  tpu: {name: p, accelerator_type: v4-8, iap: true, "
                    "zones: [us-central2-b, us-east5-a], zone_wait: 30m}\n")
    result = podrun("validate", spec)
    assert result.returncode == 0, result.stderr
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: {spec}: target.tpu.zones: v4-8 is not in us-east5-a by podrun's table, which lists us-central2-b "
        f"for v4 (Google's TPU regions and zones, as of 2026-11-27; Google adds zones): podrun asks there all the "
        f"same, and the API's answer decides",
        f"podrun: {spec}: valid; job 'job' on the TPU VM p (v4-8, created if missing)"]
    options = load_spec(spec).target.options
    assert options.zone_order == ["us-central2-b", "us-east5-a"] and options.queued and options.zone_wait_s == 1800
    listed = job_file("run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, zones: [us-east5-a, us-central1-a]}}\n")
    quiet = podrun("validate", listed)
    assert quiet.returncode == 0 and stderr_lines_without_traceback(quiet.stderr) == [
        f"podrun: {listed}: valid; job 'job' on the TPU VM p (v5p-8, created if missing)"]


def test_enums_are_read_in_any_case(home, job_file):
    spec = job_file("run: train.py\ndevice: cpu\ntorchrun: {nproc_per_node: AUTO}\n", files={"train.py": ""})
    result = podrun("exec", spec, "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("export PJRT_DEVICE=CPU") == 2
    assert sum("--nproc_per_node=auto " in line for line in lines) == 2


def field_shapes(model=JobSpec, prefix: str = "") -> list[str]:
    """Every field of the spec, nested ones included, as the error tables name them."""
    shapes = []
    for name, field in model.model_fields.items():
        shape = prefix + (field.alias or name)
        shapes.append(shape)
        nested = _model_in(field.annotation)
        if nested is not None:
            shapes += field_shapes(nested, shape + ".")
    return shapes


def test_every_field_says_what_it_expects():
    described = set(EXPECTED) | set(NAME_RULES)
    assert [shape for shape in field_shapes() if shape not in described] == []


WRONG_VALUES = [5, -1, 0.5, "x", "", True, None, [], [1, {"a": 1}], {"a": 1}, {}]


def set_at(spec: dict, shape: str, value: object) -> dict:
    node = spec
    *parents, last = shape.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return spec


@pytest.mark.parametrize("shape", field_shapes())
def test_wrong_values_get_podrun_words_naming_the_field(tmp_path, shape):
    for value in WRONG_VALUES:
        spec = set_at({"run": "echo"}, shape, value)
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(spec))
        code, stderr = run_cli("validate", str(path))
        if code == 0:
            continue
        lines = stderr.splitlines()
        assert code == 2 and lines[0].startswith("podrun: error: "), stderr
        assert all(line.removeprefix("podrun: error: ").startswith(f"{path}: ") for line in lines), stderr
        assert not PYDANTIC_WORDS.search(stderr), stderr
        top = shape.split(".")[0]
        assert any(re.match(rf"{re.escape(f'{path}: {top}')}[.:]", line.removeprefix("podrun: error: "))
                   for line in lines), stderr


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("2m", 120), ("90", 90), ("1m30s", 90), ("1h", 3600),
                                           ("2.5", 2.5), ("0s", 0), (" 45s ", 45), ("1h0m0s", 3600), (90, 90)])
def test_stop_grace_and_the_grace_flag_take_durations(text, seconds):
    assert parse_stop_grace(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "30 s", "-5", "1d", "5m1h", "nan", "inf", "1e3", "thirty", "1h0m5s",
                                  "2h", float("nan"), True])
def test_stop_grace_refuses_what_is_no_duration_up_to_an_hour(text):
    with pytest.raises(ValueError) as raised:
        parse_stop_grace(text)
    assert str(raised.value).startswith("expected a duration from 0s to 1h such as 30s, 2m, 90 (seconds) or 1m30s, got ")


@pytest.mark.parametrize("stop_grace, seconds", [(None, 30.0), ("1m30s", 90.0), (90, 90.0), ("0", 0.0)])
def test_stop_grace_reaches_the_job_record(home, job_file, stop_grace, seconds):
    spec = job_file("run: echo ran\n" + (f"stop_grace: {stop_grace}\n" if stop_grace is not None else ""))
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert job["stop_grace_s"] == seconds


@pytest.mark.parametrize("stop_grace", ["2h", "-5", "61m", ".inf", ".nan", "true", "[30s]", "30 sec"])
def test_stop_grace_outside_0s_to_1h_is_one_line(home, job_file, stop_grace):
    spec = job_file(f"run: echo ran\nstop_grace: {stop_grace}\n")
    result = podrun("exec", spec)
    assert result.returncode == 2
    (line,) = stderr_lines_without_traceback(result.stderr)
    assert line.startswith(f"podrun: error: {spec}: stop_grace: expected a duration from 0s to 1h such as 30s, 2m, "
                           f"90 (seconds) or 1m30s, got ")
    assert not home.exists()
