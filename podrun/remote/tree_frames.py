"""How the launcher and a control-tree relay (tree_relay.py) frame what they send each other: a kind
byte, a 4-byte id (a worker behind the relay, or one of its commands), a 4-byte payload length, the
payload. Built-in modules only; the launcher imports this module, a relay gets it ahead of its script.
"""

import struct

HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 1 << 20  # more is a broken stream, never a frame: writers split what they send into chunks
CHUNK = 1 << 16

# from the launcher
OPEN, START, INPUT, EOF, CLOSE = 1, 2, 3, 4, 5
# from the relay
OPENED, FAILED, LOST, STDOUT, STDERR, EXIT = 11, 12, 13, 14, 15, 16


def frame(kind, ident, payload=b""):
    return HEADER.pack(kind, ident, len(payload)) + payload


def frames(kind, ident, data):
    """`data` as frames of at most CHUNK bytes each."""
    return b"".join(frame(kind, ident, data[start:start + CHUNK]) for start in range(0, len(data), CHUNK))


class Frames:
    """Frames out of a byte stream read in pieces, for code without asyncio (slurm_fanout.py,
    slurm_connector.py): feed() what was read, then take() each whole (kind, ident, payload)."""

    def __init__(self):
        self.pending = b""

    def feed(self, data):
        self.pending += data

    def take(self):
        whole = []
        start = 0
        while len(self.pending) - start >= HEADER.size:
            kind, ident, size = HEADER.unpack_from(self.pending, start)
            if size > MAX_PAYLOAD:
                raise ValueError("a frame of %d bytes: the stream is broken" % size)
            end = start + HEADER.size + size
            if len(self.pending) < end:
                break
            whole.append((kind, ident, self.pending[start + HEADER.size:end]))
            start = end
        self.pending = self.pending[start:]
        return whole
