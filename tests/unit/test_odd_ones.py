"""The odd ones out (launch/odd_ones.py), from real dumps of real hung jobs (tests/unit/stacks/README.md
says how each was made): the processes whose main thread's stack differs from the rest, named against the
rest; under torchrun per rank; without py-spy by where they wait in the kernel."""

from __future__ import annotations

from pathlib import Path

from podrun.launch.odd_ones import MOST_NAMED, summary

DUMPS = Path(__file__).parent / "stacks"
PY_SPY = {int(path.stem[1:]): path.read_text() for path in (DUMPS / "spy").glob("w*.txt")}
WAITING, ODD = PY_SPY[0], PY_SPY[2]  # worker 0 in all_reduce (as worker 1), worker 2 in load_batch
NO_PYTHON = (DUMPS / "no_python" / "w0.txt").read_text()
PROC_NOTE = ("(from /proc: where each process waits in the kernel, not its Python function: py-spy on the job's "
             "PATH names that)")


def dumps(folder: str) -> dict[int, str]:
    return {int(path.stem[1:]): path.read_text() for path in (DUMPS / folder).glob("w*.txt")}


def test_the_worker_whose_main_thread_is_elsewhere_is_named_against_the_rest():
    # the stdlib's Condition.wait and Queue.get under load_batch are passed over; the "prefetch" thread too
    assert summary(PY_SPY) == ["w2 is in load_batch (hang.py:7); the other 2 are in all_reduce (hang.py:10)"]


def test_pids_thread_ids_and_idle_marks_do_not_part_identical_hangs():
    assert PY_SPY[0] != PY_SPY[1]  # their pids and thread ids
    assert summary({0: PY_SPY[0], 1: PY_SPY[1]}) == ["all 2 workers are in all_reduce (hang.py:10)"]
    active = PY_SPY[1].replace("(idle)", "(active)")
    assert summary({0: PY_SPY[0], 1: active}) == ["all 2 workers are in all_reduce (hang.py:10)"]


def test_one_worker_of_512_stands_out():
    texts = {index: ODD if index == 17 else WAITING for index in range(512)}
    assert summary(texts) == ["w17 is in load_batch (hang.py:7); the other 511 are in all_reduce (hang.py:10)"]


def test_several_places_each_named_then_the_majority():
    texts = {index: ODD if index in (3, 4) else NO_PYTHON if index == 8 else WAITING for index in range(10)}
    assert summary(texts) == ["w3-4 are in load_batch (hang.py:7)",
                              "w8 is without stacks: no Python process of the job on this worker",
                              "the other 7 are in all_reduce (hang.py:10)"]


def test_with_no_majority_every_place_is_named():
    assert summary({0: WAITING, 1: ODD}) == ["w0 is in all_reduce (hang.py:10); w1 is in load_batch (hang.py:7)"]


def test_one_function_reached_from_another_line_is_another_place_and_says_from_where():
    called_elsewhere = WAITING.replace("<module> (hang.py:14)", "<module> (hang.py:15)")
    assert summary({0: WAITING, 1: called_elsewhere, 2: WAITING}) == [
        "w1 is in all_reduce (hang.py:10) from <module> (hang.py:15); "
        "the other 2 are in all_reduce (hang.py:10) from <module> (hang.py:14)"]


def test_past_a_few_places_the_rest_are_counted():
    texts = {index: WAITING.replace("<module> (hang.py:14)", f"<module> (hang.py:{20 + index})")
             for index in range(MOST_NAMED + 2)}
    texts.update({100: WAITING, 101: WAITING, 102: WAITING})
    lines = summary(texts)
    assert len(lines) == MOST_NAMED + 2
    assert lines[MOST_NAMED] == "2 more in 2 other places (in the saved stacks)"
    assert lines[-1] == "the other 3 are in all_reduce (hang.py:10) from <module> (hang.py:14)"


def test_under_torchrun_each_rank_is_compared_not_torchrun_nor_podruns_wrapper():
    texts = dumps("torchrun_gloo")
    assert summary(texts) == ["w1 r3 is in load_batch (train.py:6); "
                              "the other 3 are in all_reduce (torch/distributed/distributed_c10d.py:3252)"]
    assert summary({0: texts[0]}) == ["all 2 ranks (w0 r0-1) are in all_reduce (torch/distributed/distributed_c10d.py:3252)"]


def test_without_py_spy_the_kernel_wait_tells_the_odd_one_and_says_that_is_all_it_tells():
    assert summary(dumps("proc")) == ["w2 is waiting in the kernel at futex_do_wait; "
                                      "the other 2 are waiting in the kernel at hrtimer_nanosleep", PROC_NOTE]


def test_a_worker_that_gave_no_stacks_is_named_with_why():
    texts = {index: WAITING for index in range(4)}
    texts[2] = "no stacks: worker 2 gave none within 60s\n"
    assert summary(texts) == ["w2 is without stacks: worker 2 gave none within 60s; "
                              "the other 3 are in all_reduce (hang.py:10)"]


def running(pid: int, rank: int, kernel_stack: tuple[str, ...] = ()) -> str:
    """A rank busy on a CPU (or runnable) without py-spy, in remote/stacks.py's kernel view; `kernel_stack`: where
    the scheduler last took it off a CPU, as /proc/PID/stack shows it to root."""
    return (f"=== pid {pid} (parent 1, rank {rank}): python3 -u train.py ===\n"
            "py-spy is not on the job's PATH (as its step started): with it (pip install py-spy) this shows the "
            f"Python stack\nstate: R (running), wchan: 0\nthread {pid}: wchan 0\n"
            + "".join(f"  [<0>] {frame}\n" for frame in kernel_stack))


def test_ranks_that_all_run_are_said_to_be_alike_whatever_kernel_stack_one_was_preempted_in():
    preempted = ("irqentry_exit_to_user_mode+0x1d2/0x1e0", "asm_sysvec_apic_timer_interrupt+0x1a/0x20")
    texts = {0: running(100, 0) + running(101, 1, preempted), 1: running(200, 2) + running(201, 3)}
    assert summary(texts) == ["all 4 ranks (w0-1 r0-3) are not waiting in the kernel (state R)", PROC_NOTE]


def test_places_that_read_alike_are_said_as_one_not_as_an_odd_one_out():
    # worker 1 one frame deeper in the same function and line: no frame of its own tells it from the rest
    deeper = WAITING.replace("    all_reduce (hang.py:10)\n", "    all_reduce (hang.py:10)\n" * 2, 1)
    assert deeper != WAITING
    assert summary({0: WAITING, 1: deeper, 2: WAITING}) == ["all 3 workers are in all_reduce (hang.py:10)"]
    assert summary({0: WAITING, 1: deeper, 2: ODD}) == [
        "w2 is in load_batch (hang.py:7); the other 2 are in all_reduce (hang.py:10)"]
