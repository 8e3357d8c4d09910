"""What each field of the job spec expects, in the words of its error messages: "expected ...".

Light (no model in it): the models' own checks (spec/model.py) and the error messages (spec/problems.py) share it.
"""

from __future__ import annotations

from podrun.spec.fields import HOST_FORMS, JUMP_FORMS
from podrun.target_kinds import registry

DURATION_EXAMPLES = "30s, 2m, 90 (seconds) or 1m30s"
VARIABLE_NAME = ("a variable name", "use letters, digits and '_', not starting with a digit")
# (what it is not, the rule) for the fields with a pattern; `*` is any list index or env key, `[key]` the key itself
NAME_RULES = {
    "name": ("a valid name", "use letters, digits, '.', '_' and '-', starting with a letter or digit"),
    "env.*.[key]": VARIABLE_NAME,
    "secret_env.*": VARIABLE_NAME,
    "notify.url_env": VARIABLE_NAME,
}
NOTIFY_URL = "url (an http:// or https:// URL) or url_env (the variable of podrun's environment that holds it), not both"
PORT = "a port number from 1 to 65535"
# what every other field takes, as an error message says it: "expected ..."
EXPECTED = {
    "target": f"a mapping with one of {', '.join(registry.names())}, such as {{local: {{workers: 2}}}}",
    **{key: text for declared in registry.kinds() for key, text in declared.expected_at().items()},
    "ssh": "a mapping such as {user: root, port: 22, identity_file: ~/.ssh/id_ed25519}",
    "ssh.user": "a user name such as root",
    "ssh.port": PORT,
    "ssh.identity_file": "the path of a private key such as ~/.ssh/id_ed25519",
    "ssh.check_host_keys": "true or false",
    "ssh.known_hosts": "the path of a known-hosts file such as ~/.ssh/cluster_known_hosts",
    "ssh.proxy_jump": JUMP_FORMS,
    "ssh.proxy_command": "a command whose stdin and stdout reach the host, such as \"ssh -W %h:%p bastion\"",
    "workdir": "a directory (relative to the spec file)",
    "setup": "a shell command such as pip install -r requirements.txt",
    "on_preempt": "a shell command such as gsutil cp train.log gs://my-bucket/",
    "run": "the command to run, such as python3 train.py (with torchrun: the script and its arguments)",
    "env": "a mapping of variable names to values, such as {WANDB_MODE: offline}",
    "env.*": "a string or number",
    "secret_env": "a list of variable names such as [WANDB_API_KEY]",
    "device": "TPU, CUDA, ROCM or CPU (in any case)",
    "torchrun": "a mapping such as {nproc_per_node: 4, port: 29500}",
    "torchrun.nproc_per_node": "a number of processes >= 1, or auto, gpu or cpu",
    "torchrun.port": PORT,
    "docker": "a mapping such as {image: us-docker.pkg.dev/my-proj/repo/xla:r2.5, args: [--shm-size=16g]}",
    "docker.image": "an image such as us-docker.pkg.dev/my-proj/repo/xla:r2.5",
    "docker.args": "a list of `docker run` arguments such as [--shm-size=16g]",
    "docker.args.*": "a `docker run` argument such as --shm-size=16g",
    "stop_grace": f"a duration from 0s to 1h such as {DURATION_EXAMPLES}",
    "stall": "a duration above 0 such as 15m, 90 (seconds) or 1h30m, or auto (with progress)",
    "progress": "a regular expression whose first group is the step, such as 'step (\\d+)', or {file: PATH}",
    "progress.pattern": "a regular expression whose first group is the step, such as 'step (\\d+)'",
    "progress.file": "the path of a file the job writes its step into, such as step.txt",
    "progress.total": "the job's last step, a whole number from 1, such as 10000",
    # a pattern with named groups (remote/step_reader.py): the epoch's and the step's, no other
    "progress.groups": "no named group but epoch and step, as in 'Epoch (?P<epoch>\\d+):.*?(?P<step>\\d+)/\\d+'",
    "progress.epoch": "a group for the step besides the epoch's, as in 'Epoch (?P<epoch>\\d+):.*?(\\d+)/\\d+'",
    "preflight": "true, false, a list of devices, versions, disk and/or network, or {checks: [...], min_free_gb: 10}",
    "preflight.checks": "a list of devices, versions, disk and/or network",
    "preflight.checks.*": "devices, versions, disk or network",
    "preflight.min_free_gb": "a number of GB from 0, such as 10",
    "preflight.network_mib": "a whole number of MiB from 1 to 4096, such as 16",
    "preflight.timeout": "a duration above 0 such as 2m or 90 (seconds)",
    "notify": "a mapping such as {url: https://hooks.slack.com/services/..., on: [failure, stall]}",
    "notify.url": "an http:// or https:// URL",
    "notify.url_env": "a variable name such as SLACK_WEBHOOK_URL",
    "notify.on": "a list of failure, preemption, stall, restart, success and/or straggler",
    "notify.on.*": "failure, preemption, stall, restart, success or straggler",
    "stragglers": "a duration above 0 such as 30s, 2m or 90 (seconds)",
    "cost": "a mapping such as {per_hour: 12.5}",
    "cost.per_hour": "a price per hour above 0, such as 12.5",
    "delete_after": "never, success or always",
    "idle_delete": "a duration above 0 such as 2h, 30m or 90 (seconds)",
    "restarts": "a mapping such as {max: 3, on: [preemption]}",
    "restarts.max": "a number of restarts from 0 to 100",
    "restarts.on": "a list of preemption, failure, stall, time_limit and/or a failure's classes (oom, collective, "
                   "hardware, config, exception, signal, lost, unknown)",
    "restarts.on.*": "preemption, failure, stall, time_limit, or a failure's class: oom, collective, hardware, config, "
                     "exception, signal, lost or unknown",
    "restarts.exit_codes": "a list of exit codes such as [42, 75]",
    "restarts.exit_codes.*": "an exit code from 1 to 255",
    "restarts.until_no_progress": "a number of attempts from 1 to 100",
    "supervisor": "a mapping such as {host: me@supervisor-vm, podrun: /opt/podrun/bin/podrun}",
    "supervisor.host": HOST_FORMS,
    "supervisor.podrun": "the path of podrun on the supervisor host, such as /opt/podrun/bin/podrun",
}

