"""The commands behind the CLI: exec and validate (exec.py), logs (logs.py), jobs (jobs.py), stop (stop.py),
stacks (stacks.py), report (report.py), cp (copy.py), ssh (shell.py), disk (disk.py), the TPU VM commands
(tpu.py). Each parses nothing: cli.py hands it its arguments (exec's as launch/exec_options.ExecOptions)."""
