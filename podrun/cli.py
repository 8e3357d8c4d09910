"""The command line (docs/reference: generated from this parser). Each command parses (what it takes: cli_arguments.py),
calls one function, and returns its exit code.

Only argparse loads at start-up; each command imports what it needs, so `podrun --help`,
`podrun jobs` and `podrun logs` start about as fast as Python itself.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable

from podrun import __version__, exits
from podrun.cli_arguments import (
    cloud_arguments,
    cp_arguments,
    create_arguments,
    delete_arguments,
    disk_arguments,
    exec_arguments,
    jobs_arguments,
    list_arguments,
    logs_arguments,
    one_positional,
    report_arguments,
    ssh_arguments,
    stacks_arguments,
    stop_arguments,
    supervisor_arguments,
)
from podrun.errors import PodrunError, UsageError

# mypy reads the import below; Python skips it (typing costs `podrun jobs` its start-up)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    Parsed = TypeVar("Parsed")

SUPERVISE = "_supervise"  # the hidden command a supervisor host runs (supervisor/daemon.py)
WARM = "_warm"  # and the one that keeps podrun loaded there (supervisor/warm.py)


def _exec(args: argparse.Namespace) -> int:
    # everything start-up allocates (modules, the spec) lives until exit: collecting it is wasted
    # work (~50 ms with asyncssh and pydantic loaded); launch/lifecycle.py freezes it and turns the collector
    # back on before the launch
    gc.disable()
    begun = args.begun
    try:
        from podrun.commands.exec import execute
        from podrun.spec.adhoc import job_spec

        spec = job_spec(args.spec, _target_flags(args), args.command, args.workdir)
        return execute(spec, args.spec is not None or args.workdir is not None, _exec_options(args), begun)
    finally:
        if begun is not None and not begun.taken:
            begun.close()
        gc.enable()


def _exec_options(args: argparse.Namespace):
    """exec's flags, parsed here once into the values a launch (and a supervisor host's) takes as they are."""
    from podrun.launch.exec_options import ExecOptions
    from podrun.spec.values import parse_stall, parse_stop_grace

    return ExecOptions(args.dry_run, args.worker, _env_overrides(args.env), args.detach, args.kill_stale,
                       args.allow_large_workdir, _seconds("--grace", args.grace, parse_stop_grace), args.down,
                       args.restarts, _seconds("--stall", args.stall, parse_stall), args.supervisor, args.collapse,
                       args.raw)


def _seconds(flag: str, duration: str | None, parse: Callable[[str], Parsed]) -> Parsed | None:
    if duration is None:
        return None
    try:
        return parse(duration)
    except ValueError as error:
        raise UsageError(f"{flag} {duration!r}: {error}") from None


def _env_overrides(assignments: list[str]) -> dict[str, str]:
    import re

    from podrun.spec.model import ENV_KEY_PATTERN, RESERVED_ENV

    env = {}
    for assignment in assignments:
        key, equals, value = assignment.partition("=")
        if not equals or not re.match(ENV_KEY_PATTERN, key):
            raise UsageError(f"--env {assignment!r}: expected KEY=VALUE with KEY a variable name")
        if key in RESERVED_ENV:
            raise UsageError(f"--env {key}: set by podrun on every worker and cannot be overridden")
        env[key] = value
    return env


def _ssh(args: argparse.Namespace) -> int:
    from podrun.commands.shell import ssh

    return ssh(args.spec, _target_flags(args), args.worker, args.command)


def _cp(args: argparse.Namespace) -> int:
    from podrun.commands.copy import cp

    return cp(args.spec, _target_flags(args), args.worker, args.recurse, args.paths)


def _validate(args: argparse.Namespace) -> int:
    from podrun.commands.exec import validate

    validate(args.spec)
    return 0


def _schema(args: argparse.Namespace) -> int:
    import json

    from podrun.spec.model import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _logs(args: argparse.Namespace) -> int:
    from podrun.commands.logs import show_logs

    return show_logs(args.job, args.worker, args.follow, args.tail, args.attempt, args.collapse, args.raw)


def _jobs(args: argparse.Namespace) -> int:
    from podrun.commands.jobs import list_jobs

    return list_jobs(args.name_or_prefix, args.state, args.n, args.all, args.json)


def _stop(args: argparse.Namespace) -> int:
    from podrun.commands.stop import stop_job

    return stop_job(args.job)


def _stacks(args: argparse.Namespace) -> int:
    from podrun.commands.stacks import show_stacks

    return show_stacks(args.job, args.worker, args.raw, args.all)


def _report(args: argparse.Namespace) -> int:
    from podrun.commands.report import report

    if args.port is not None and not args.serve:
        raise UsageError("--port: only with --serve")
    return report(args.job, args.json, args.serve, args.port or 0)


def _supervisor(args: argparse.Namespace) -> int:
    if args.action == "start":
        from podrun.supervisor import adopt

        return adopt.start()
    from podrun.supervisor import boot

    return boot.install()


def _disk(args: argparse.Namespace) -> int:
    from podrun.commands.disk import disk

    return disk(args.spec, args.free)


def _create(args: argparse.Namespace) -> int:
    from podrun.cloud.gcloud_flags import refusal
    from podrun.commands.tpu import CreateOptions, create

    if args.gcloud_only:
        raise UsageError(refusal(args.gcloud_only[0]))
    return create(CreateOptions(args.accelerator_type, args.name, args.zone, args.project, args.version, args.spot,
                                args.wait, args.queued, args.reservation, args.valid_for, args.replace, args.slices,
                                args.internal_ips, args.accelerator_flag, args.zones, args.zone_wait,
                                args.idle_delete))


def _list(args: argparse.Namespace) -> int:
    _everything_with_orphans(args)
    if args.orphans:
        from podrun.commands.orphans import list_orphans

        return list_orphans(args.zone, args.project, args.everything)
    from podrun.commands.tpu import list_nodes

    return list_nodes(args.zone, args.project)


def _everything_with_orphans(args: argparse.Namespace) -> None:
    if args.everything and not args.orphans:
        raise UsageError("--all: only with --orphans")


def _describe(args: argparse.Namespace) -> int:
    from podrun.commands.tpu import describe

    return describe(args.name, args.zone, args.project)


def _delete(args: argparse.Namespace) -> int:
    _everything_with_orphans(args)
    if args.orphans:
        if args.name:
            raise UsageError(f"{args.name}: give a NAME or --orphans, not both")
        from podrun.commands.orphans import delete_orphans

        return delete_orphans(args.zone, args.project, args.everything, args.yes)
    if not args.name:
        raise UsageError("no NAME: `podrun delete NAME`, or `podrun delete --orphans`")
    from podrun.commands.tpu import delete

    return delete(args.name, args.zone, args.project, args.yes)


def _target_flags(args: argparse.Namespace):
    from podrun.spec.adhoc import TargetFlags

    return TargetFlags.from_args(args)


# name: (summary, handler, its arguments, takes --zone/--project)
COMMANDS = {
    "create": ("create a TPU VM (or pod slice) from its accelerator type", _create, create_arguments, True),
    "list": ("list the TPU VMs and queued resources in a zone, with state and worker count (--orphans: what "
             "podrun made that no running job owns)", _list, list_arguments, True),
    "describe": ("show one TPU VM: state, accelerator, worker IPs, its queued resource", _describe,
                 one_positional("name", "NAME"), True),
    "delete": ("delete a TPU VM with its queued resource, or the orphans (asks first unless --yes)", _delete,
               delete_arguments, True),
    "exec": ("ship the workdir and run the job on every worker; stream their output", _exec, exec_arguments, False),
    "ssh": ("a shell on one worker (with -- CMD: run CMD there), at your terminal", _ssh, ssh_arguments, False),
    "cp": ("copy files to every worker (through the relay) or from workers (into DEST/w<i>/)", _cp,
           cp_arguments, False),
    "validate": ("check a job spec; touches nothing", _validate, one_positional("spec", "JOB.yaml"), False),
    "schema": ("print the job spec's JSON Schema, for editors (yaml-language-server)", _schema, None, False),
    "logs": ("show a job's output, per worker, now or as it runs", _logs, logs_arguments, False),
    "jobs": ("list jobs, newest first: state, workers' exit codes, start and duration", _jobs, jobs_arguments,
             False),
    "stop": ("stop a running job on every worker", _stop, stop_arguments, False),
    "stacks": ("where a running job's workers are, now: the processes whose Python stacks differ from the rest "
               "(every stack with --all; saved in the job's stacks/)", _stacks, stacks_arguments, False),
    "report": ("where a job's time went: each phase per worker per attempt, goodput; writes report.html, a "
               "timeline (--serve: live, on 127.0.0.1)", _report, report_arguments, False),
    "disk": ("show (or free) the disk podrun uses on each worker: code versions, run directory, job files",
             _disk, disk_arguments, False),
    "supervisor": ("on a supervisor host: start (adopt again the jobs it keeps that lost their supervisor), install "
                   "(run start at every boot)", _supervisor, supervisor_arguments, False),
}


TAKES_A_COMMAND = ("exec", "ssh")


def _split_at_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors name the arguments after `--` as written (see _parse_intermixed)."""

    stand_ins: dict[str, str] = {}

    def error(self, message: str):
        for stand_in, argument in self.stand_ins.items():
            message = message.replace(stand_in, argument)
        super().error(message)


