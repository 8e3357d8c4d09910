"""Before run, every worker must find torchrun on the job's PATH, of one torch version: otherwise one
line names the workers and what each has, and nothing runs (torchrun's own failure is exit 127 after
launch, or a rank crash much later)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import job_id_in, podrun, stderr_lines_without_traceback

VENV_TORCHRUN = Path(sys.executable).parent / "torchrun"  # its Python has torch


def spec_on(lab, hosts_spec, setup: str = ""):
    return hosts_spec(f"""
        {setup}
        run: train.py
        torchrun: {{nproc_per_node: 1}}
        env: {{PATH: '/root/bin:/usr/bin:/bin'}}
    """, files={"train.py": "print('trained')\n"})


def give_torchrun(lab, index: int, script: str | None = None) -> None:
    """~/bin/torchrun on lab host `index`: the virtualenv's, or `script`."""
    lab.run(index, "mkdir -p /root/bin && rm -f /root/bin/torchrun")
    if script is None:
        lab.run(index, f"ln -s {VENV_TORCHRUN} /root/bin/torchrun")
    else:
        (lab.hosts[index].home / "bin" / "torchrun").write_text(script)
        lab.run(index, "chmod +x /root/bin/torchrun")


@pytest.fixture
def clean_bins(lab):
    yield
    for index in range(len(lab.hosts)):
        lab.run(index, "rm -rf /root/bin")


@pytest.mark.slow
def test_a_worker_without_torchrun_is_named_before_anything_runs(home, lab, hosts_spec, clean_bins):
    give_torchrun(lab, 0)
    give_torchrun(lab, 1)
    result = podrun("exec", spec_on(lab, hosts_spec))
    assert result.returncode == 1
    version = podrun_torch_version()
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: no torchrun on the job's PATH on worker 2 ({lab.hosts[2].ip}); workers 0, 1 "
        f"({lab.hosts[0].ip}, {lab.hosts[1].ip}) have /root/bin/torchrun (torch {version}); install torch there "
        f"(setup: can), or set PATH in env")
    assert "── run" not in result.stderr and "trained" not in result.stdout
    assert podrun("jobs").stdout.count("failed") == 1


@pytest.mark.slow
def test_workers_with_different_torch_versions_are_named(home, lab, hosts_spec, clean_bins):
    for index in (0, 2):
        give_torchrun(lab, index)
    give_torchrun(lab, 1, "#!/usr/bin/python3 -I\nimport sys\nsys.exit('not a real torchrun')\n")
    result = podrun("exec", spec_on(lab, hosts_spec))
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: the workers' torchrun comes with different torch versions: torch {podrun_torch_version()} "
        f"on workers 0, 2 ({lab.hosts[0].ip}, {lab.hosts[2].ip}); no torch package on worker 1 ({lab.hosts[1].ip}); "
        f"install one version everywhere")


@pytest.mark.slow
def test_torchrun_is_checked_after_setup_which_may_install_it(home, lab, hosts_spec, clean_bins):
    result = podrun("exec", spec_on(lab, hosts_spec, setup=f"setup: mkdir -p ~/bin && ln -sf {VENV_TORCHRUN} ~/bin/"),
                    "--no-collapse", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("trained") == 3
    assert job_id_in(result.stderr)


def podrun_torch_version() -> str:
    from importlib.metadata import version

    return version("torch")
