"""asyncssh, imported once for every module that uses it (transport/ssh.py, client_keys.py, hops.py), with
what podrun changes in it, and the warnings it raises kept off the user's terminal (third_party.py)."""

import contextlib
import ctypes.util
import socket

from podrun.third_party import ignore_warnings_of


def _import_asyncssh():
    """asyncssh looks for liboqs (for the sntrup761 key exchange) with ctypes.util.find_library,
    which runs `ldconfig -p` and gcc: 30 ms of every `podrun exec`. podrun does not offer sntrup761
    (curve25519 and ML-KEM, through OpenSSL, cost less), so the search is skipped."""
    from cryptography.utils import CryptographyDeprecationWarning

    # asyncssh still names DSA's key types, which cryptography 51 deprecates: ten lines at every import
    ignore_warnings_of("asyncssh", CryptographyDeprecationWarning)
    find_library = ctypes.util.find_library
    ctypes.util.find_library = lambda name: None if name in ("oqs", "liboqs") else find_library(name)
    try:
        import asyncssh
    finally:
        ctypes.util.find_library = find_library
    return asyncssh


def _acknowledge_at_once(asyncssh) -> None:
    """What comes over a connection is acknowledged (TCP) as soon as it is read, not up to 40 ms later.
    sshd sends several small packets in a row where a command starts or ends (after the login: its notes
    and host keys, then the first channel's confirmation; a command's output, then its exit), and with
    Nagle's algorithm, which sshd leaves on for commands without a terminal, each waits until the one
    before is acknowledged: a delayed ACK here cost ~45 ms, at most connections' first command on the
    Slurm lab (the first `scontrol` of a start took 50 ms, 3 ms without it). Setting TCP_QUICKACK once
    the data is read sends the pending acknowledgement now (Linux; elsewhere nothing changes)."""
    quick_ack = getattr(socket, "TCP_QUICKACK", None)
    if quick_ack is None:
        return
    from asyncssh.connection import SSHClientConnection

    receive = SSHClientConnection.data_received

    def data_received(self, data: bytes, datatype=None) -> None:
        receive(self, data, datatype)
        if (sock := self._transport and self._transport.get_extra_info("socket")) is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, quick_ack, 1)

    SSHClientConnection.data_received = data_received  # type: ignore[method-assign]


asyncssh = _import_asyncssh()
_acknowledge_at_once(asyncssh)
