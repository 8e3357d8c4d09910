"""Many workers' channels over one stream: how the frames of Slurm's one step are cut (slurm_fanout.py,
slurm_connector.py, transport/slurm_step.py).

A frame is a header (HEADER: the channel's slot, a kind byte, the payload's length, big-endian) and
its payload. The slot is the worker's place in the step's node list (ALL: the step itself). Kinds:
  to a node      INPUT (bytes for its command's stdin), INPUT_END (its stdin ends)
  from a node    OUTPUT (its stdout), EVENTS (its stderr), EXITED (its exit code, decimal; negative:
                 the signal that killed it)
  from the login node's fanout
                 CONNECTED (the node's connector reached the fanout: its channel is open),
                 UNREACHED (it could not, why: that node runs as a step of its own),
                 LOST (its connection ended before EXITED, why), SAID (slot ALL: a line srun wrote)

Standard library only, nothing done at import: a node gets this source ahead of its connector.
"""

import struct

HEADER = struct.Struct(">IcI")  # slot, kind, payload length
ALL = 0xFFFFFFFF
INPUT, INPUT_END = b"i", b"e"
OUTPUT, EVENTS, EXITED = b"o", b"r", b"x"
CONNECTED, UNREACHED, LOST, SAID = b"c", b"u", b"l", b"d"


def pack(slot, kind, payload=b""):
    return HEADER.pack(slot, kind, len(payload)) + payload


class Frames:
    """Bytes in, whole frames out: feed() what was read, then take() each complete (slot, kind, payload)."""

    def __init__(self):
        self.pending = b""

    def feed(self, data):
        self.pending += data

    def take(self):
        frames = []
        start = 0
        while len(self.pending) - start >= HEADER.size:
            slot, kind, size = HEADER.unpack_from(self.pending, start)
            end = start + HEADER.size + size
            if len(self.pending) < end:
                break
            frames.append((slot, kind, self.pending[start + HEADER.size:end]))
            start = end
        self.pending = self.pending[start:]
        return frames
