"""Targets: where a job runs. Each kind is declared by its module in target_kinds/ (what a spec and
the CLI give it, what it can do; target_kinds/kind.py says what a declaration holds) and run by its
target module here (tpu.py, hosts.py, local.py, slurm.py) behind base.Target; target_kinds/registry.py
lists the kinds. A target module is imported only when a spec names its kind, so a local
job never loads SSH or Google's libraries."""
