"""The rendezvous doctor's worker half: which address this host's name resolves to, and which
interface reaches MASTER_ADDR.

gloo advertises to its peers the address its host's name resolves to (torch's createDefaultDevice
takes the first address getaddrinfo gives for gethostname() that it can bind, and falls back to
loopback when there is none). Many images map the hostname to 127.0.0.1 in /etc/hosts: every worker
then advertises loopback, the others connect to themselves, and the job dies after a long timeout
with `Gloo connectFullMesh failed ... remote=[127.0.0.1]`. Only GLOO_SOCKET_IFNAME fixes that (and
NCCL_SOCKET_IFNAME for NCCL's sockets), and the interface's name differs per image. So where the
name resolves to loopback (or to nothing) and neither variable is set, the agent sets both to the
interface of the route to MASTER_ADDR, and its probe report says so (launch/preflight.py).

The route is the main routing table's most specific one (/proc/net/route, IPv4): worker 0 finds
its own subnet's interface for its own address, a host with a /32 address (GCE) its default
route's. The agent calls check() in its probe; the launcher imports this module for its variables.
Standard library only, Python 3.8+, nothing done at import.
"""

import os
import sys

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
RTF_UP = 0x1


def check(master_addr, env):
    """The probe's report {hostname, resolves_to ("" if it does not resolve), interface ("" if no
    route), interface_set (when both VARIABLES were set in `env`, the step's environment)}."""
    import _socket  # 0.8 ms, where socket (enums, selectors) costs 17 ms here; only a first step asks

    hostname = os.uname().nodename
    try:
        # as bytes: a str host goes through Python's idna codec first, whose import (re, enum,
        # stringprep) cost 10 ms of every probe, 80% of it; a host name is ASCII
        resolves_to = _socket.getaddrinfo(hostname.encode(), None, 0, _socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError):
        resolves_to = ""
    interface = route_interface(master_addr)
    report = {"hostname": hostname, "resolves_to": resolves_to, "interface": interface}
    chosen = dict(os.environ, **env)  # the worker's own environment counts as the job's
    if is_loopback(resolves_to) and interface not in ("", "lo") and not any(chosen.get(name) for name in VARIABLES):
        for name in VARIABLES:
            env[name] = interface
        report["interface_set"] = interface
    return report


def is_loopback(address):
    """Whether gloo would advertise loopback for a host whose name resolves to `address`."""
    return address == "" or address == "::1" or address.startswith("127.")


def route_interface(address, routes="/proc/net/route"):
    """The interface of the most specific route up to an IPv4 `address` in the kernel's main routing
    table (`routes`); "" if none."""
    try:
        octets = bytes(int(part) for part in address.split("."))
    except ValueError:  # not IPv4 (an IPv6 address), or not an address
        return ""
    if len(octets) != 4:
        return ""
    wanted = int.from_bytes(octets, sys.byteorder)  # the table prints each address as the kernel holds it
    best = None  # (prefix length, -metric), interface
    try:
        table = open(routes)
    except OSError:  # not Linux
        return ""
    with table:
        next(table, None)  # the header
        for line in table:
            fields = line.split()
            if len(fields) < 8 or not int(fields[3], 16) & RTF_UP:
                continue
            destination, mask = int(fields[1], 16), int(fields[7], 16)
            if wanted & mask == destination:
                rank = (bin(mask).count("1"), -int(fields[6]))
                if best is None or rank > best[0]:
                    best = (rank, fields[0])
    return best[1] if best else ""
