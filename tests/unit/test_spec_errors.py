"""Bad input: one line on stderr naming the file, the field and what is expected; exit 2; nothing started."""

from __future__ import annotations

import json

import pytest

from helpers import REPO, podrun, run_cli, stderr_lines_without_traceback

BAD_SPECS = [
    ("not YAML", "run: [echo\n", r"{file}: line 2, column 1: not valid YAML: "),
    ("not a mapping", "- run: echo\n", r"{file}: expected a mapping of job fields (run, target, ...), got a list"),
    ("unknown top-level field", "run: echo\nsetpu: pip install x\n", "{file}: setpu: unknown field; did you mean 'setup'?"),
    ("unknown nested field", "run: echo\ntarget: {local: {wrokers: 2}}\n",
     "{file}: target.local.wrokers: unknown field; did you mean 'workers'?"),
    ("wrong type", "run: echo\ntarget: {local: {workers: two}}\n",
     "{file}: target.local.workers: expected a number of workers from 1 to 1024, got 'two'"),
    ("out of range", "run: echo\ntorchrun: {port: 70000}\n",
     "{file}: torchrun.port: expected a port number from 1 to 65535, got 70000"),
    ("no run", "setup: echo\n", "{file}: run: required field is missing; expected the command to run, such as "
                                 "python3 train.py (with torchrun: the script and its arguments)"),
    ("bad nproc_per_node", "run: echo\ntorchrun: {nproc_per_node: zero}\n",
     "{file}: torchrun.nproc_per_node: expected a number of processes >= 1, or auto, gpu or cpu, got 'zero'"),
    ("two targets", "run: echo\ntarget: {local: {workers: 2}, hosts: [a, b]}\n",
     "{file}: target: expected exactly one of tpu, hosts, local, slurm (got hosts and local)"),
    ("missing workdir", "run: echo\nworkdir: nowhere\n",
     "{file}: workdir: expected an existing directory, {dir}/nowhere is not one"),
    ("workdir in no user's home", "run: echo\nworkdir: ~no-such-user/code\n",
     "{file}: workdir: expected an existing directory, ~no-such-user/code is no user's home here"),
    ("env value a list", "run: echo\nenv: {FLAGS: [a, b]}\n", "{file}: env.FLAGS: expected a string or number, got a list"),
    ("env value a boolean", "run: echo\nenv: {DEBUG: yes}\n",
     "{file}: env.DEBUG: expected a string or number, got a boolean (quote it)"),
    ("env key podrun sets", "run: echo\nenv: {PODRUN_WORKER: 3}\n",
     "{file}: env.PODRUN_WORKER: set by podrun on every worker (see `podrun exec --dry-run`); remove it from env"),
    ("bad device", "run: echo\ndevice: GPU\n", "{file}: device: expected TPU, CUDA, ROCM or CPU (in any case), got 'GPU'"),
    ("NUL in workdir", 'run: echo\nworkdir: "\\0"\n',
     "{file}: workdir: holds a NUL byte, which no path, command or variable can"),
    ("NUL in identity_file", 'run: echo\nssh: {identity_file: "/k\\0"}\n',
     "{file}: ssh.identity_file: holds a NUL byte, which no path, command or variable can"),
    ("hosts with nothing", "run: echo\ntarget: {hosts: }\n",
     "{file}: target.hosts: expected a list of hosts (host, user@host, host:port or user@host:port), got nothing"),
    ("tpu with nothing", "run: echo\ntarget:\n  tpu:\n",
     "{file}: target.tpu: expected the TPU VM's fields (at least name), got nothing"),
    ("nested thousands deep", "run: echo\nenv: " + "[" * 5000 + "]" * 5000 + "\n",
     "{file}: nested too deeply to be a job spec"),
    ("lone surrogate in an env value", 'run: echo\nenv: {A: "\\ud800"}\n',
     "{file}: env.A: holds a lone surrogate character, which no path, command or variable can"),
    ("run given twice", "run: echo\nsetup: make\nrun: echo 2\n", "{file}: run: given twice, on line 1 and line 3; keep one"),
    ("script not in the workdir", "run: python3 trian.py --steps 5\n",
     "{file}: run: trian.py is not in the workdir ({dir})"),
    ("python under torchrun", "run: python -u train.py --lr 0.1\ntorchrun: {nproc_per_node: 2}\n",
     "{file}: run: with torchrun, run is the script and its arguments: torchrun starts Python itself, so it would run "
     "'python' as the script; drop it: run: train.py --lr 0.1"),
    ("name with a space", "name: my job\nrun: echo\n",
     "{file}: name: 'my job' is not a valid name: use letters, digits, '.', '_' and '-', starting with a letter or digit"),
    ("tpu not a mapping", "run: echo\ntarget: {tpu: my-pod}\n",
     "{file}: target.tpu: expected a mapping such as {{name: my-pod, zone: us-central2-b}}, got 'my-pod'"),
    ("zone and zones",
     "run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, zone: us-east5-a, zones: [us-east5-a]}}\n",
     "{file}: target.tpu: zone and zones exclude each other: list every zone in zones, the first is tried first"),
    ("a zone of no zone's shape",
     "run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, zones: [us-east5-a, us-central1]}}\n",
     "{file}: target.tpu.zones.1: expected a zone such as us-east5-a (a region and a letter), got 'us-central1'"),
    ("recreate slice without slices",
     "run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, recreate: slice}}\n",
     "{file}: target.tpu: recreate: slice makes the slices of a multislice again one by one: set slices too"),
    ("recreate of no known kind",
     "run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, slices: 2, recreate: node}}\n",
     "{file}: target.tpu.recreate: expected all (the multislice is one queued resource) or slice (each slice its "
     "own, made again alone), got 'node'"),
    ("zone_wait without zones",
     "run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, queued: true, zone_wait: 30m}}\n",
     "{file}: target.tpu: zone_wait is how long a queued request waits in one of zones: set zones too"),
    ("bad zone_wait", "run: echo\ntarget: {tpu: {name: p, accelerator_type: v5p-8, queued: true, zones: [us-east5-a], "
     "zone_wait: soon}}\n",
     "{file}: target.tpu.zone_wait: expected a duration above 0 such as 30m, 6h or 1h30m, got 'soon'"),
    ("zones without a type", "run: echo\ntarget: {tpu: {name: p, zones: [us-east5-a]}}\n",
     "{file}: target.tpu: zones are where podrun creates the TPU VM, which needs accelerator_type (e.g. v4-8); a TPU "
     "VM that exists is in one zone: give it as zone"),
    ("env a list", "run: echo\nenv: [A=1]\n",
     "{file}: env: expected a mapping of variable names to values, such as {{WANDB_MODE: offline}}, got a list"),
    ("env key no variable name", "run: echo\nenv: {MY-VAR: 1}\n",
     "{file}: env.MY-VAR: 'MY-VAR' is not a variable name: use letters, digits and '_', not starting with a digit"),
    ("stop_grace over an hour", "run: echo\nstop_grace: 2h\n",
     "{file}: stop_grace: expected a duration from 0s to 1h such as 30s, 2m, 90 (seconds) or 1m30s, got '2h'"),
    ("stall not a duration", "run: echo\nstall: soon\n",
     "{file}: stall: expected a duration above 0 such as 15m, 90 (seconds) or 1h30m, or auto (with progress), got 'soon'"),
    ("progress without a group for the step", "run: echo\nprogress: 'step \\d+'\n",
     "{file}: progress.pattern: expected a regular expression whose first group is the step, such as "
     "'step (\\d+)', got 'step \\\\d+', which has no group (...) for the step"),
    ("progress with a named group that is neither epoch nor step", "run: echo\nprogress: 'Epoch (?P<ep>\\d+): (\\d+)'\n",
     "{file}: progress.pattern: expected no named group but epoch and step, as in "
     "'Epoch (?P<epoch>\\d+):.*?(?P<step>\\d+)/\\d+', got 'Epoch (?P<ep>\\\\d+): (\\\\d+)', whose group 'ep' is "
     "neither (did you mean 'epoch'?)"),
    ("progress with an epoch group and none for the step", "run: echo\nprogress: 'Epoch (?P<epoch>\\d+):'\n",
     "{file}: progress.pattern: expected a group for the step besides the epoch's, as in "
     "'Epoch (?P<epoch>\\d+):.*?(\\d+)/\\d+', got 'Epoch (?P<epoch>\\\\d+):', which has only the epoch's"),
    ("progress both a pattern and a file", "run: echo\nprogress: {pattern: 'step (\\d+)', file: s.txt}\n",
     "{file}: progress: expected a regular expression whose first group is the step, such as 'step (\\d+)', "
     "or {{file: PATH}}"),
    ("idle_delete not a duration", "run: echo\nidle_delete: soon\n",
     "{file}: idle_delete: expected a duration above 0 such as 2h, 30m or 90 (seconds), got 'soon'"),
    ("idle_delete of nothing podrun creates", "run: echo\nidle_delete: 2h\n",
     "{file}: idle_delete: deletes a TPU VM that podrun creates, but the target is local: remove it"),
    ("idle_delete of a TPU the spec only names", "run: echo\nidle_delete: 2h\ntarget: {tpu: {name: p}}\n",
     "{file}: idle_delete: deletes a TPU VM that podrun creates: it needs target.tpu.accelerator_type"),
    ("stall auto without progress", "run: echo\nstall: auto\n",
     "{file}: stall: auto needs progress (the job's step) to measure its step time; add progress: 'step (\\d+)' "
     "or give a duration such as 15m"),
    ("until_no_progress without progress", "run: echo\nrestarts: {max: 3, until_no_progress: 2}\n",
     "{file}: restarts: until_no_progress needs progress (the job's step): add progress: 'step (\\d+)'"),
    ("notify to no http URL", "run: echo\nnotify: {url: 'ftp://hooks'}\n",
     "{file}: notify.url: expected an http:// or https:// URL, got 'ftp://hooks'"),
    ("notify with no URL", "run: echo\nnotify: {on: [failure]}\n",
     "{file}: notify: expected url (an http:// or https:// URL) or url_env (the variable of podrun's environment "
     "that holds it), not both"),
    ("notify with both URLs", "run: echo\nnotify: {url: 'http://h/x', url_env: HOOK}\n",
     "{file}: notify: expected url (an http:// or https:// URL) or url_env (the variable of podrun's environment "
     "that holds it), not both"),
    ("notify's url_env not a variable", "run: echo\nnotify: {url_env: 'hook-url'}\n",
     "{file}: notify.url_env: 'hook-url' is not a variable name: use letters, digits and '_', not starting with a "
     "digit"),
    ("notify on an event podrun does not send", "run: echo\nnotify: {url: 'http://h/x', on: [hang]}\n",
     "{file}: notify.on.0: expected failure, preemption, stall, restart, success or straggler, got 'hang'"),
    ("cost per hour not above 0", "run: echo\ncost: {per_hour: 0}\n",
     "{file}: cost.per_hour: expected a price per hour above 0, such as 12.5, got 0"),
    ("restarts on a cause podrun does not know", "run: echo\nrestarts: {on: [hang]}\n",
     "{file}: restarts.on.0: expected preemption, failure, stall, time_limit, or a failure's class: oom, collective, "
     "hardware, config, exception, signal, lost or unknown, got 'hang'"),
    ("time_limit restarts off Slurm", "run: echo\nrestarts: {on: [time_limit]}\n",
     "{file}: restarts.on: time_limit continues a Slurm job on a new allocation, but the target is local: remove it"),
    ("supervisor host not a host", "run: echo\nsupervisor: {host: 'a b'}\n",
     "{file}: supervisor.host: expected host, user@host, host:port or user@host:port, got 'a b'"),
    ("supervisor field misspelt", "run: echo\nsupervisor: {host: vm, podrn: /opt/podrun}\n",
     "{file}: supervisor.podrn: unknown field; did you mean 'podrun'?"),
    ("supervisor podrun not a path", "run: echo\nsupervisor: {host: vm, podrun: [x]}\n",
     "{file}: supervisor.podrun: expected the path of podrun on the supervisor host, such as /opt/podrun/bin/podrun, "
     "got a list"),
    ("supervisor not a mapping", "run: echo\nsupervisor: vm\n",
     "{file}: supervisor: expected a mapping such as {{host: me@supervisor-vm, podrun: /opt/podrun/bin/podrun}}, "
     "got 'vm'"),
]