def _parse_intermixed(parser: _Parser, argv: list[str]) -> argparse.Namespace:
    """argv parsed with options before or after the positionals, as gcloud and ssh users write them
    (`podrun cp job.yaml -r :logs ./logs`); `--` ends the options."""
    options, after_dashes = _split_at_dashes(argv)
    # Python 3.11's parse_intermixed_args reads an argument after `--` as an option when no positional
    # comes before the `--`: stand-ins that cannot be options (argv never holds NUL) keep them positional
    parser.stand_ins = {f"\0{index}\0": argument for index, argument in enumerate(after_dashes)}
    args = parser.parse_intermixed_args(options + list(parser.stand_ins))
    for name, value in vars(args).items():
        if isinstance(value, list):
            setattr(args, name, [parser.stand_ins.get(item, item) if isinstance(item, str) else item for item in value])
        elif isinstance(value, str):
            setattr(args, name, parser.stand_ins.get(value, value))
    return args


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's own formatter, given the terminal's width as shutil.get_terminal_size would find
    it: left to ask itself, argparse imports shutil, a sixth of `podrun jobs`'s start-up."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
        except (ValueError, OSError):
            columns = 0
    return argparse.HelpFormatter(prog, width=(columns if columns > 0 else 80) - 2)


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, dict[str, _Parser]]:
    """The parser for argv and its commands' parsers: with a command named first, only that command's,
    with its options; else every command's, without (each costs argparse about a millisecond to build,
    `podrun jobs` should start as fast as Python, and exec's options load the spec's target kinds)."""
    parser = _Parser(
        prog="podrun", formatter_class=_help_formatter,
        description="Launch ML training on TPU VM pods, SSH GPU clusters and local CPU workers "
                    "from one YAML job spec.")
    parser.add_argument("--version", action="version", version=f"podrun {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    command_parsers = {}
    named = argv[0] if argv and argv[0] in COMMANDS else None
    for name in [named] if named else COMMANDS:
        summary, handler, add_arguments, cloud = COMMANDS[name]
        sub = commands.add_parser(name, help=summary, description=summary, formatter_class=_help_formatter)
        sub.set_defaults(handler=handler)
        if named and cloud:  # podrun's own help lists the commands: their options are for their own
            cloud_arguments(sub)
        if named and add_arguments:
            add_arguments(sub)
        command_parsers[name] = sub
    return parser, command_parsers


def parse(argv: list[str]) -> argparse.Namespace:
    """The command's arguments (`handler` its function, `command` the CMD after exec's or ssh's `--`),
    its options before or after its positionals; SystemExit for bad usage and --help, as argparse."""
    command: list[str] = []
    if argv and argv[0] in TAKES_A_COMMAND:
        argv, command = _split_at_dashes(argv)  # the CMD is taken whole: argparse would read its options
    parser, command_parsers = build_parser(argv)
    if argv and argv[0] in command_parsers:
        # parse_intermixed_args cannot take the command level (the subparsers are a positional)
        args = _parse_intermixed(command_parsers[argv[0]], argv[1:])
    else:
        args = parser.parse_args(argv)  # --help, --version, or a command argparse names as unknown
    if not hasattr(args, "handler"):
        parser.print_help(sys.stderr)
        raise SystemExit(exits.USAGE)
    args.command = command
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse, run the command, and return its exit code (bad usage: 2, as argparse prints it)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SUPERVISE]:  # not a user's command: what a handover starts on a supervisor host
        from podrun.supervisor import greeting

        job = greeting.answer()  # before the rest of podrun loads
        if job is None:
            return exits.USAGE
        from podrun.supervisor import daemon

        return handled(lambda: daemon.main(job))
    if argv[:1] == [WARM]:  # not a user's command: a supervisor host's warm podrun (supervisor/warm.py)
        from podrun.supervisor import warm

        return warm.serve(argv[1:], main)
    begun = _handover_begun(argv)
    try:
        args = parse(argv)
    except SystemExit as argparse_exit:  # bad usage, or --help
        if begun is not None:
            begun.close()
        return int(argparse_exit.code or 0)
    args.begun = begun
    return handled(lambda: args.handler(args))


