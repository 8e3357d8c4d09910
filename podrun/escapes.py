"""What others wrote (the workers' output, their stacks, a supervisor host's words), made harmless for
the user's terminal: what every path to it (terminal.Terminal, say(), `podrun stacks`, a supervisor's
relay) passes its text through.

A terminal acts on control characters. ESC begins sequences that set the window's title (OSC 0),
write the clipboard (OSC 52), clear the screen, move the cursor or reset the terminal (CSI, ESC c);
their 8-bit forms, the C1 controls U+0080..U+009F (CSI is U+009B, OSC U+009D), do the same on many
terminals, and so do the bytes 0x80..0x9F on a terminal that is not in UTF-8. BEL rings; backspace,
a lone carriage return and DEL write over text shown. As `less -R` does, only SGR sequences
(`ESC [ digits ; : m`: colours, bold) pass, and only where colour is wanted; every other control
shows as `less` shows it: C0 and DEL in caret notation (ESC `^[`, BEL `^G`), a C1 control as
`<U+009B>`, a byte that is not UTF-8 in 0x80..0x9F as `<9B>`. So nothing printed acts on the terminal,
and what was tried is seen. Tab, newline and a carriage return before a newline pass; the other
bytes that are not UTF-8 pass too (a UTF-8 terminal shows them as U+FFFD).

Where colour is not wanted (a pipe, a file, NO_COLOR, TERM=dumb: output.colour_wanted) the SGR
sequences go too: output to a pipe is plain text (the CLI's contract), and a pipe often ends at a terminal
anyway (`| tee run.txt`, `> run.txt` then `cat run.txt`).

Fast on the hot path (every line of every worker): a line of ASCII without a control character,
most lines, costs two C-level passes over its bytes (isascii, translate), and no regular expression.
"""

from __future__ import annotations

import functools
import re

SGR = r"\x1b\[[0-9;:]*m"
# what a terminal acts on, but tab, newline, and a carriage return that a newline follows
C0_CONTROLS = r"\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
C1_CONTROLS = r"[\x80-\x9f]"
C1_IN_UTF8 = rb"\xc2[\x80-\x9f]"
NOT_UTF8_C1 = r"[\udc80-\udc9f]"  # bytes 0x80..0x9f that are not part of a UTF-8 character (surrogateescape)
SGR_BYTES = SGR.encode()
BYTES_CONTROLS = f"({SGR})|{C0_CONTROLS}".encode()  # an ASCII text's
TEXT_CONTROLS = f"({SGR})|{C0_CONTROLS}|{C1_CONTROLS}|{NOT_UTF8_C1}"
ASCII_CONTROLS = bytes([*range(0x09), *range(0x0b, 0x20), 0x7f])  # \r too: the regex keeps it before \n
# the end of a piece of a stream that may be a sequence or character cut short (Stream holds it back);
# a longer run of SGR parameters is not held, and shows as text
UNFINISHED = (rb"(?:\x1b(?:\[[0-9;:]{0,64})?|\r"
              rb"|[\xc0-\xdf]|[\xe0-\xef][\x80-\xbf]?|[\xf0-\xf7][\x80-\xbf]{0,2})\Z")
UNFINISHED_MAX = 2 + 64  # its longest match



def shown(data: bytes, colour: bool) -> bytes:
    """`data` (a line, or a whole text) as the user's terminal may get it; `colour`: keep SGR sequences."""
    if _harmless(data):
        return data
    plain = _compiled(SGR_BYTES).sub(b"", data)  # a coloured line, the next most common: one substitution, in C
    if _harmless(plain):
        return data if colour else plain
    if data.isascii():
        return _compiled(BYTES_CONTROLS).sub(_BYTES_SHOWN[colour], data)
    text = data.decode("utf-8", "surrogateescape")
    return _compiled(TEXT_CONTROLS).sub(_TEXT_SHOWN[colour], text).encode("utf-8", "surrogateescape")


def shown_text(text: str, colour: bool) -> str:
    """As shown(), for text already decoded."""
    if text.isascii() and len(text.encode().translate(None, ASCII_CONTROLS)) == len(text):
        return text
    return _compiled(TEXT_CONTROLS).sub(_TEXT_SHOWN[colour], text)


class Stream:
    """A stream that arrives in pieces (a supervisor's output, relayed), shown as it comes: what may be a
    sequence or a character cut at a piece's end waits for the next piece."""

    def __init__(self, colour: bool):
        self.colour = colour
        self.held = b""

    def feed(self, piece: bytes) -> bytes:
        data = self.held + piece
        cut = _compiled(UNFINISHED).search(data, max(0, len(data) - UNFINISHED_MAX))
        end = cut.start() if cut else len(data)
        self.held = data[end:]
        return shown(data[:end], self.colour)

    def end(self) -> bytes:
        rest, self.held = self.held, b""
        return shown(rest, self.colour)


def _harmless(data: bytes) -> bool:
    """Whether `data` holds nothing a terminal acts on: no control character, and valid UTF-8 (else a
    byte in 0x80..0x9f could be read as a C1 control) without a C1 control (U+0080..U+009F: \\xc2\\x80..)."""
    if len(data.translate(None, ASCII_CONTROLS)) != len(data):
        return False
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return b"\xc2" not in data or _compiled(C1_IN_UTF8).search(data) is None


@functools.cache
def _compiled(pattern: str | bytes) -> re.Pattern:
    """Compiled where first used: `podrun jobs` imports this module (through output.py) and never needs
    them, and each compile would cost it 0.1 ms."""
    return re.compile(pattern)


def _visible(char: str) -> str:
    """How `less` shows a control character: `^[`, `^?`, `<U+009B>`; a byte that is not UTF-8: `<9B>`."""
    code = ord(char)
    if code < 0x20 or code == 0x7f:
        return "^" + chr(code ^ 0x40)
    if code >= 0xdc80:
        return f"<{code - 0xdc00:02X}>"
    return f"<U+{code:04X}>"


def _text_shown(match: re.Match[str], colour: bool) -> str:
    if match[1] is not None:
        return match[1] if colour else ""
    return _visible(match[0])


def _bytes_shown(match: re.Match[bytes], colour: bool) -> bytes:
    if match[1] is not None:
        return match[1] if colour else b""
    return _visible(match[0].decode()).encode()


_BYTES_SHOWN = {colour: functools.partial(_bytes_shown, colour=colour) for colour in (False, True)}
_TEXT_SHOWN = {colour: functools.partial(_text_shown, colour=colour) for colour in (False, True)}
