"""Running a planned job: the step machine (launcher.py), the launcher's half of the agent
protocol (steps.py), the checks before run (preflight.py), and reaching a detached job again
(detached.py)."""
