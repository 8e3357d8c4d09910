"""The command line (the README's "Commands"). Each command parses, calls one function, and returns its exit code.

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
from podrun.errors import PodrunError

SUPERVISE = "_supervise"  # the hidden command a supervisor host runs (supervisor/daemon.py)


def _exec(args: argparse.Namespace) -> int:
    # everything start-up allocates (modules, the spec) lives until exit: collecting it is wasted
    # work (~50 ms with asyncssh and pydantic loaded); commands.exec.execute freezes it and turns the collector
    # back on before the launch
    gc.disable()
    try:
        from podrun.adhoc import job_spec
        from podrun.commands.exec import execute
        from podrun.commands.exec_options import ExecOptions

        spec = job_spec(args.spec, _target_flags(args), args.command, args.workdir)
        options = ExecOptions(args.dry_run, args.worker, tuple(args.env), args.detach, args.kill_stale,
                              args.allow_large_workdir, args.grace, args.down, args.restarts, args.stall,
                              args.supervisor, args.collapse, args.raw)
        return execute(spec, args.spec is not None or args.workdir is not None, options)
    finally:
        gc.enable()


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

    from podrun.spec import json_schema

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

    return show_stacks(args.job, args.worker, args.raw)


def _report(args: argparse.Namespace) -> int:
    from podrun.commands.report import report

    return report(args.job)


def _disk(args: argparse.Namespace) -> int:
    from podrun.commands.disk import disk

    return disk(args.spec, args.free)


def _create(args: argparse.Namespace) -> int:
    from podrun.cloud.gcloud_flags import refusal
    from podrun.commands.tpu import CreateOptions, create
    from podrun.errors import UsageError

    if args.gcloud_only:
        raise UsageError(refusal(args.gcloud_only[0]))
    return create(CreateOptions(args.accelerator_type, args.name, args.zone, args.project, args.version, args.spot,
                                args.wait, args.queued, args.reservation, args.valid_for, args.replace, args.slices,
                                args.internal_ips, args.accelerator_flag))


def _list(args: argparse.Namespace) -> int:
    from podrun.commands.tpu import list_nodes

    return list_nodes(args.zone, args.project)


def _describe(args: argparse.Namespace) -> int:
    from podrun.commands.tpu import describe

    return describe(args.name, args.zone, args.project)


def _delete(args: argparse.Namespace) -> int:
    from podrun.commands.tpu import delete

    return delete(args.name, args.zone, args.project, args.yes)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _create_arguments(sub: argparse.ArgumentParser) -> None:
    from podrun.cloud import gcloud_flags

    sub.usage = ("%(prog)s ACCEL_TYPE [--name N] [options]\n"
                 "       %(prog)s NAME --accelerator-type ACCEL_TYPE [options]   (gcloud's order)")
    sub.add_argument("accelerator_type", nargs="?", metavar="ACCEL_TYPE",
                     help="generation and size: v2-8, -32, -128, -256, -512; v3-8, -32, -64 ... -2048; v4 and v5p "
                          "TensorCores: 8, 16, 32, 64, then whole cubes of 128 (v4-128 ... v4-8192, v5p-128 ... "
                          "v5p-12288); v5litepod-N (v5e) and v6e-N count chips: 1, 4, 8, 16, 32, 64, 128, 256")
    sub.add_argument("--accelerator-type", dest="accelerator_flag", metavar="ACCEL_TYPE",
                     help="as ACCEL_TYPE, gcloud's spelling; with it, a positional argument is the TPU's name, as in "
                          "gcloud")
    sub.add_argument("--name", metavar="N", help="default: USER-ACCEL_TYPE")
    sub.add_argument("--version", metavar="RUNTIME", help="runtime version; default: the generation's usual one")
    sub.add_argument("--queued", action="store_true",
                     help="ask through a queued resource, which waits for capacity (v5e, v5p and v6e mostly come so)")
    sub.add_argument("--slices", metavar="N", type=_count, default=1,
                     help="Multislice: N slices of ACCEL_TYPE as one queued resource, named NAME-0 .. NAME-(N-1)")
    capacity = sub.add_mutually_exclusive_group()
    capacity.add_argument("--spot", action="store_true", help="a Spot TPU VM: cheaper, may be preempted")
    capacity.add_argument("--reservation", metavar="NAME", help="in this reservation (through a queued resource)")
    sub.add_argument("--valid-for", metavar="DURATION",
                     help="how long a queued request may wait for capacity, e.g. 30m or 6h (then Google fails it)")
    sub.add_argument("--internal-ips", action="store_true",
                     help="no external IPs: its workers are reached from inside its VPC network only "
                          "(a job spec says so with target.tpu.internal_ip: true)")
    sub.add_argument("--replace", action="store_true",
                     help="first delete a preempted TPU VM, or a failed or suspended queued resource, of that name")
    sub.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                     help="wait until the TPU VM is READY (default), or return once Google accepted the request; "
                          "Ctrl-C while waiting deletes what was asked for")
    sub.add_argument("--async", dest="wait", action="store_false", help="as --no-wait (gcloud's spelling)")
    sub.add_argument("--quiet", "-q", action="store_true",
                     help="accepted as gcloud takes it (no prompts): podrun create asks nothing anyway")
    gcloud_flags.add_to(sub)  # gcloud's other flags: refused in one line naming podrun's equivalent


def _delete_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("name", metavar="NAME")
    sub.add_argument("--yes", "-y", action="store_true", help="do not ask")


def _target_flags(args: argparse.Namespace):
    from podrun.adhoc import TargetFlags

    return TargetFlags.from_args(args)


def _target_usage() -> str:
    """`(--tpu NAME | --hosts H1,H2,... | --local N)`: each kind's flag (targets/registry.py)."""
    from podrun.targets import registry

    return "(" + " | ".join(f"{declared.flag.name} {declared.flag.metavar}" for declared in registry.kinds()) + ")"


