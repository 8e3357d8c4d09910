"""`gcloud compute tpus tpu-vm create`'s flags that `podrun create` does not take as they are, each
with what to write instead: one line, in place of argparse's "unrecognized arguments". The flags
that mean the same in both (--accelerator-type, --version, --spot, --internal-ips, --async, --quiet,
--zone, --project) are podrun's own (cli.py). Standard library only: the create parser loads it.
"""

from __future__ import annotations

import argparse

ELSEWHERE = ("podrun create has no {flag}: create the TPU VM with gcloud (`gcloud compute tpus tpu-vm create NAME "
             "... {flag} ...`), then run on it with target.tpu.name in a spec, or `podrun exec --tpu NAME`")

BY_ACCELERATOR_TYPE = ("podrun takes an accelerator type, which names the generation and the size (--type v4 "
                       "--topology 2x2x4 is v4-32): ACCEL_TYPE or --accelerator-type")
# flag -> (whether it takes a value, what podrun takes instead; None: ELSEWHERE)
GCLOUD_ONLY: dict[str, tuple[bool, str | None]] = {
    "--reserved": (False, "podrun asks for a reservation by its name: --reservation NAME (through a queued "
                          "resource)"),
    "--preemptible": (False, "preemptible TPUs are the time-limited kind that Spot VMs replaced; podrun creates "
                             "Spot VMs: --spot"),
    "--type": (True, BY_ACCELERATOR_TYPE),
    "--topology": (True, BY_ACCELERATOR_TYPE),
    "--metadata": (True, "podrun writes the TPU VM's metadata itself (your SSH key, ssh-keys); for more, create "
                         "it with gcloud, then run on it with target.tpu.name or `podrun exec --tpu NAME`"),
    "--metadata-from-file": (True, None),
    "--network": (True, None),
    "--subnetwork": (True, None),
    "--range": (True, None),
    "--tags": (True, None),
    "--labels": (True, None),
    "--description": (True, None),
    "--data-disk": (True, None),
    "--scopes": (True, None),
    "--service-account": (True, None),
    "--shielded-secure-boot": (False, None),
    "--queue-count": (True, None),
}


class GcloudOnly(argparse.Action):
    """Notes a gcloud-only flag (`gcloud_only`), which cli refuses in one line once the parse is over."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.gcloud_only = [*(getattr(namespace, "gcloud_only", None) or []), option_string]


def add_to(parser: argparse.ArgumentParser) -> None:
    for flag, (takes_value, _) in GCLOUD_ONLY.items():
        parser.add_argument(flag, action=GcloudOnly, nargs=None if takes_value else 0, dest="gcloud_only",
                            default=(), help=argparse.SUPPRESS)


def refusal(flag: str) -> str:
    """What to write instead of gcloud's `flag`, in one line."""
    instead = GCLOUD_ONLY[flag][1]
    return f"{flag} is gcloud's: {instead}" if instead else ELSEWHERE.format(flag=flag)
