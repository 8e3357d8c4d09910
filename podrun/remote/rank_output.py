"""One torchrun rank, its output marked with its rank: torchrun starts this file in place of the
job's script (plan.py: `torchrun ... rank_output.py SCRIPT ARGS...`), with its own interpreter.

It runs SCRIPT ARGS with that same interpreter (`-u`, as torchrun would), in the process group
torchrun made for the rank, and exits as the script did (killed by the same signal, if it was: torchrun
then reports exitcode -9 for a rank that the OOM killer ended, and podrun 137). A signal that no stop
sends (SIGKILL, SIGSEGV, SIGABRT...) also gets a last line, `killed by SIGKILL`, as a shell says
`Killed`: the failure report's cause, where the script's own last line would mislead.

It does not pass signals on: torchrun signals each rank's whole process group (os.killpg), and
podrun's agent signals each process of the job by itself, so the script receives each of them once
already; this process outlives them, to pass on the script's last output. The script's stdout and
stderr come through a pipe and leave as `[rankN]:` + one line, or one redraw of a line ended by a
carriage return, each in a single write of less than PIPE_BUF bytes: two ranks never share a line,
and a progress bar stays one redrawn line (output.py). torchrun's own --tee would read each rank's
file a line at a time in text mode, turning every carriage return into a new line, and write
half-read lines that another rank's line then continues. A line that already starts with the rank's mark
in torch's own style, `[rankN]: ` (init_process_group's excepthook writes a rank's traceback so),
leaves with that mark once: `[rankN]:Traceback ...`, its indentation kept.

The agent writes this file into the job's directory on the worker before run starts.
"""

import os
import signal
import sys

OUTLIVED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
ATOMIC_WRITE = 4000  # below PIPE_BUF (4096 on Linux): the kernel never interleaves such a write
LONGEST_PENDING = 65536  # a longer run of bytes without a line end leaves as a line of its own


def main():
    prefix = ("[rank%s]:" % os.environ.get("RANK", "?")).encode()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        try:
            os.execv(sys.executable, [sys.executable, "-u"] + sys.argv[1:])
        except OSError as error:
            os.write(2, ("cannot run %s: %s\n" % (sys.executable, error)).encode())
        os._exit(127)
    os.close(write_end)
    for name in OUTLIVED:  # a handler, not SIG_IGN: the script would inherit an ignored signal
        signal.signal(getattr(signal, name), lambda signum, frame: None)
    pending = b""
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        segments, pending = split_segments(pending + chunk)
        if len(pending) >= LONGEST_PENDING:
            segments, pending = segments + [pending + b"\n"], b""
        write_marked(prefix, segments)
    if pending:
        write_marked(prefix, [pending + b"\n"])
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signal_name(signum) not in OUTLIVED:  # not a stop's: the rank's last line says what ended it
            write_marked(prefix, [b"killed by %s\n" % signal_name(signum).encode()])
        die_of(signum)
    sys.exit(os.WEXITSTATUS(status))


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal past SIGRTMIN
        return "signal %d" % signum


def die_of(signum):
    """End this process by signal `signum`, as the script ended: torchrun then reports the rank's
    exitcode as -signum (-9: an OOM kill), and podrun as 128 + signum. SIGKILL takes no handler
    (signal.signal raises OSError: a rank killed so exited 1, with this file's traceback) and needs
    none. Should the signal not end this process, it exits as a shell reports one it ended, 128 + signum."""
    if signum != signal.SIGKILL:
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)


def split_segments(data):
    """(the complete segments of data, each ending in "\\n", "\\r\\n" or "\\r", the rest). A lone "\\r"
    (a redraw starting over at the beginning of a line) is no segment; a "\\r" at the very end waits:
    it may be the first half of "\\r\\n". Each kind of line end is looked for once past the last: a
    search for either from each segment's start was a pass over the rest per line."""
    segments = []
    start = 0
    newline, carriage = data.find(b"\n"), data.find(b"\r")
    while newline >= 0 or carriage >= 0:
        end = newline if carriage < 0 or 0 <= newline < carriage else carriage
        if end == carriage:
            if end + 1 == len(data):
                break
            if data[end + 1:end + 2] == b"\n":
                end += 1
        if data[start:end + 1] != b"\r":
            segments.append(data[start:end + 1])
        start = end + 1
        if 0 <= newline < start:
            newline = data.find(b"\n", start)
        if 0 <= carriage < start:
            carriage = data.find(b"\r", start)
    return segments, data[start:]


def write_marked(prefix, segments):
    """Each segment behind the prefix (torch's own mark of the rank, the prefix and a space, left out
    where the segment starts with it), as few writes as stay atomic."""
    batch = b""
    marked_by_torch = prefix + b" "
    for segment in segments:
        if segment.startswith(marked_by_torch):
            segment = segment[len(marked_by_torch):]
        marked = prefix + segment
        if batch and len(batch) + len(marked) > ATOMIC_WRITE:
            _write_all(batch)
            batch = b""
        batch += marked
    if batch:
        _write_all(batch)


def _write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


if __name__ == "__main__":
    main()
