"""The command line (GUIDE section 2). Each command parses, calls one function, and returns its exit code.

Only typer and the standard library load at start-up; each command imports what it needs, so
`podrun --help`, `podrun jobs` and `podrun logs` stay fast.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from podrun.errors import PodrunError

app = typer.Typer(
    help="Launch ML training on TPU VM pods, SSH GPU clusters and local CPU workers from one YAML job spec.",
    add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command("exec")
def exec_command(
    spec: str = typer.Argument(..., metavar="JOB.yaml", help="the job spec"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print each worker's environment and commands; start nothing"),
    worker: Optional[str] = typer.Option(None, "--worker", help="run on these workers only: 'all' or e.g. 0,2-3"),
    env: List[str] = typer.Option([], "--env", metavar="K=V", help="add or override an environment variable"),
) -> int:
    """Ship the workdir and run the job on every worker; stream their output."""
    from podrun.job import execute

    return execute(spec, dry_run, worker, env)


@app.command()
def validate(spec: str = typer.Argument(..., metavar="JOB.yaml")) -> int:
    """Check a job spec; touches nothing."""
    from podrun.job import validate as validate_spec

    validate_spec(spec)
    return 0


@app.command()
def schema() -> int:
    """Print the job spec's JSON Schema, for editors (yaml-language-server)."""
    import json

    from podrun.spec import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


@app.command()
def logs(
    job_id: Optional[str] = typer.Argument(None, metavar="[JOB_ID]", help="default: the newest job"),
    worker: Optional[int] = typer.Option(None, "--worker", help="only this worker's output, unprefixed"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
    tail: Optional[int] = typer.Option(None, "--tail", min=0, help="start with the last N lines of each worker"),
) -> int:
    """Show a job's output, per worker, now or as it runs."""
    from podrun.logs import show_logs

    return show_logs(job_id, worker, follow, tail)


@app.command()
def jobs(as_json: bool = typer.Option(False, "--json", help="machine-readable")) -> int:
    """List jobs: state, workers' exit codes, start and duration."""
    from podrun.logs import list_jobs

    return list_jobs(as_json)


@app.command()
def stop(job_id: str = typer.Argument(..., metavar="JOB_ID")) -> int:
    """Stop a running job on every worker."""
    from podrun.logs import stop_job

    return stop_job(job_id)


def main() -> None:
    try:  # typer 0.2x vendors click; older releases use click itself
        from typer._click.exceptions import ClickException
    except ImportError:
        from click.exceptions import ClickException

    try:
        code = app(standalone_mode=False)
    except PodrunError as error:
        print(f"podrun: error: {error}", file=sys.stderr)
        code = error.exit_code
    except ClickException as error:  # bad usage: click's message, exit 2
        error.show()
        code = error.exit_code
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except typer.Exit as error:
        code = error.exit_code
    sys.exit(code or 0)
