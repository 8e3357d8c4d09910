"""podrun's own settings, read from the launcher's environment: each one's name, default and what it sets,
in one place. docs/limits.md's table is this (tests/docs/test_settings.py holds it to it), and a supervisor
host gets with a job those marked `with_the_job`. Each is read where it is used; a value podrun cannot use
is one line naming the variable, before anything of the job starts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # as docs/limits.md shows it
    what: str  # what it sets, in Markdown (its links relative to docs/)
    with_the_job: bool = True  # handed to a supervisor host with a job (supervisor/handover.py)


SETTINGS = (
    Setting("PODRUN_HOME", "`~/.podrun`", "the job store, the known-hosts file, local workers' directories",
            with_the_job=False),
    Setting("PODRUN_RELAY_FANOUT", "4", "how many workers each worker relays the code to; 0 sends to each directly"),
    Setting("PODRUN_ACCELERATOR_FILES", "`/dev/accel*:/dev/vfio/[0-9]*:/tmp/libtpu_lockfile`",
            "what the TPU-in-use check looks for ([the TPU is in use](troubleshooting.md#the-tpu-is-in-use))"),
    Setting("PODRUN_API_TIMEOUT", "30", "seconds a Cloud TPU API request may take ([TPU](targets/tpu.md))"),
    Setting("PODRUN_WAIT_TIMEOUT", "1800", "seconds `create` and `delete` wait for Google's operation "
                                           "([TPU](targets/tpu.md))"),
    Setting("PODRUN_LOST_WORKER_WAIT", "180", "seconds a lost TPU worker is judged against the API "
            "([preemption](targets/tpu.md#a-tpus-whole-life-queued-resources-spot-preemption))"),
    Setting("PODRUN_TPU_WATCH_INTERVAL", "45", "seconds between reads of a TPU node while `run` goes on"),
    Setting("PODRUN_IDLE_POLL_S", "15", "seconds between an idle TPU VM's looks for a job on it (`idle_delete`, "
                                        "[TPU](targets/tpu.md))"),
    Setting("PODRUN_RESTART_BACKOFF", "1", "seconds before the first failure or stall restart, doubled for each in "
                                           "a row"),
    Setting("PODRUN_STALL_AUTO_FLOOR", "300", "seconds `stall: auto` waits at least for a step "
            "([progress](running-jobs.md#a-hung-job-that-still-prints-progress))"),
    Setting("PODRUN_STALL_AUTO_CAP", "7200", "seconds `stall: auto` waits at most, and until three steps were timed"),
    Setting("PODRUN_SSH_HANDSHAKES", "32", "SSH handshakes in flight at once ([hosts](targets/hosts.md))"),
    Setting("PODRUN_CONTROL_TREE", "1024", "from how many SSH workers podrun reaches them through relay workers; "
            "`off`: never ([the control tree](targets/hosts.md#many-hosts-the-control-tree))"),
    Setting("PODRUN_CONTROL_TREE_FANOUT", "32", "how many workers each relay worker connects to"),
    Setting("PODRUN_SSH_CONNECT_RETRY", "60", "seconds a connection dropped before authentication is tried again "
                                              "([hosts](targets/hosts.md))"),
    Setting("PODRUN_SLURM_STEPS", "one", "`per-node`: each Slurm worker's agent a step of its own, not all of them "
                                         "one srun ([Slurm](targets/slurm.md))"),
    Setting("PODRUN_SLURM_LOGIN_ADDRESS", "the login node's", "the address Slurm's nodes connect back to for the one "
                                                              "step ([Slurm](targets/slurm.md))"),
    Setting("PODRUN_SUPERVISOR_AWAY", "900", "seconds a supervisor host's detached job runs on without its "
            "supervisor following it; then its workers stop it "
            "([close the laptop](unattended.md#close-the-laptop-a-supervisor-host))"),
    Setting("PODRUN_SUPERVISOR_CHECK_TIMEOUT", "30", "seconds a [supervisor host](unattended.md#close-the-laptop-a-"
            "supervisor-host) may take to say which podrun it has", with_the_job=False),
    Setting("PODRUN_SUPERVISOR_INSTALL_WAIT", "600", "seconds a first handover waits for another one's install of "
            "podrun on the same supervisor host", with_the_job=False),
    Setting("PODRUN_SUPERVISOR_WARM", "1800", "seconds a supervisor host's [warm podrun](unattended.md#close-the-"
            "laptop-a-supervisor-host) waits for the next command before it ends; `off`: none is started",
            with_the_job=False),
)


def markdown_table() -> str:
    """docs/limits.md's table of the settings."""
    rows = [f"| `{setting.name}` | {setting.default} | {setting.what} |" for setting in SETTINGS]
    return "\n".join(["| variable | default | what it sets |", "| --- | --- | --- |", *rows]) + "\n"


def handed_over() -> tuple[str, ...]:
    """The settings a supervisor host applies to a job as the laptop would."""
    return tuple(setting.name for setting in SETTINGS if setting.with_the_job)
