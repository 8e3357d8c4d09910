"""asyncssh, imported once for every module that uses it (transport/ssh.py, client_keys.py)."""

import ctypes.util


def _import_asyncssh():
    """asyncssh looks for liboqs (for the sntrup761 key exchange) with ctypes.util.find_library,
    which runs `ldconfig -p` and gcc: 30 ms of every `podrun exec`. podrun does not offer sntrup761
    (curve25519 and ML-KEM, through OpenSSL, cost less), so the search is skipped."""
    find_library = ctypes.util.find_library
    ctypes.util.find_library = lambda name: None if name in ("oqs", "liboqs") else find_library(name)
    try:
        import asyncssh
    finally:
        ctypes.util.find_library = find_library
    return asyncssh


asyncssh = _import_asyncssh()
