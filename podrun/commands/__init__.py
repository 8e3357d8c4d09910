"""The commands behind the CLI: exec and validate (exec.py), logs, jobs
and stop (jobs.py), stacks (stacks.py), cp (copy.py), ssh (shell.py), disk (disk.py), the TPU VM
commands (tpu.py). Each parses nothing: cli.py hands it its arguments."""
