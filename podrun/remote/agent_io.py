"""The agent's side of its channel to the launcher: the step and the control lines it reads on stdin
(ControlInput), the JSON events it writes on stderr (emit), and the descriptors its loop waits on
(Poller). The protocol is agent.py's. Standard library only, Python 3.8+, nothing done at import.
"""

import os
import select

JSON_ESCAPES = {**{code: "\\u%04x" % code for code in range(32)}, ord('"'): '\\"', ord("\\"): "\\\\"}


def emit(**event):
    try:
        # a file name that is not UTF-8 (os.fsdecode's surrogates) goes out as its own bytes
        os.write(2, (to_json(event) + "\n").encode(errors="surrogateescape"))
    except OSError:
        pass  # the launcher is gone; the files in the job directory tell the story


def to_json(flat):
    """A flat dict of str, int, float, bool and None as JSON."""
    def value(item):
        if item is None:
            return "null"
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, str):
            return '"%s"' % item.translate(JSON_ESCAPES)
        if isinstance(item, float):
            return repr(item)
        return str(int(item))
    return "{%s}" % ", ".join("%s: %s" % (value(key), value(item)) for key, item in flat.items())


class ControlInput:
    """Unbuffered lines from fd 0, so it can be watched with select next to the output pipe."""

    def __init__(self):
        self.pending = b""

    def read_line(self):
        while b"\n" not in self.pending:
            self._read_more()
        line, self.pending = self.pending.split(b"\n", 1)
        return line

    def read_exactly(self, size):
        while len(self.pending) < size:
            self._read_more()
        data, self.pending = self.pending[:size], self.pending[size:]
        return data

    def _read_more(self):
        chunk = os.read(0, 65536)
        if not chunk:
            raise SystemExit("podrun agent: no step description on stdin")
        self.pending += chunk

    def wait_for_go(self, timeout):
        """What follows "go" on its line (worker 0's watch address, or nothing), once it arrives;
        None on "stop", the end of input, or `timeout` seconds without any line. Lines behind it
        stay buffered."""
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                command, _, argument = line.strip().decode(errors="replace").partition(" ")
                if command in ("go", "stop"):
                    return argument if command == "go" else None
            if not select.select([0], [], [], timeout)[0]:
                emit(event="error", message="no word from the launcher for %gs while waiting to start" % timeout)
                return None
            chunk = os.read(0, 4096)
            if not chunk:
                return None
            self.pending += chunk

    def read_commands(self):
        """The complete lines available now, or None at end of input."""
        chunk = os.read(0, 4096)
        if not chunk:
            return None
        self.pending += chunk
        return self.buffered_commands()

    def buffered_commands(self):
        """The complete lines already read but not yet handled: a "stop" sent right behind the step
        arrives in the same read as it, and poll will not report it again."""
        *lines, self.pending = self.pending.split(b"\n")
        return [line.strip().decode(errors="replace") for line in lines]



class Poller:
    """select.poll keyed by names: the selectors module would cost the agent's start-up more."""

    def __init__(self):
        self.poll_object = select.poll()
        self.names = {}

    def register(self, fd, name):
        self.poll_object.register(fd, select.POLLIN)
        self.names[fd] = name

    def unregister(self, fd):
        self.poll_object.unregister(fd)

    def poll(self, timeout):
        """(name, descriptor) of those ready to read (or closed); timeout in seconds, None: no limit."""
        events = self.poll_object.poll(None if timeout is None else timeout * 1000)
        return [(self.names[fd], fd) for fd, _ in events]




def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def try_write_all(fd, data):
    try:
        write_all(fd, data)
        return True
    except OSError:
        return False