# exec makes validate's checks again: slow, so that the fast tier runs each once
@pytest.mark.parametrize("command", [pytest.param("exec", marks=pytest.mark.slow), "validate"])
@pytest.mark.parametrize("case, text, expected", BAD_SPECS, ids=[case[0] for case in BAD_SPECS])
def test_bad_spec_is_one_line_and_exit_2(home, tmp_path, command, case, text, expected):
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    result = podrun(command, spec)
    assert result.returncode == 2
    (line,) = stderr_lines_without_traceback(result.stderr)
    expected_line = "podrun: error: " + expected.format(file=spec, dir=tmp_path)
    if case == "not YAML":  # the YAML parser's own wording follows
        assert line.startswith(expected_line) and len(line) > len(expected_line)
    else:
        assert line == expected_line
    assert result.stdout == ""
    assert not home.exists()  # no job, no worker directory: nothing started


def test_missing_spec_file(home, tmp_path):
    result = podrun("exec", tmp_path / "absent.yaml")
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [f"podrun: error: {tmp_path / 'absent.yaml'}: no such file"]


def test_bad_command_line_values(home, job_file):
    spec = job_file("run: echo\n")
    for args, expected in [
        (["--worker", "5"], "podrun: error: --worker '5': this target has workers 0 to 1"),
        (["--worker", "x"], "podrun: error: --worker 'x': expected 'all' or indexes like 0,2-3"),
        (["--env", "NOVALUE"], "podrun: error: --env 'NOVALUE': expected KEY=VALUE with KEY a variable name"),
    ]:
        result = podrun("exec", spec, *args)
        assert result.returncode == 2
        assert stderr_lines_without_traceback(result.stderr) == [expected]
    assert not (home / "jobs").exists()


