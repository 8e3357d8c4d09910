"""A supervisor host runs a job's whole life while the laptop that started it may close: handover.py
(the laptop hands the job over), daemon.py (the supervisor host takes it and runs it), remote.py (logs,
stop, stacks and jobs of a supervised job, from the laptop), install.py (the podrun of this version on
the supervisor host, installed into its ~/.podrun/venv where it has none), greeting.py (the version
asked and answered first), early.py (the podrun remembered per host, started before the spec loads),
wheel.py (this podrun as a wheel, built from its own files and kept under PODRUN_HOME)."""
