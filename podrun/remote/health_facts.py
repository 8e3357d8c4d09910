"""What preflight's devices, versions and disk checks read on this worker (launch/health.py), run by the
job's own python3 (its source on stdin), so that the versions are those the job will import.

argv DIRECTORY DEVICES: DIRECTORY is where the job runs (its free space is measured at the nearest
directory that exists); DEVICES is JSON: {"files": PATTERNS} (a TPU's chips), any other mapping (GPUs, which
nvidia-smi lists), or null.
Prints one JSON line: python, frameworks (each installed one's version, read from its package metadata:
nothing is imported), free_bytes, and with DEVICES devices (how many there are; None where they cannot be
counted, devices_error saying why) and busy (what holds them).

Standard library only, Python 3.8+.
"""

import glob
import json
import os
import platform
import subprocess
import sys

# the packages whose versions must agree across the workers, where any worker has them
FRAMEWORKS = ("torch", "torch_xla", "jax", "jaxlib", "libtpu", "tensorflow", "lightning", "accelerate",
              "deepspeed", "transformers", "numpy")
NVIDIA_SMI_TIMEOUT_S = 20


def frameworks():
    from importlib import metadata

    found = {}
    for name in FRAMEWORKS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def free_bytes(directory):
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def tpu_devices(patterns):
    """The TPU chips' device files (/dev/accel0 ... or /dev/vfio/0 ...), lock files left out."""
    return [path for pattern in patterns.split(":") if pattern.startswith("/dev/") for path in glob.glob(pattern)]


def gpu_devices():
    """devices: how many GPUs nvidia-smi lists (None where it cannot: devices_error says why), busy: the
    compute processes on them."""
    try:
        listed = _nvidia_smi("-L")
        apps = _nvidia_smi("--query-compute-apps=pid,process_name", "--format=csv,noheader")
    except (OSError, subprocess.SubprocessError) as error:
        return {"devices": None, "busy": [], "devices_error": "nvidia-smi: %s" % (getattr(error, "strerror", None) or error)}
    return {"devices": sum(line.startswith("GPU ") for line in listed.splitlines()),
            "busy": [line.strip() for line in apps.splitlines() if line.strip()]}


def _nvidia_smi(*args):
    return subprocess.run(("nvidia-smi",) + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout.decode(errors="replace")


def main():
    directory, devices = sys.argv[1], json.loads(sys.argv[2])
    facts = {"python": platform.python_version(), "frameworks": frameworks(),
             "free_bytes": free_bytes(os.path.expanduser(directory))}
    if devices and "files" in devices:  # a TPU's chips; what holds them, the agent's probe finds (tpu_holders.py)
        facts.update(devices=len(tpu_devices(devices["files"])), busy=[])
    elif devices:
        facts.update(gpu_devices())
    print(json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
