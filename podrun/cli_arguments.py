"""What each command of the CLI takes (cli.py builds only the named command's parser from these): its
positionals, its options and their help. Only argparse loads here; a command's flags that its target
kinds declare come from target_kinds/registry.py, loaded only for the command that takes them.
"""

from __future__ import annotations

import argparse


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _port(text: str) -> int:
    if (port := _count(text)) > 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0 to 65535)")
    return port


def create_arguments(sub: argparse.ArgumentParser) -> None:
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
    sub.add_argument("--zones", metavar="A,B",
                     help="ask in these zones in order (instead of --zone): a stockout, or a queued request still "
                          "waiting after --zone-wait, deletes the request and asks in the next")
    sub.add_argument("--zone-wait", metavar="DURATION",
                     help="with --zones: how long a queued request may wait in one zone, e.g. 30m (implies --queued)")
    sub.add_argument("--idle-delete", metavar="DURATION",
                     help="delete the TPU VM once no job has run on it for this long, e.g. 2h: its worker 0 watches "
                          "and deletes it with the VM's service account, which needs roles/tpu.admin")
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


def delete_arguments(sub: argparse.ArgumentParser) -> None:
    sub.usage = "%(prog)s NAME [--yes]\n       %(prog)s --orphans [--all] [--yes]"
    sub.add_argument("name", metavar="NAME", nargs="?")
    sub.add_argument("--yes", "-y", action="store_true", help="do not ask")
    _orphan_arguments(sub, "delete")


def list_arguments(sub: argparse.ArgumentParser) -> None:
    _orphan_arguments(sub, "list")


def _orphan_arguments(sub: argparse.ArgumentParser, verb: str) -> None:
    sub.add_argument("--orphans", action="store_true",
                     help=f"{verb} the TPUs podrun made (labelled podrun-job) that no running job owns and "
                          f"podrun was to delete after their job, with their age and cost so far")
    sub.add_argument("--all", dest="everything", action="store_true",
                     help="with --orphans: also those kept on purpose (delete_after never, `podrun create`'s)")


def _target_usage() -> str:
    """`(--tpu NAME | --hosts H1,H2,... | --local N)`: each kind's flag (target_kinds/registry.py)."""
    from podrun.target_kinds import registry

    return "(" + " | ".join(f"{declared.flag.name} {declared.flag.metavar}" for declared in registry.kinds()) + ")"


def _target_arguments(sub: argparse.ArgumentParser, spec_help: str | None) -> None:
    """A spec (`spec_help`: as a positional argument of its own), or where a command goes without one:
    exec's ad-hoc commands, ssh, cp."""
    if spec_help:
        sub.add_argument("spec", nargs="?", metavar="JOB.yaml", help=spec_help)
    else:
        sub.set_defaults(spec=None)
    from podrun.target_kinds import registry

    where = sub.add_argument_group("a target instead of a spec")
    added: set[str] = set()
    for declared in registry.kinds():
        for flag in (declared.flag, *declared.extra_flags):
            if flag.name not in added:  # an extra flag two kinds share (--partition) is one option
                flag.add_to(where)
                added.add(flag.name)
    where.add_argument("--user", metavar="U", help="SSH user (default: ~/.ssh/config's, else yours)")
    where.add_argument("--identity-file", metavar="F", help="SSH private key (default: ssh's)")


def exec_arguments(sub: argparse.ArgumentParser) -> None:
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


def ssh_arguments(sub: argparse.ArgumentParser) -> None:
    sub.usage = ("%(prog)s [options] [JOB.yaml] [--worker I] [-- CMD [ARG ...]]\n"
                 f"       %(prog)s [options] {_target_usage()} [--worker I] [-- CMD ...]")
    _target_arguments(sub, "a job spec: its target and ssh settings")
    sub.add_argument("--worker", type=_count, default=0, metavar="I", help="which worker (default: 0)")


def cp_arguments(sub: argparse.ArgumentParser) -> None:
    sub.usage = ("%(prog)s [options] JOB.yaml SRC... DEST\n"
                 f"       %(prog)s [options] {_target_usage()} SRC... DEST")
    _target_arguments(sub, None)
    sub.add_argument("paths", nargs="+", metavar="SRC... DEST",
                     help="a remote path is written :PATH (relative to the login directory, ~ the remote home); "
                          "either every SRC is remote (a download) or DEST is (an upload)")
    sub.add_argument("--worker", metavar="LIST", help="these workers only: 'all' (default) or e.g. 0,2-3; "
                                                      "from several, each one's files land in DEST/w<i>/")
    sub.add_argument("--recurse", "-r", action="store_true", help="copy directories and what they hold")


def disk_arguments(sub: argparse.ArgumentParser) -> None:
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


def jobs_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("name_or_prefix", nargs="?", metavar="NAME_OR_PREFIX",
                     help="only jobs whose id begins so (an id begins with its job's name)")
    sub.add_argument("--state", type=_job_states, action="extend", default=[], metavar="STATE",
                     help="only jobs in this state: running, succeeded, failed, stopped, preempted, stalled or lost "
                          "(repeatable, or a comma-separated list)")
    count = sub.add_mutually_exclusive_group()
    count.add_argument("-n", type=_count, metavar="N", help="the newest N jobs (default: 20; with --json, all)")
    count.add_argument("--all", action="store_true", help="every job")
    sub.add_argument("--json", action="store_true", help="machine-readable: every field of each job, newest first")


def stop_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("job", nargs="?", metavar="JOB_ID", help=f"{JOB_HELP}; default: the newest running job")


def stacks_arguments(sub: argparse.ArgumentParser) -> None:
    job_argument(sub)
    sub.add_argument("--worker", metavar="LIST", help="these workers only: 'all' (default) or e.g. 0,2-3")
    sub.add_argument("--all", action="store_true",
                     help="show every worker's stacks whole, not only where its processes differ from the rest")
    _raw_argument(sub, "the stacks (process command lines, thread names)")


def supervisor_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("action", choices=("start", "install"),
                     help="start: adopt again every job this host keeps whose supervisor is gone (killed, a reboot); "
                          "install: run start at every boot (a systemd user unit, else a crontab @reboot line)")


def job_argument(sub: argparse.ArgumentParser) -> None:
    """A job, by default the newest running one, else the newest (as `logs` takes it)."""
    sub.add_argument("job", nargs="?", metavar="JOB_ID",
                     help=f"{JOB_HELP}; default: the newest running job, else the newest job")


def report_arguments(sub: argparse.ArgumentParser) -> None:
    job_argument(sub)
    shown = sub.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print one JSON object: wall_s, parts_s (seconds that "
                                                            "add up to wall_s), goodput, lost_progress_steps, steps, "
                                                            "attempts; no report.html")
    shown.add_argument("--serve", action="store_true",
                       help="serve the job's report page on 127.0.0.1, redrawn as the job goes, until Ctrl-C")
    sub.add_argument("--port", type=_port, metavar="N", help="with --serve: listen on port N (default: a free one)")


def logs_arguments(sub: argparse.ArgumentParser) -> None:
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


def cloud_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--zone", metavar="Z", help="default: CLOUDSDK_COMPUTE_ZONE, then gcloud's compute/zone")
    sub.add_argument("--project", metavar="P", help="default: CLOUDSDK_CORE_PROJECT, then gcloud's core/project")


def one_positional(name: str, metavar: str):
    return lambda sub: sub.add_argument(name, metavar=metavar)
