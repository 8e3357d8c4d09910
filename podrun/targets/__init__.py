"""Targets: where a job runs. Each kind is declared by its options module (tpu_options.py,
hosts_options.py, local_options.py: what a spec and the CLI give it, what it can do; kind.py says
what a declaration holds) and run by its target module (tpu.py, hosts.py, local.py) behind base.Target;
registry.py lists the kinds. A target module is imported only when a spec names its kind, so a local
job never loads SSH or Google's libraries."""
