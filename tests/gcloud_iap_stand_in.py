"""A stand-in for `gcloud compute start-iap-tunnel INSTANCE PORT --listen-on-stdin`, put first on PATH
as `gcloud` by the tests (test_tpu_iap.py, the `iap` fixture); every other gcloud command goes to the
real gcloud (PODRUN_TEST_REAL_GCLOUD).

What Google's side does, it does here: IAP resolves INSTANCE in the project and zone through Compute
Engine (`instances.get` of the TPU API stand-in's compute endpoint, CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE,
with the bearer token of CLOUDSDK_AUTH_ACCESS_TOKEN_FILE) and connects to its nic0 address from its own
range (35.235.240.0/20 at Google; here the network namespace PODRUN_TEST_IAP_NETNS, an address of its
own on the lab's bridge), to port 22 only, as the firewall rule IAP needs allows. stdin and stdout
then carry the connection, as `--listen-on-stdin` makes them.

It takes its arguments as the real gcloud parses them (checked against it in test_tpu_iap.py) and
refuses what the real one refuses, with its words: unknown flags, a port out of range. It is stricter
in two places, both where a ProxyCommand recorded in a job must not depend on the shell that runs it
later: the zone and the project must be given as flags (the real one falls back to gcloud's
properties), and it serves only --listen-on-stdin (without it the real one listens on a local port,
which as a ProxyCommand hangs). Every call is appended to PODRUN_TEST_IAP_LOG as a JSON list of its
arguments, and what it refused says so on stderr with exit 1 (2 for usage), as gcloud does.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

COMMAND = "gcloud.compute.start-iap-tunnel"
CLONE_NEWNET = 0x40000000
SSH_PORT = 22  # the IAP firewall rule opens tcp:22 (README: No external IPs: IAP)


def refuse(message: str, code: int = 1) -> None:
    sys.stderr.write(f"ERROR: ({COMMAND}) {message}\n")
    raise SystemExit(code)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        refuse(message, 2)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="gcloud compute start-iap-tunnel", add_help=False)
    parser.add_argument("instance")
    parser.add_argument("port")
    parser.add_argument("--listen-on-stdin", action="store_true")
    parser.add_argument("--local-host-port")
    parser.add_argument("--project")
    parser.add_argument("--zone")
    parser.add_argument("--verbosity", choices=["debug", "info", "warning", "error", "critical", "none"])
    parser.add_argument("--iap-tunnel-disable-connection-check", action="store_true")
    args = parser.parse_args(argv)
    if not args.port.isdigit() or not 1 <= int(args.port) <= 65535:
        refuse(f"argument INSTANCE_PORT: Expected integer between 1 and 65535, Received: {args.port}", 2)
    if args.listen_on_stdin and args.local_host_port:
        refuse("argument --listen-on-stdin: At most one of --listen-on-stdin | --local-host-port may be specified.", 2)
    return args


def nic0_address(project: str, zone: str, instance: str) -> str:
    """What IAP resolves the instance to: Compute Engine's instances.get, its nic0's networkIP."""
    base = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"].rstrip("/")
    token = Path(os.environ["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"]).read_text().strip()
    request = urllib.request.Request(f"{base}/projects/{project}/zones/{zone}/instances/{instance}",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            found = json.load(answer)
    except urllib.error.HTTPError:
        refuse("Error while connecting [4047: 'Failed to lookup instance'].")
    return next(nic["networkIP"] for nic in found["networkInterfaces"] if nic["name"] == "nic0")


def enter_network_namespace(path: str) -> None:
    """setns(2) into the network namespace at `path` (os.setns is Python 3.12's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path) as namespace:
        if libc.setns(namespace.fileno(), CLONE_NEWNET) != 0:
            refuse(f"the stand-in cannot enter {path}: {os.strerror(ctypes.get_errno())}")


def relay(connection: socket.socket) -> None:
    """stdin to the connection, the connection to stdout, until both ends are done."""
    def upstream() -> None:
        while data := os.read(0, 65536):
            connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    while data := connection.recv(65536):
        os.write(1, data)


def main(argv: list[str]) -> None:
    if argv[:2] != ["compute", "start-iap-tunnel"]:
        os.execv(os.environ["PODRUN_TEST_REAL_GCLOUD"], ["gcloud", *argv])
    with open(os.environ["PODRUN_TEST_IAP_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\n")
    args = parse(argv[2:])
    if not args.listen_on_stdin:
        refuse("this stand-in serves --listen-on-stdin tunnels only (a ProxyCommand's)")
    if not args.project:
        refuse("The required property [project] is not currently set (the stand-in takes it only from --project).")
    if not args.zone:
        refuse(f"Underspecified resource [{args.instance}]. Specify the [--zone] flag.")
    address = nic0_address(args.project, args.zone, args.instance)
    if int(args.port) != SSH_PORT:
        refuse("Error while connecting [4003: 'failed to connect to backend'].")  # the firewall allows tcp:22 only
    enter_network_namespace(os.environ["PODRUN_TEST_IAP_NETNS"])  # IAP's own range connects, not the caller's machine
    try:
        connection = socket.create_connection((address, int(args.port)), timeout=10)
    except OSError:
        refuse("Error while connecting [4003: 'failed to connect to backend'].")
    connection.settimeout(None)
    relay(connection)


if __name__ == "__main__":
    main(sys.argv[1:])
