"""podrun: one YAML job spec, run on every worker of a TPU pod, an SSH cluster or local CPU workers."""

__version__ = "0.1.0"
