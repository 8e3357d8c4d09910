"""How the launcher and the worker-side scripts frame what they send each other.

A message is a decimal byte count, a newline, then that many bytes of marshal format 4 (readable by
every Python 3.4+): the agent's step, the relay receiver's configuration and its children. Shipped
code travels as frames: a kind byte (b"z" zlib-compressed, b"r" raw, b"e" the end), a 4-byte
big-endian payload length (FRAME_HEADER, a struct format), the payload.

The launcher imports this module; a worker gets its source sent ahead of the script that uses it
(transport.script_source), registered as the module `podrun_remote_framing`. Built-in modules only:
the agent starts on every worker for every step.
"""

import marshal

MARSHAL_VERSION = 4
FRAME_HEADER = ">cI"  # kind, payload length


def message(content):
    """The framed bytes of a message (dicts, lists, strings, numbers)."""
    blob = marshal.dumps(content, MARSHAL_VERSION)
    return b"%d\n" % len(blob) + blob


def read_message(reader):
    """The next message from `reader`, which has read_line() and read_exactly(size)."""
    return marshal.loads(reader.read_exactly(int(reader.read_line())))
