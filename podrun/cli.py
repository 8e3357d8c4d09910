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

    return execute(args.spec, args.dry_run, args.worker, args.env, args.detach, args.kill_stale)


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


def _create(args: argparse.Namespace) -> int:
    from podrun.tpu_commands import create

    return create(args.accelerator_type, args.name, args.zone, args.project, args.version, args.spot, args.wait)


def _list(args: argparse.Namespace) -> int:
    from podrun.tpu_commands import list_nodes

    return list_nodes(args.zone, args.project)


def _describe(args: argparse.Namespace) -> int:
    from podrun.tpu_commands import describe

    return describe(args.name, args.zone, args.project)


def _delete(args: argparse.Namespace) -> int:
    from podrun.tpu_commands import delete

    return delete(args.name, args.zone, args.project, args.yes)


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

    def cloud_command(name: str, handler, summary: str) -> argparse.ArgumentParser:
        sub = command(name, handler, summary)
        sub.add_argument("--zone", metavar="Z", help="default: CLOUDSDK_COMPUTE_ZONE, then gcloud's compute/zone")
        sub.add_argument("--project", metavar="P", help="default: CLOUDSDK_CORE_PROJECT, then gcloud's core/project")
        return sub

    create = cloud_command("create", _create, "create a TPU VM (or pod slice) from its accelerator type")
    create.add_argument("accelerator_type", metavar="ACCEL_TYPE", help="e.g. v4-8, v4-32, v5p-128, v6e-16")
    create.add_argument("--name", metavar="N", help="default: USER-ACCEL_TYPE")
    create.add_argument("--version", metavar="RUNTIME", help="runtime version; default: the generation's usual one")
    create.add_argument("--spot", action="store_true", help="a Spot TPU VM: cheaper, may be preempted")
    create.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                        help="wait until the TPU VM is READY (default) or return once it is requested")
    cloud_command("list", _list, "list the TPU VMs in a zone, with state and worker count")
    cloud_command("describe", _describe, "show one TPU VM: state, accelerator, worker IPs").add_argument(
        "name", metavar="NAME")
    delete = cloud_command("delete", _delete, "delete a TPU VM (asks first unless --yes)")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask")

    exec_ = command("exec", _exec, "ship the workdir and run the job on every worker; stream their output")
    exec_.add_argument("spec", metavar="JOB.yaml", help="the job spec")
    exec_.add_argument("--detach", action="store_true",
                       help="return once run has started everywhere; the job goes on without podrun")
    exec_.add_argument("--dry-run", action="store_true",
                       help="print each worker's environment and commands; start nothing")
    exec_.add_argument("--worker", metavar="LIST", help="run on these workers only: 'all' or e.g. 0,2-3")
    exec_.add_argument("--env", action="append", default=[], metavar="K=V",
                       help="add or override an environment variable (repeatable)")
    exec_.add_argument("--kill-stale", action="store_true",
                       help="TPU: kill processes that still hold the TPU (from an earlier run) instead of stopping")

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