def _target_arguments(sub: argparse.ArgumentParser, spec_help: str | None) -> None:
    """A spec (`spec_help`: as a positional argument of its own), or where a command goes without one:
    exec's ad-hoc commands, ssh, cp."""
    if spec_help:
        sub.add_argument("spec", nargs="?", metavar="JOB.yaml", help=spec_help)
    else:
        sub.set_defaults(spec=None)
    from podrun.targets import registry

    where = sub.add_argument_group("a target instead of a spec")
    added: set[str] = set()
    for declared in registry.kinds():
        for flag in (declared.flag, *declared.extra_flags):
            if flag.name not in added:  # an extra flag two kinds share (--partition) is one option
                flag.add_to(where)
                added.add(flag.name)
    where.add_argument("--user", metavar="U", help="SSH user (default: ~/.ssh/config's, else yours)")
    where.add_argument("--identity-file", metavar="F", help="SSH private key (default: ssh's)")


def _exec_arguments(sub: argparse.ArgumentParser) -> None:
    sub.usage = ("%(prog)s [options] JOB.yaml\n"
                 f"       %(prog)s [options] {_target_usage()} -- CMD [ARG ...]")
    _target_arguments(sub, "the job spec")
    sub.add_argument("--workdir", metavar="DIR",
                     help="with -- CMD: ship DIR and run CMD in it (default: nothing ships, CMD runs in the login "
                          "directory)")
    sub.add_argument("--detach", action="store_true",
                     help="return once run has started everywhere; the job goes on without podrun")
    sub.add_argument("--dry-run", action="store_true", help="print each worker's environment and commands; start nothing")
    sub.add_argument("--worker", metavar="LIST", help="run on these workers only: 'all' or e.g. 0,2-3")
    sub.add_argument("--env", action="append", default=[], metavar="K=V",
                     help="add or override an environment variable (repeatable)")
    sub.add_argument("--kill-stale", action="store_true",
                     help="TPU: kill processes that still hold the TPU (from an earlier run) instead of stopping")
    sub.add_argument("--grace", metavar="DURATION",
                     help="how long a stopped job's processes get between SIGTERM and SIGKILL, e.g. 30s or 2m "
                          "(default: the spec's stop_grace, else 30s)")
    sub.add_argument("--stall", metavar="DURATION",
                     help="when no worker printed anything for this long while run runs (e.g. 15m), save every "
                          "worker's stacks and stop the job (the spec's stall)")
    sub.add_argument("--down", action="store_true",
                     help="TPU: delete the TPU VM (and its queued resource) when the job ends, also after Ctrl-C "
                          "(the spec's delete_after: always)")
    sub.add_argument("--restarts", type=_count, metavar="N",
                     help="restart the job at most N times (the spec's restarts.max), on what the spec's "
                          "restarts.on says; by default on preemption on a TPU (creating it again), on failure on "
                          "hosts and local workers")
    sub.add_argument("--supervisor", metavar="HOST",
                     help="hand the job to HOST (user@host:port), which runs its whole life (create, restarts, "
                          "delete_after) while this machine may close (the spec's supervisor.host)")
    sub.add_argument("--allow-large-workdir", action="store_true",
                     help="ship a workdir over 1 GiB or 50,000 files without asking (otherwise podrun names what "
                          "weighs most, and asks on a terminal or stops)")
    sub.add_argument("--no-collapse", dest="collapse", action="store_false",
                     help="show each worker's lines apart, even where several print the same line (by default "
                          "such a line shows once, with the workers' range: [w0-511,513-1023])")
    _raw_argument(sub, "the workers' output")


