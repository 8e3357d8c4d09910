"""Unit tests of the line splitter every live view and `podrun logs` go through."""

from __future__ import annotations

import io

from podrun.terminal import Terminal
from podrun.worker_output import MAX_LINE, WorkerOutput


def split(*chunks: bytes, index: int = 2) -> tuple[bytes, bytes]:
    screen, log = io.BytesIO(), io.BytesIO()
    output = WorkerOutput(index, Terminal(screen), log)
    for chunk in chunks:
        output.feed(chunk)
    output.close()
    return screen.getvalue(), log.getvalue()


def test_lines_split_across_chunks_are_shown_whole():
    screen, log = split(b"hel", b"lo\nwor", b"ld\n")
    assert screen == b"[w2] hello\n[w2] world\n"
    assert log == b"hello\nworld\n"


def test_a_redrawn_line_is_shown_once_with_its_final_text_and_crlf_is_one_break():
    screen, log = split(b"10%\r50%\r", b"\n100%\r\nnext\r", b"\n")
    assert screen == b"[w2] 50%\n[w2] 100%\n[w2] next\n"
    assert log == b"10%\r50%\r\n100%\r\nnext\r\n"


def test_empty_segments_between_carriage_returns_show_no_empty_lines():
    screen, _ = split(b"\n\r\r", b"bar 1\r\rbar 2\r\r\n\r\rerased\r     \r\n")
    assert screen == b"[w2] \n[w2] bar 2\n"


def test_blank_lines_and_an_unterminated_last_line_survive():
    screen, log = split(b"a\n\nb")
    assert screen == b"[w2] a\n[w2] \n[w2] b\n"
    assert log == b"a\n\nb"


def test_a_huge_line_without_newline_is_shown_in_pieces():
    screen, log = split(b"x" * (MAX_LINE + 10))
    assert screen == b"[w2] " + b"x" * MAX_LINE + b"\n[w2] " + b"x" * 10 + b"\n"
    assert len(log) == MAX_LINE + 10


def test_tail_keeps_the_last_lines_decoded():
    output = WorkerOutput(0, None, None, keep=2)
    output.feed(b"one\ntwo\nthr\xffee\n")
    assert output.tail() == ["two", "thr\ufffdee"]
