"""The commands behind the CLI: exec and validate (exec.py), logs, jobs and stop (jobs.py), the
TPU VM commands (tpu.py). Each parses nothing: cli.py hands it its arguments."""