def _raw_argument(sub: argparse.ArgumentParser, what: str) -> None:
    sub.add_argument("--raw", action="store_true",
                     help=f"pass {what} through as written, escape sequences and all (by default only colours pass, "
                          f"on a terminal; any other control character shows harmlessly, as ^[ or <U+009B>)")


def _ssh_arguments(sub: argparse.ArgumentParser) -> None:
    sub.usage = ("%(prog)s [options] [JOB.yaml] [--worker I] [-- CMD [ARG ...]]\n"
                 f"       %(prog)s [options] {_target_usage()} [--worker I] [-- CMD ...]")
    _target_arguments(sub, "a job spec: its target and ssh settings")
    sub.add_argument("--worker", type=_count, default=0, metavar="I", help="which worker (default: 0)")


def _cp_arguments(sub: argparse.ArgumentParser) -> None:
    sub.usage = ("%(prog)s [options] JOB.yaml SRC... DEST\n"
                 f"       %(prog)s [options] {_target_usage()} SRC... DEST")
    _target_arguments(sub, None)
    sub.add_argument("paths", nargs="+", metavar="SRC... DEST",
                     help="a remote path is written :PATH (relative to the login directory, ~ the remote home); "
                          "either every SRC is remote (a download) or DEST is (an upload)")
    sub.add_argument("--worker", metavar="LIST", help="these workers only: 'all' (default) or e.g. 0,2-3; "
                                                      "from several, each one's files land in DEST/w<i>/")
    sub.add_argument("--recurse", "-r", action="store_true", help="copy directories and what they hold")


def _disk_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("spec", metavar="JOB.yaml", help="the job spec: its target and name")
    sub.add_argument("--free", action="store_true",
                     help="remove the name's code versions but the current one, and the files of finished jobs "
                          "untouched for 7 days; never the run directory, which holds your checkpoints")


JOB_HELP = "an id, the beginning of one, or a job name (its newest job)"


def _job_states(text: str) -> list[str]:
    from podrun.jobstore import STATES

    states = text.split(",")
    if unknown := [state for state in states if state not in STATES]:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, unknown))}: expected {', '.join(STATES)}")
    return states


def _jobs_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("name_or_prefix", nargs="?", metavar="NAME_OR_PREFIX",
                     help="only jobs whose id begins so (an id begins with its job's name)")
    sub.add_argument("--state", type=_job_states, action="extend", default=[], metavar="STATE",
                     help="only jobs in this state: running, succeeded, failed, stopped, preempted, stalled or lost "
                          "(repeatable, or a comma-separated list)")
    count = sub.add_mutually_exclusive_group()
    count.add_argument("-n", type=_count, metavar="N", help="the newest N jobs (default: 20; with --json, all)")
    count.add_argument("--all", action="store_true", help="every job")
    sub.add_argument("--json", action="store_true", help="machine-readable: every field of each job, newest first")