def _handover_begun(argv: list[str]):
    """`exec` to a supervisor host this laptop knows: the handover begun while argparse and the spec load
    import pydantic (supervisor/early.py)."""
    if argv[:1] != ["exec"]:
        return None
    from podrun.supervisor import early

    return early.begin(_split_at_dashes(argv[1:])[0])


def handled(command: Callable[[], int]) -> int:
    """Run a command; its exit code, or that of its error, said in one line."""
    try:
        return command()
    except PodrunError as error:
        from podrun.escapes import shown_text  # an error may quote what a host said: made harmless

        print(f"podrun: error: {shown_text(str(error), colour=False)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    except BrokenPipeError:  # stdout was closed early, as by `podrun logs | head`
        return exits.BROKEN_PIPE
    except Exception as error:  # a bug of podrun's: one line for the user, the traceback kept for a report
        print(f"podrun: internal error: {_one_line(error)} (a bug in podrun; please report it with the "
              f"traceback in {_save_traceback()})", file=sys.stderr)
        return exits.INTERNAL_ERROR


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".replace("\n", " ")


def _save_traceback() -> str:
    import tempfile
    import traceback

    descriptor, path = tempfile.mkstemp(prefix="podrun-traceback-", suffix=".txt")
    with os.fdopen(descriptor, "w") as handle:
        traceback.print_exc(file=handle)
    return path


def run() -> None:
    """The `podrun` command."""
    _exit(main())


def _exit(code: int) -> None:
    """Exit without the interpreter's teardown, which frees every loaded module's objects one by one:
    ~0.1 s of CPU after `exec` (asyncssh, cryptography, pydantic). Nothing of podrun's needs it: by
    now its files are closed, its connections and subprocesses ended, its threads joined."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader gone, or a stream already closed
            pass
    os._exit(code)
