"""A training loop that survives preemption: it saves its progress to CHECKPOINT_DIR after every step
and on SIGTERM, and starts from there when it runs again (PODRUN_ATTEMPT > 0 after a restart).

On a spot TPU put CHECKPOINT_DIR on storage that outlives the VM (a bucket mounted with gcsfuse, a
persistent disk): a preempted VM's own disk is gone with it. Standard library only.
usage: train.py STEPS (STEP_SECONDS sets the time each step takes)
"""

import json
import os
import signal
import sys
import time

worker = os.environ["PODRUN_WORKER"]
checkpoint = os.path.join(os.environ.get("CHECKPOINT_DIR", "checkpoints"), f"worker-{worker}.json")


def load() -> int:
    try:
        with open(checkpoint) as handle:
            return json.load(handle)["step"]
    except FileNotFoundError:
        return 0


def save(step: int) -> None:
    os.makedirs(os.path.dirname(checkpoint) or ".", exist_ok=True)
    with open(checkpoint + ".tmp", "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(checkpoint + ".tmp", checkpoint)  # whole, or the previous one


def main() -> None:
    steps, step_seconds = int(sys.argv[1]), float(os.environ.get("STEP_SECONDS", "0.2"))
    step = load()
    print(f"attempt {os.environ.get('PODRUN_ATTEMPT', '0')}: "
          f"{'resuming at' if step else 'starting from'} step {step} of {steps}", flush=True)

    def on_sigterm(signum, frame):
        save(step)
        os.write(1, f"SIGTERM: saved step {step}\n".encode())
        os._exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    while step < steps:
        time.sleep(step_seconds)  # the work of one step
        step += 1
        save(step)
        print(f"step {step}", flush=True)
    print(f"done: {steps} steps", flush=True)


if __name__ == "__main__":
    main()