def _stop_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("job", nargs="?", metavar="JOB_ID", help=f"{JOB_HELP}; default: the newest running job")


def _stacks_arguments(sub: argparse.ArgumentParser) -> None:
    _report_arguments(sub)
    sub.add_argument("--worker", metavar="LIST", help="these workers only: 'all' (default) or e.g. 0,2-3")
    _raw_argument(sub, "the stacks (process command lines, thread names)")


def _report_arguments(sub: argparse.ArgumentParser) -> None:
    """A job, by default the newest running one, else the newest (as `logs` takes it)."""
    sub.add_argument("job", nargs="?", metavar="JOB_ID",
                     help=f"{JOB_HELP}; default: the newest running job, else the newest job")


def _logs_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("job", nargs="?", metavar="JOB_ID",
                     help=f"{JOB_HELP}; default: the newest running job, else the newest job")
    sub.add_argument("--worker", type=_count, metavar="I", help="only this worker's output, unprefixed")
    sub.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    sub.add_argument("--attempt", type=_count, metavar="K",
                     help="the output of attempt K (0: the first; a job restarts as its spec's `restarts` says); "
                          "default: the last")
    sub.add_argument("--tail", type=_count, metavar="N",
                     help="start with the last N lines of each worker (a line redrawn with \\r counts once; "
                          "0: none, with -f only what comes next)")
    sub.add_argument("--no-collapse", dest="collapse", action="store_false",
                     help="show each worker's lines apart, even where several printed the same line")
    _raw_argument(sub, "the workers' output")


def _cloud_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--zone", metavar="Z", help="default: CLOUDSDK_COMPUTE_ZONE, then gcloud's compute/zone")
    sub.add_argument("--project", metavar="P", help="default: CLOUDSDK_CORE_PROJECT, then gcloud's core/project")


def _one_positional(name: str, metavar: str):
    return lambda sub: sub.add_argument(name, metavar=metavar)


# name: (summary, handler, its arguments, takes --zone/--project)
COMMANDS = {
    "create": ("create a TPU VM (or pod slice) from its accelerator type", _create, _create_arguments, True),
    "list": ("list the TPU VMs and queued resources in a zone, with state and worker count", _list, None, True),
    "describe": ("show one TPU VM: state, accelerator, worker IPs, its queued resource", _describe,
                 _one_positional("name", "NAME"), True),
    "delete": ("delete a TPU VM with its queued resource (asks first unless --yes)", _delete, _delete_arguments,
               True),
    "exec": ("ship the workdir and run the job on every worker; stream their output", _exec, _exec_arguments, False),
    "ssh": ("a shell on one worker (with -- CMD: run CMD there), at your terminal", _ssh, _ssh_arguments, False),
    "cp": ("copy files to every worker (through the relay) or from workers (into DEST/w<i>/)", _cp,
           _cp_arguments, False),
    "validate": ("check a job spec; touches nothing", _validate, _one_positional("spec", "JOB.yaml"), False),
    "schema": ("print the job spec's JSON Schema, for editors (yaml-language-server)", _schema, None, False),
    "logs": ("show a job's output, per worker, now or as it runs", _logs, _logs_arguments, False),
    "jobs": ("list jobs, newest first: state, workers' exit codes, start and duration", _jobs, _jobs_arguments,
             False),
    "stop": ("stop a running job on every worker", _stop, _stop_arguments, False),
    "stacks": ("show every worker's Python stacks of a running job, now (saved in the job's stacks/)", _stacks,
               _stacks_arguments, False),
    "report": ("where a job's time went: each phase per worker per attempt, goodput; writes report.html, a "
               "timeline", _report, _report_arguments, False),
    "disk": ("show (or free) the disk podrun uses on each worker: code versions, run directory, job files",
             _disk, _disk_arguments, False),
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
            _cloud_arguments(sub)
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
        from podrun.supervisor import daemon

        return handled(daemon.main)
    try:
        args = parse(argv)
    except SystemExit as argparse_exit:  # bad usage, or --help
        return int(argparse_exit.code or 0)
    return handled(lambda: args.handler(args))


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
