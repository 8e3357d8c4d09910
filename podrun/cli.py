"""The command line (GUIDE section 2). Each command parses, calls one function, and returns its exit code.

Only argparse loads at start-up; each command imports what it needs, so `podrun --help`,
`podrun jobs` and `podrun logs` start about as fast as Python itself.
"""

from __future__ import annotations

import argparse
import sys

from podrun.errors import USAGE_EXIT_CODE, PodrunError


def _exec(args: argparse.Namespace) -> int:
    from podrun.job import execute

    return execute(args.spec, args.dry_run, args.worker, args.env, args.detach)


def _validate(args: argparse.Namespace) -> int:
    from podrun.job import validate

    validate(args.spec)
    return 0


def _schema(args: argparse.Namespace) -> int:
    import json

    from podrun.spec import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _logs(args: argparse.Namespace) -> int:
    from podrun.logs import show_logs

    return show_logs(args.job_id, args.worker, args.follow, args.tail)


def _jobs(args: argparse.Namespace) -> int:
    from podrun.logs import list_jobs

    return list_jobs(args.json)


def _stop(args: argparse.Namespace) -> int:
    from podrun.logs import stop_job

    return stop_job(args.job_id)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="podrun",
        description="Launch ML training on TPU VM pods, SSH GPU clusters and local CPU workers "
                    "from one YAML job spec.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, handler, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.set_defaults(handler=handler)
        return sub

    exec_ = command("exec", _exec, "ship the workdir and run the job on every worker; stream their output")
    exec_.add_argument("spec", metavar="JOB.yaml", help="the job spec")
    exec_.add_argument("--detach", action="store_true",
                       help="return once run has started everywhere; the job goes on without podrun")
    exec_.add_argument("--dry-run", action="store_true",
                       help="print each worker's environment and commands; start nothing")
    exec_.add_argument("--worker", metavar="LIST", help="run on these workers only: 'all' or e.g. 0,2-3")
    exec_.add_argument("--env", action="append", default=[], metavar="K=V",
                       help="add or override an environment variable (repeatable)")

    command("validate", _validate, "check a job spec; touches nothing").add_argument("spec", metavar="JOB.yaml")
    command("schema", _schema, "print the job spec's JSON Schema, for editors (yaml-language-server)")

    logs = command("logs", _logs, "show a job's output, per worker, now or as it runs")
    logs.add_argument("job_id", nargs="?", metavar="JOB_ID", help="default: the newest job")
    logs.add_argument("--worker", type=_count, metavar="I", help="only this worker's output, unprefixed")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--tail", type=_count, metavar="N", help="start with the last N lines of each worker")

    command("jobs", _jobs, "list jobs: state, workers' exit codes, start and duration").add_argument(
        "--json", action="store_true", help="machine-readable")
    command("stop", _stop, "stop a running job on every worker").add_argument("job_id", metavar="JOB_ID")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)  # bad usage: argparse prints it and exits 2
    if not hasattr(args, "handler"):
        parser.print_help(sys.stderr)
        sys.exit(USAGE_EXIT_CODE)
    try:
        code = args.handler(args)
    except PodrunError as error:
        print(f"podrun: error: {error}", file=sys.stderr)
        code = error.exit_code
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
