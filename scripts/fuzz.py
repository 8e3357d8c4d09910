"""Fuzz podrun: the suite's property tests (every @given test) with random seeds, until time is up.

CI runs the same properties derandomized (a fixed seed, tests/conftest.py), so landing never
depends on luck. This script is where new failures are found: each round runs the properties with
PODRUN_FUZZ_SCALE times CI's examples and a fresh random seed. A failure prints the seed and
hypothesis's falsifying example; make that example an @example of the test, then fix the code.

    python scripts/fuzz.py --minutes 10        # before calling a change done
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10, help="keep starting rounds until this much time has passed")
    parser.add_argument("--scale", type=int, default=10, help="examples per property, as a multiple of CI's")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, e.g. a test file or -k EXPR")
    args = parser.parse_args()
    env = {**os.environ, "PODRUN_HYPOTHESIS_PROFILE": "fuzz", "PODRUN_FUZZ_SCALE": str(args.scale)}
    deadline = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    rounds = 0
    print(f"{'round':>5}  {'seed':>10}  {'seconds':>7}  result", flush=True)
    while time.monotonic() < deadline:
        seed = random.getrandbits(32)
        round_started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "hypothesis",
             f"--hypothesis-seed={seed}", *args.pytest_args],
            cwd=REPO, env=env, capture_output=True, text=True)
        rounds += 1
        outcome = "ok" if result.returncode == 0 else f"FAILED (pytest exit {result.returncode})"
        print(f"{rounds:>5}  {seed:>10}  {time.monotonic() - round_started:>7.1f}  {outcome}", flush=True)
        if result.returncode != 0:
            print(result.stdout[-20000:], result.stderr[-5000:], sep="\n")
            print(f"fuzz: seed {seed} found a failure (rerun: PODRUN_HYPOTHESIS_PROFILE=fuzz PODRUN_FUZZ_SCALE="
                  f"{args.scale} python -m pytest -m hypothesis --hypothesis-seed={seed}); make the falsifying "
                  f"example an @example of its test and fix the code")
            return 1
    print(f"fuzz: {rounds} rounds x {args.scale}x CI's examples, no failure in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
