"""A supervisor host runs a job's whole life while the laptop that started it may close: handover.py
(the laptop hands the job over), daemon.py (the supervisor host takes it and runs it), remote.py (logs,
stop, stacks and jobs of a supervised job, from the laptop), install.py (podrun on the supervisor host)."""