def test_secret_env_missing_from_env_and_environment(home, job_file):
    spec = job_file("run: echo\nsecret_env: [HF_TOKEN]\n")
    result = podrun("exec", spec, env={"PATH": "/usr/bin:/bin", "PODRUN_HOME": str(home)})
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: secret_env.0: HF_TOKEN is neither set in env nor in podrun's environment; export it first"]


@pytest.mark.parametrize("config", sorted(path.name for path in (REPO / "configs").glob("*.yaml")))
def test_validate_accepts_the_example_configs(config):
    result = podrun("validate", f"configs/{config}")
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stderr


def test_schema_is_the_spec_model_and_configs_point_at_it():
    result = podrun("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert {"target", "run", "env", "torchrun", "docker", "secret_env"} <= set(schema["properties"])
    assert schema["required"] == ["run"]
    assert json.loads((REPO / "podrun.schema.json").read_text()) == schema, "regenerate: podrun schema > podrun.schema.json"
    for config in (REPO / "configs").glob("*.yaml"):
        assert config.read_text().startswith("# yaml-language-server: $schema=../podrun.schema.json"), config


def test_spec_path_with_a_nul_byte_is_one_line():
    code, stderr = run_cli("validate", "job\0.yaml")
    assert (code, stderr) == (2, "podrun: error: 'job\\x00.yaml': expected a file name, this one holds a NUL byte\n")


def test_a_file_stem_that_is_no_job_name_asks_for_name(home, tmp_path):
    spec = tmp_path / "my job.yaml"
    spec.write_text("run: echo\n")
    result = podrun("validate", spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: name: the file's stem 'my job' is not a valid job name; set name: (letters, digits, . _ -)"]
    spec.write_text("name: mine\nrun: echo\n")
    assert podrun("validate", spec).stderr == f"podrun: {spec}: valid; job 'mine' on 2 local workers\n"
