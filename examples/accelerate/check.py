"""Hugging Face accelerate's own test script (accelerate.test_utils.scripts.test_script), run from a folder
every worker shares: one of its checks counts the lines its processes append to one file in the working
directory, as on a cluster whose home every node mounts. There, `run: -m accelerate.test_utils.scripts.test_script`
is enough; local workers each run in a folder of their own."""

import os
import runpy
import tempfile

shared = os.path.join(tempfile.gettempdir(), f"accelerate-{os.environ['PODRUN_JOB_ID']}")
os.makedirs(shared, exist_ok=True)
os.chdir(shared)
runpy.run_module("accelerate.test_utils.scripts.test_script", run_name="__main__")
