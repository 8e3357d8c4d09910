"""Running a job: from this machine, with exec's flags (run_here.py, exec_options.py); the step
machine (launcher.py) and how it ends (endings.py), the launcher's half of the agent protocol
(steps.py), the checks before run (preflight.py), reaching a detached job again (detached.py), a
job's whole life with its restarts (lifecycle.py, restart_policy.py), whether its capacity went away
(judgment.py), stalls (stall.py) and the workers' stacks (stacks.py)."""
