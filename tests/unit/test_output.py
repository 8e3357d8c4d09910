"""Unit tests of the line splitter every live view and `podrun logs` go through."""

from __future__ import annotations

import io
import re

from hypothesis import given
from hypothesis import strategies as st

from podrun.remote.rank_output import split_segments
from podrun.terminal import Terminal
from podrun.worker_output import KEPT_LINE, MAX_HELD, MAX_LINE, WorkerOutput


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


def test_rank_headers_and_crlf_cut_between_chunks_are_read_as_if_whole():
    chunks = b"[ra|nk3]:one\r|\n[rank|12]:two|[rank3]:|three\r|x\r\n[rank123456|78]:four\n".split(b"|")
    screen, log = split(*chunks)
    # rank 12's line is unfinished until the stream ends
    assert screen == b"[w2 r3] one\n[w2 r3] x\n[w2]    [rank12345678]:four\n[w2 r12] two\n"
    assert log == b"".join(chunks)


def test_a_rank_line_without_newline_is_shown_in_pieces_and_goes_on_as_that_ranks():
    screen, _ = split(b"[rank1]:" + b"x" * MAX_LINE, b"y[rank2]:z\n[rank1]:w\n")
    assert screen.split(b"\n") == [b"[w2 r1] " + b"x" * MAX_LINE, b"[w2 r2] z", b"[w2 r1] yw", b""]


def test_a_rank_header_inside_a_line_of_the_worker_own_counts_toward_its_length():
    screen, _ = split(b"x" + b"[rank1]:" * (MAX_LINE // 8))
    assert screen.split(b"\n") == [b"[w2] x" + b"[rank1]:" * (MAX_LINE // 8 - 1) + b"[rank1]",
                                    b"[w2] :", b""]


def test_a_workers_unfinished_lines_hold_max_held_bytes_in_all_and_show_every_byte():
    screen = io.BytesIO()
    output = WorkerOutput(0, Terminal(screen), None)
    rounds = b"".join(b"[rank%d]:" % rank + b"x" * 30_000 + b"\r" * (rank % 2) for rank in range(100))
    for _ in range(3):  # 100 ranks' lines of 90 KB, half of them redrawn: 9 MB unfinished
        output.feed(rounds)
        assert output.held == sum(len(line.text) + len(line.shown) for line in output.lines.values()) <= MAX_HELD
    output.close()
    shown: dict[int, int] = {}
    for rank, text in re.findall(rb"\[w0 r(\d+)\] +(x+)\n", screen.getvalue()):
        shown[int(rank)] = shown.get(int(rank), 0) + len(text)
    # each line, pushed out by newer ones before its rank's next round, shows as it stood: every byte
    assert shown == {rank: 90_000 for rank in range(100)}


def test_tail_keeps_the_end_of_a_long_line():
    output = WorkerOutput(0, None, None)
    output.feed(b"a" * MAX_LINE + b"b" * 10 + b"\n[rank3]:" + b"c" * KEPT_LINE + b"d\n")
    whole, rest, rank = output.tail()
    assert whole == "..." + "a" * KEPT_LINE and rest == "b" * 10
    assert rank == "[rank3]:..." + "c" * (KEPT_LINE - 1) + "d"


def test_tail_keeps_the_last_lines_decoded():
    output = WorkerOutput(0, None, None, keep=2)
    output.feed(b"one\ntwo\nthr\xffee\n")
    assert output.tail() == ["two", "thr\ufffdee"]


@given(st.lists(st.sampled_from([b"a", b"b", b"\r", b"\n"]), max_size=40).map(b"".join))
def test_a_ranks_output_is_cut_into_the_segments_its_line_ends_make(data):
    # each line end ends a segment, but a \r at the very end (half of a \r\n, perhaps); a lone \r is none
    ends = [match.end() for match in re.finditer(rb"\r\n|\n|\r(?!\Z)", data)]
    segments = [data[start:end] for start, end in zip([0, *ends], ends)]
    assert split_segments(data) == ([s for s in segments if s != b"\r"], data[ends[-1] if ends else 0:])


def test_secrets_are_hidden_while_their_job_runs_and_not_after():
    """hidden() is the job's: a process that runs another job after it (the suite's, a supervisor's) must not
    mask the first job's values in what it says (a secret like `fake` read *** in every later message)."""
    from podrun.output import hidden, masked

    with hidden(["s3cr3t", "s3"]):
        assert masked("token s3cr3t and s3") == "token *** and ***"
        with hidden(["inner"]):
            assert masked("s3cr3t inner") == "s3cr3t ***"
        assert masked("s3cr3t inner") == "*** inner"
    assert masked("token s3cr3t") == "token s3cr3t"
